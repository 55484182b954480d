"""The bundle repository: create it, publish and verify bundles, rotate keys, refresh.

A TUF repository (python-tuf metadata API) with consistent snapshots; the layout is in
:mod:`fleet_server.repository._store`. Each published bundle file is one target
``bundles/<name>/<release>/<file>`` with custom fields ``{"bundle", "version", "release",
"profiles", "published"}``. The director's keys are a delegation named "director" in
the top-level targets (``paths=[]``, terminating): it signs directives, never targets.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tuf.api.exceptions import LengthOrHashMismatchError, UnsignedMetadataError
from tuf.api.metadata import (  # type: ignore[attr-defined, unused-ignore]
    DelegatedRole,
    Delegations,
    Key,
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)

from agent.wire.manifest import (
    MANIFEST_NAME,
    load_manifest,
    parse_manifest,
    read_manifest_bytes,
)
from fleet_server.errors import BundleMismatch, ReleaseNotNewer
from fleet_server.repository._files import copy_durable, hash_file, make_dirs
from fleet_server.repository._store import Expiries, MetadataStore, utcnow
from fleet_server.repository.bundledir import BUNDLES_PREFIX, bundle_files, target_path
from fleet_server.repository.keys import KeyStore

log = logging.getLogger(__name__)

DIRECTOR = "director"
ONLINE_ROLES = ("targets", "snapshot", "timestamp")
ROTATABLE = ("root", *ONLINE_ROLES, DIRECTOR)


@dataclass(frozen=True)
class PublishedFile:
    """One signed file of a published bundle."""

    file: str
    target: str
    length: int
    sha256: str


@dataclass(frozen=True)
class PublishedBundle:
    """A bundle release as the repository's targets metadata lists it."""

    name: str
    version: str
    release: int
    profiles: tuple[str, ...]
    published: str | None
    files: tuple[PublishedFile, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``fleetctl bundle list --json``)."""
        return {
            "name": self.name,
            "version": self.version,
            "release": self.release,
            "profiles": list(self.profiles),
            "published": self.published,
            "files": [vars(f) for f in self.files],
        }


def _delegations(keys: list[Key]) -> Delegations:
    role = DelegatedRole(DIRECTOR, [k.keyid for k in keys], 1, terminating=True, paths=[])
    return Delegations(keys={k.keyid: k for k in keys}, roles={DIRECTOR: role})


class Repository(MetadataStore):
    """The fleet's TUF repository in directory ``path`` (see the module docstring)."""

    def __init__(self, path: Path, expiries: Expiries | None = None) -> None:
        super().__init__(path, expiries)

    def init(self, keystore: KeyStore, *, now: datetime | None = None) -> None:
        """Create version 1 of every role from the keystore's keys (root: all its root keys,
        its root threshold).

        Raises:
            RepoError: already initialised, a role without keys, or a write failure.
            KeystoreError: a key can't be read or decrypted.
        """
        now = now or utcnow()
        with self.locked():
            if self._root_versions():
                raise self._fail("already initialised (metadata/1.root.json exists)")
            for role in (*ONLINE_ROLES, "root", DIRECTOR):
                if not keystore.public_keys(role):
                    raise self._fail(f"the keystore {keystore.path} has no {role} key")
            root = Metadata(Root(expires=now + self.expiries.root, consistent_snapshot=True))
            for role in ("root", *ONLINE_ROLES):
                for key in keystore.public_keys(role):
                    root.signed.add_key(key, role)
            root.signed.roles["root"].threshold = keystore.root_threshold
            root_bytes = self._sign_role(root, "root", keystore, root.signed)
            # Root last: until 1.root.json exists the directory is not a repository, and
            # a crashed init can simply be run again.
            targets = Metadata(Targets(expires=now + self.expiries.targets))
            targets.signed.delegations = _delegations(list(keystore.public_keys(DIRECTOR)))
            self._write(
                "1.targets.json", self._sign_role(targets, "targets", keystore, root.signed)
            )
            snapshot = Metadata(Snapshot(expires=now + self.expiries.snapshot))
            snap_bytes = self._sign_role(snapshot, "snapshot", keystore, root.signed)
            self._write("1.snapshot.json", snap_bytes)
            timestamp = Metadata(Timestamp(expires=now + self.expiries.timestamp))
            timestamp.signed.snapshot_meta = MetaFile.from_data(1, snap_bytes, ["sha256"])
            ts_bytes = self._sign_role(timestamp, "timestamp", keystore, root.signed)
            self._write("timestamp.json", ts_bytes)
            make_dirs(self.targets_dir)
            self._write_root(root, root_bytes)

    # -- bundles ----------------------------------------------------------------------

    def bundles(self, name: str | None = None) -> list[PublishedBundle]:
        """Published bundles (of ``name``, or all), sorted by name and release."""
        groups: dict[tuple[str, int], list[TargetFile]] = {}
        for path, target in self.targets().signed.targets.items():
            custom = target.custom
            if not path.startswith(f"{BUNDLES_PREFIX}/") or not isinstance(custom, dict):
                continue
            bundle, release = custom.get("bundle"), custom.get("release")
            if isinstance(bundle, str) and isinstance(release, int) and name in (None, bundle):
                groups.setdefault((bundle, release), []).append(target)
        found = []
        for (bundle, release), targets in sorted(groups.items()):
            custom = targets[0].custom
            prefix = target_path(bundle, release, "")
            files = tuple(
                PublishedFile(t.path.removeprefix(prefix), t.path, t.length, t.hashes["sha256"])
                for t in sorted(targets, key=lambda t: t.path)
            )
            profiles = tuple(str(p) for p in custom.get("profiles", []))
            found.append(
                PublishedBundle(
                    bundle,
                    str(custom.get("version")),
                    release,
                    profiles,
                    custom.get("published"),
                    files,
                )
            )
        return found

    def publish(
        self, bundle_dir: Path, keystore: KeyStore, *, now: datetime | None = None
    ) -> PublishedBundle:
        """Sign and publish the bundle in ``bundle_dir``: one target per file, copied to
        ``targets/`` under its sha256 prefix, then new targets, snapshot and timestamp.

        Raises:
            BundleError: invalid manifest, a model file that does not match it, or a file
                the manifest does not list.
            ReleaseNotNewer: the release is not above every published one of that name.
            RepoError: not initialised, a file changed while copied, a write failure.
            KeystoreError: a key can't be read or decrypted.
        """
        root_dir = Path(bundle_dir)
        raw = read_manifest_bytes(root_dir)
        manifest = parse_manifest(raw, str(root_dir / MANIFEST_NAME))
        files = bundle_files(root_dir, manifest)
        name, release = manifest.name, manifest.release
        now = now or utcnow()
        with self.locked():
            targets = self.targets()
            highest = max((b.release for b in self.bundles(name)), default=None)
            if highest is not None and release <= highest:
                raise ReleaseNotNewer(str(self.path), name, release, highest)
            expected = {v.file: (v.sha256, v.size) for v in manifest.models.values()}
            expected[MANIFEST_NAME] = (hashlib.sha256(raw).hexdigest(), len(raw))
            custom = {
                "bundle": name,
                "version": manifest.version,
                "release": release,
                "profiles": list(manifest.profiles),
                "published": now.isoformat(),
            }
            for rel in files:
                tpath = target_path(name, release, rel)
                digest, size = self._store_target(root_dir, rel, tpath, expected.get(rel))
                log.info("stored %s (%d bytes)", tpath, size)
                fields = {"custom": copy.deepcopy(custom)}
                targets.signed.targets[tpath] = TargetFile(size, {"sha256": digest}, tpath, fields)
            self._commit(keystore, now, targets=targets)
        log.info("published %s release %d: targets v%d", name, release, targets.signed.version)
        return self.bundles(name)[-1]

    def _store_target(
        self, bundle_dir: Path, rel: str, tpath: str, expected: tuple[str, int] | None
    ) -> tuple[str, int]:
        """Copy one file to ``targets/<dir>/<sha256>.<name>``; return its (sha256, size).

        ``expected``: the (sha256, size) the manifest gives a model file, or that of the
        manifest bytes that were parsed.
        """
        src = bundle_dir / rel
        try:
            digest, size = hash_file(src)
        except OSError as exc:
            raise self._fail(f"cannot read {src}: {exc}") from exc
        if expected is not None and expected != (digest, size):
            raise BundleMismatch(
                str(self.path), str(bundle_dir), rel,
                f"sha256 {digest} / {size} bytes, expected {expected[0]} / {expected[1]} "
                "bytes (changed while published, or run fleetctl bundle build)",
            )  # fmt: skip
        try:
            parent, _, base = tpath.rpartition("/")
            dest = self.targets_dir / parent / f"{digest}.{base}"
            make_dirs(dest.parent)
            copied = copy_durable(src, dest)
        except OSError as exc:
            raise self._fail(f"cannot copy {src} into the repository: {exc}") from exc
        if copied != (digest, size):
            dest.unlink(missing_ok=True)
            raise BundleMismatch(str(self.path), str(bundle_dir), rel, "changed while published")
        return digest, size

    def verify(self, bundle_dir: Path) -> PublishedBundle:
        """Check that the bundle in ``bundle_dir`` is exactly what the repository signed:
        its release is published, and every file has the signed length and sha256.

        The repository's own metadata is checked first: targets, snapshot and timestamp
        signed by the keys the newest root names.

        Raises:
            BundleMismatch: a file missing, extra, or different from the signed one; or
                the release is not published.
            BundleError: the manifest is invalid.
            RepoError: the repository's metadata is missing or not validly signed.
        """
        root_dir = Path(bundle_dir)
        self.check_signatures()
        manifest = load_manifest(root_dir)
        published = {(b.name, b.release): b for b in self.bundles(manifest.name)}
        bundle = published.get((manifest.name, manifest.release))
        if bundle is None:
            raise BundleMismatch(
                str(self.path), str(root_dir), "",
                f"bundle '{manifest.name}' release {manifest.release} is not published",
            )  # fmt: skip
        signed = self.targets().signed.targets
        names = {f.file for f in bundle.files}
        on_disk = set(bundle_files(root_dir, manifest))
        unsigned = sorted(on_disk - names)
        if unsigned:
            raise BundleMismatch(
                str(self.path), str(root_dir), unsigned[0], "not in the signed release"
            )
        for f in bundle.files:
            path = root_dir / f.file
            try:
                with path.open("rb") as data:
                    signed[f.target].verify_length_and_hashes(data)
            except FileNotFoundError:
                raise BundleMismatch(str(self.path), str(root_dir), f.file, "missing") from None
            except LengthOrHashMismatchError as exc:
                raise BundleMismatch(
                    str(self.path), str(root_dir), f.file, f"differs from the signed file: {exc}"
                ) from exc
        return bundle

    def check_signatures(self) -> None:
        """Check that targets, snapshot and timestamp are signed as the newest root says,
        and that they name each other's versions.

        Raises:
            RepoError: missing metadata, a bad signature, or versions that disagree.
        """
        root = self.root().signed
        timestamp, snapshot, targets = self.timestamp(), self.snapshot(), self.targets()
        for role, md in (("timestamp", timestamp), ("snapshot", snapshot), ("targets", targets)):
            try:
                root.verify_delegate(role, md.signed_bytes, md.signatures)
            except UnsignedMetadataError as exc:
                raise self._fail(
                    f"{role} v{md.signed.version} is not validly signed: {exc}"
                ) from exc
        try:
            timestamp.signed.snapshot_meta.verify_length_and_hashes(
                (self.metadata_dir / f"{snapshot.signed.version}.snapshot.json").read_bytes()
            )
        except LengthOrHashMismatchError as exc:
            raise self._fail(f"snapshot differs from what the timestamp signed: {exc}") from exc

    # -- keys and expiry -----------------------------------------------------------

    def rotate(self, role: str, keystore: KeyStore, *, now: datetime | None = None) -> list[str]:
        """Replace every key of ``role`` with new ones from the keystore; return their ids.

        root: a new root version listing the new root keys, signed by the threshold of the
        old root keys and of the new ones. targets, snapshot, timestamp: a new root version
        (signed by the root keys) listing the new key, then that role re-signed. director:
        a new targets version delegating to the new key. The old keys are marked retired.

        Raises:
            RepoError: unknown role, not initialised, too few root keys, a write failure.
            KeystoreError: a key can't be generated, read or decrypted.
        """
        if role not in ROTATABLE:
            raise self._fail(f"cannot rotate {role!r} (one of: {', '.join(ROTATABLE)})")
        now = now or utcnow()
        with self.locked():
            if role == DIRECTOR:
                old, new = self._rotate_director(keystore, now)
            else:
                old, new = self._rotate_in_root(role, keystore, now)
            keystore.retire(old)
        return new

    def _rotate_director(self, keystore: KeyStore, now: datetime) -> tuple[list[str], list[str]]:
        targets = self.targets()
        delegations = targets.signed.delegations
        old = list(delegations.keys) if delegations is not None else []
        new = keystore.generate(DIRECTOR)
        targets.signed.delegations = _delegations([k.public for k in new])
        self._commit(keystore, now, targets=targets)
        return old, [k.keyid for k in new]

    def _rotate_in_root(
        self, role: str, keystore: KeyStore, now: datetime
    ) -> tuple[list[str], list[str]]:
        current = self.root()
        old = list(current.signed.roles[role].keyids)
        new = keystore.generate(role, max(1, len(old)))
        root = self._new_root(current, role, old, [k.public for k in new], now)
        keyids = {*current.signed.roles["root"].keyids, *root.signed.roles["root"].keyids}
        data = self._sign(root, "root", keystore.signers(keyids), [current.signed, root.signed])
        self._write_root(root, data)
        if role != "root":
            self._commit(
                keystore, now, targets=self.targets() if role == "targets" else None,
                new_snapshot=role == "snapshot", root=root.signed,
            )  # fmt: skip
        return old, [k.keyid for k in new]

    def _new_root(
        self, current: Metadata[Root], role: str, old: list[str], new: list[Key], now: datetime
    ) -> Metadata[Root]:
        root = Metadata(copy.deepcopy(current.signed))
        root.signed.version += 1
        root.signed.expires = now + self.expiries.root
        for keyid in old:
            root.signed.revoke_key(keyid, role)
        for key in new:
            root.signed.add_key(key, role)
        threshold = root.signed.roles[role].threshold
        root.signed.roles[role].threshold = min(threshold, len(new))
        return root

    def refresh_timestamp(self, keystore: KeyStore, *, now: datetime | None = None) -> int:
        """Sign a new timestamp version (same snapshot, new expiry); return its version.

        Raises:
            RepoError: not initialised, or a write failure.
            KeystoreError: the timestamp key can't be read or decrypted.
        """
        now = now or utcnow()
        with self.locked():
            self._commit(keystore, now, new_snapshot=False)
        return self.timestamp().signed.version

    def refresh(self, keystore: KeyStore, *, now: datetime | None = None) -> list[str]:
        """Re-sign the online roles that expire within half their validity period (the
        timestamp always); return the roles re-signed. Root is offline: never re-signed
        here.

        Raises:
            RepoError: not initialised, or a write failure.
            KeystoreError: a key can't be read or decrypted.
        """
        now = now or utcnow()

        def due(role: str, expires: datetime) -> bool:
            return expires - now < self.expiries.of(role) / 2

        with self.locked():
            targets = self.targets()
            renew_targets = due("targets", targets.signed.expires)
            renew_snapshot = renew_targets or due("snapshot", self.snapshot().signed.expires)
            self._commit(
                keystore, now,
                targets=targets if renew_targets else None, new_snapshot=renew_snapshot,
            )  # fmt: skip
        renewed = ["targets"] if renew_targets else []
        return [*renewed, *(["snapshot"] if renew_snapshot else []), "timestamp"]
