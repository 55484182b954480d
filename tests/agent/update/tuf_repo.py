"""A real, signed TUF repository on disk for the update-client tests (like python-tuf's
RepositorySimulator, but files), in the layout of the issue-4 design:

    <repo>/metadata/<N>.root.json, root.json, timestamp.json,
    <repo>/metadata/<V>.snapshot.json, <V>.targets.json      (consistent_snapshot)
    <repo>/targets/bundles/<name>/<release>/<sha256>.<file>

The top-level targets delegate to a role "director" (paths=[], terminating) whose keys
sign directives. Keys are ed25519, generated at test time. Every attribute is open so a
test can tamper with any field or byte after (or before) signing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from securesystemslib.signer import CryptoSigner, Signer
from tuf.api.metadata import (
    DelegatedRole,
    Delegations,
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.ngclient.fetcher import FetcherInterface

from agent.update import BundleClient, LocalDirFetcher, TimeFloor
from agent.update.timefloor import FLOOR_FILE
from agent.wire.manifest import manifest_bytes, validate_manifest

TOP = ("root", "timestamp", "snapshot", "targets")
DIRECTOR = "director"


def utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


class FakeClock:
    """A clock a test sets (the system clock can't be stepped in a test)."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or utc_now()

    def __call__(self) -> datetime:
        return self.now


def new_key() -> Signer:
    return CryptoSigner.generate_ed25519()


def manifest_for(
    name: str,
    release: int,
    models: dict[str, tuple[str, bytes]],
    *,
    version: str = "1.0.0",
    profiles: list[str] | None = None,
) -> bytes:
    """A valid manifest.json (a 'score' model on a [1, 4] tensor) listing ``models``:
    format -> (file, bytes)."""
    raw = {
        "schema_version": 1,
        "name": name,
        "version": version,
        "release": release,
        "models": {
            fmt: {"file": file, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for fmt, (file, data) in models.items()
        },
        "input": {"name": "x", "shape": [1, 4], "dtype": "float32"},
        "outputs": [{"name": "y", "shape": [1, 4], "dtype": "float32"}],
        "postprocess": {"kind": "score", "output": "y", "index": 0},
        "profiles": profiles or [],
        "latency_budget_ms": 50.0,
    }
    return manifest_bytes(validate_manifest(raw, "test manifest"))


@dataclass
class Published:
    """What :meth:`TufRepo.publish_bundle` put into the repository."""

    name: str
    release: int
    files: dict[str, bytes]

    @property
    def manifest_path(self) -> str:
        return f"bundles/{self.name}/{self.release}/manifest.json"


class TufRepo:
    """A signed repository in ``directory``; ``commit()`` writes a consistent snapshot."""

    def __init__(
        self,
        directory: Path,
        *,
        expires_in: timedelta = timedelta(days=7),
        root_keys: int = 1,
        root_threshold: int = 1,
        director_keys: int = 1,
        director_threshold: int = 1,
    ) -> None:
        self.dir = Path(directory)
        self.metadata_dir = self.dir / "metadata"
        self.targets_dir = self.dir / "targets"
        self.metadata_dir.mkdir(parents=True, exist_ok=True)
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        self.expires_in = expires_in
        expires = utc_now() + expires_in
        self.signers: dict[str, list[Signer]] = {}
        root = Root(expires=expires, consistent_snapshot=True)
        for role in TOP:
            count = root_keys if role == "root" else 1
            self.signers[role] = [new_key() for _ in range(count)]
            for signer in self.signers[role]:
                root.add_key(signer.public_key, role)
        root.roles["root"].threshold = root_threshold
        self.signers[DIRECTOR] = [new_key() for _ in range(director_keys)]
        director = DelegatedRole(DIRECTOR, [], director_threshold, terminating=True, paths=[])
        targets = Targets(
            expires=expires, delegations=Delegations(keys={}, roles={DIRECTOR: director})
        )
        for signer in self.signers[DIRECTOR]:
            targets.add_key(signer.public_key, DIRECTOR)
        self.root: Metadata[Root] = Metadata(root)
        self.targets: Metadata[Targets] = Metadata(targets)
        self.snapshot: Metadata[Snapshot] = Metadata(Snapshot(expires=expires))
        self.timestamp: Metadata[Timestamp] = Metadata(Timestamp(expires=expires))
        self.write_root()
        self.commit(bump=False)

    # -- signing and writing -------------------------------------------------------

    def sign(self, md: Metadata[Any], signers: list[Signer]) -> None:
        md.signatures.clear()
        for signer in signers:
            md.sign(signer, append=True)

    def write_root(self, signers: list[Signer] | None = None) -> bytes:
        self.sign(self.root, signers if signers is not None else self.signers["root"])
        data = self.root.to_bytes()
        (self.metadata_dir / f"{self.root.signed.version}.root.json").write_bytes(data)
        (self.metadata_dir / "root.json").write_bytes(data)
        return data

    def commit(self, *, bump: bool = True, expires: dict[str, datetime] | None = None) -> None:
        """Bump, sign and write targets, snapshot and timestamp (in that order)."""
        expires = expires or {}
        default = utc_now() + self.expires_in
        if bump:
            self.targets.signed.version += 1
            self.snapshot.signed.version += 1
        self.targets.signed.expires = expires.get("targets", default)
        self.snapshot.signed.expires = expires.get("snapshot", default)
        self.sign(self.targets, self.signers["targets"])
        tv = self.targets.signed.version
        (self.metadata_dir / f"{tv}.targets.json").write_bytes(self.targets.to_bytes())
        self.snapshot.signed.meta = {"targets.json": MetaFile(tv)}
        self.sign(self.snapshot, self.signers["snapshot"])
        sv = self.snapshot.signed.version
        (self.metadata_dir / f"{sv}.snapshot.json").write_bytes(self.snapshot.to_bytes())
        self.write_timestamp(expires=expires.get("timestamp", default), bump=bump)

    def write_timestamp(self, *, expires: datetime | None = None, bump: bool = True) -> None:
        """Re-sign (a new version of) timestamp.json only."""
        if bump:
            self.timestamp.signed.version += 1
        self.timestamp.signed.expires = expires or utc_now() + self.expires_in
        self.timestamp.signed.snapshot_meta = MetaFile(self.snapshot.signed.version)
        self.sign(self.timestamp, self.signers["timestamp"])
        (self.metadata_dir / "timestamp.json").write_bytes(self.timestamp.to_bytes())

    def rotate_root(
        self, role: str, new_signers: list[Signer], *, threshold: int = 1
    ) -> list[Signer]:
        """Replace ``role``'s keys in a new root version (not yet written); returns the
        old root signers (to sign the transition with)."""
        old = list(self.signers["root"])
        root = self.root.signed
        for signer in self.signers[role]:
            root.revoke_key(signer.public_key.keyid, role)
        for signer in new_signers:
            root.add_key(signer.public_key, role)
        root.roles[role].threshold = threshold
        root.version += 1
        self.signers[role] = list(new_signers)
        return old

    # -- content ---------------------------------------------------------------------

    def add_target(
        self, path: str, data: bytes, custom: dict[str, Any] | None = None
    ) -> TargetFile:
        """Sign ``data`` as target ``path`` (at the next commit) and store its bytes."""
        target = TargetFile.from_data(path, data, ["sha256"])
        if custom is not None:
            target.unrecognized_fields["custom"] = custom
        self.targets.signed.targets[path] = target
        self.write_target_bytes(target, data)
        return target

    def target_file(self, target: TargetFile) -> Path:
        directory, _, base = target.path.rpartition("/")
        return self.targets_dir / directory / f"{target.hashes['sha256']}.{base}"

    def write_target_bytes(self, target: TargetFile, data: bytes) -> Path:
        path = self.target_file(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def publish_bundle(
        self,
        name: str,
        release: int,
        *,
        model: bytes = b"model bytes",
        model_file: str = "model.onnx",
        version: str = "1.0.0",
        profiles: list[str] | None = None,
        commit: bool = True,
    ) -> Published:
        """Publish a bundle: one target per file, with the agreed custom fields."""
        manifest = manifest_for(
            name, release, {"onnx": (model_file, model)}, version=version, profiles=profiles
        )
        files = {"manifest.json": manifest, model_file: model}
        custom = {"bundle": name, "version": version, "release": release}
        custom["profiles"] = profiles or []
        for file, data in files.items():
            self.add_target(f"bundles/{name}/{release}/{file}", data, dict(custom))
        if commit:
            self.commit()
        return Published(name, release, files)

    def directive(
        self,
        published: Published | str,
        *,
        counter: int,
        device_id: str = "cam-01",
        hardware_class: str = "x86-gateway",
        expires: datetime | None = None,
        signers: list[Signer] | None = None,
        target: TargetFile | None = None,
        mode: Any = None,
    ) -> bytes:
        """A directive signed by the director key(s) (or ``signers``); ``mode`` (any
        JSON value) goes into custom.mode when given."""
        path = published if isinstance(published, str) else published.manifest_path
        source = target or self.targets.signed.targets[path]
        custom: dict[str, Any] = {"device_id": device_id, "hardware_class": hardware_class}
        if mode is not None:
            custom["mode"] = mode
        signed = Targets(
            version=counter,
            expires=expires or utc_now() + timedelta(days=1),
            targets={path: TargetFile(source.length, dict(source.hashes), path)},
            unrecognized_fields={"custom": custom},
        )
        md = Metadata(signed)
        self.sign(md, signers if signers is not None else self.signers[DIRECTOR])
        return md.to_bytes()

    # -- tampering helpers -------------------------------------------------------------

    def edit_json(self, name: str, edit: Any) -> None:
        """Apply ``edit(dict)`` to the JSON of metadata/<name> and write it back as is."""
        path = self.metadata_dir / name
        data = json.loads(path.read_bytes())
        edit(data)
        path.write_bytes(json.dumps(data).encode())

    def provision(self, trust_dir: Path, root_version: int = 1) -> Path:
        """Give a device its trusted root (as at enrollment)."""
        trust_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.metadata_dir / f"{root_version}.root.json", trust_dir / "root.json")
        return trust_dir


# -- the device side ------------------------------------------------------------------


@dataclass
class Device:
    """A device's update client on a trust dir provisioned from a repository."""

    trust_dir: Path
    clock: FakeClock
    floor: TimeFloor
    fetcher: FetcherInterface
    client: BundleClient

    def restart(self) -> Device:
        """The same device after a restart: a new client on the same files."""
        client = BundleClient(
            self.trust_dir,
            self.fetcher,
            device_id=self.client.device_id,
            hardware_class=self.client.hardware_class,
            time_floor=TimeFloor(self.floor.path, clock=self.clock),
        )
        return Device(self.trust_dir, self.clock, client.time_floor, self.fetcher, client)


def make_device(
    directory: Path,
    repo: TufRepo,
    *,
    fetcher: FetcherInterface | None = None,
    device_id: str = "cam-01",
    hardware_class: str = "x86-gateway",
    clock: FakeClock | None = None,
    provision: bool = True,
) -> Device:
    """A device whose trust dir is ``directory/trust`` (root v1 of ``repo``), reading the
    repository through ``fetcher`` (default: the repository directory itself)."""
    trust_dir = directory / "trust"
    if provision:
        repo.provision(trust_dir)
    else:
        trust_dir.mkdir(parents=True, exist_ok=True)
    clock = clock or FakeClock()
    floor = TimeFloor(trust_dir / FLOOR_FILE, clock=clock)
    fetcher = fetcher or LocalDirFetcher(repo.dir)
    client = BundleClient(
        trust_dir,
        fetcher,
        device_id=device_id,
        hardware_class=hardware_class,
        time_floor=floor,
    )
    return Device(trust_dir, clock, floor, fetcher, client)


def tree_state(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (links as their target), to compare before/after."""
    state: dict[str, bytes] = {}
    if not directory.exists():
        return state
    for path in sorted(directory.rglob("*")):
        rel = str(path.relative_to(directory))
        if path.is_symlink():
            state[rel] = b"-> " + str(path.readlink()).encode()
        elif path.is_file():
            state[rel] = path.read_bytes()
    return state
