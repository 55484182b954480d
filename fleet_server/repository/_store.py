"""Metadata storage for the repository: layout, loading, signing and the commit chain.

Layout (consistent snapshots): ``metadata/<N>.root.json`` for every root version and
``metadata/root.json`` (copy of the newest), ``metadata/<V>.targets.json``,
``metadata/<V>.snapshot.json`` and ``metadata/timestamp.json``; targets under
``targets/`` with the sha256 prefix the ngclient asks for. ``timestamp.json`` is written
last and names the current snapshot, which names the current targets: a change becomes
visible in one rename, and a crash before it leaves the previous state current.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from securesystemslib.signer import Signer  # type: ignore[attr-defined, unused-ignore]
from tuf.api.exceptions import UnsignedMetadataError
from tuf.api.metadata import (  # type: ignore[attr-defined, unused-ignore]
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    T,
    Targets,
    Timestamp,
)
from tuf.api.serialization import DeserializationError
from tuf.api.serialization.json import JSONSerializer

from fleet_server.errors import RepoError
from fleet_server.repository._files import make_dirs, write_durable
from fleet_server.repository.keys import KeyStore

METADATA_DIR = "metadata"
TARGETS_DIR = "targets"
LOCK_NAME = ".lock"
LOCK_TIMEOUT_S = 30.0
_ROOT_FILE = re.compile(r"^([1-9][0-9]{0,9})\.root\.json$")


@dataclass(frozen=True)
class Expiries:
    """How long each role's metadata is valid after it is signed."""

    root: timedelta = timedelta(days=365)
    targets: timedelta = timedelta(days=90)
    snapshot: timedelta = timedelta(days=7)
    timestamp: timedelta = timedelta(days=1)

    def of(self, role: str) -> timedelta:
        """The validity period of ``role`` (the four top-level roles)."""
        period: timedelta = getattr(self, role)
        return period


def utcnow() -> datetime:
    """Now, UTC, whole seconds (TUF expiry dates carry no fractions)."""
    return datetime.now(timezone.utc).replace(microsecond=0)


class MetadataStore:
    """Read, sign and write the repository's metadata files."""

    def __init__(self, path: Path, expiries: Expiries | None = None) -> None:
        self.path = Path(path)
        self.expiries = expiries or Expiries()

    @property
    def metadata_dir(self) -> Path:
        """``<repo>/metadata``."""
        return self.path / METADATA_DIR

    @property
    def targets_dir(self) -> Path:
        """``<repo>/targets``."""
        return self.path / TARGETS_DIR

    def _fail(self, reason: str) -> RepoError:
        return RepoError(str(self.path), reason)

    def initialized(self) -> bool:
        """Whether the repository has a root and a timestamp."""
        return self._root_versions() != [] and (self.metadata_dir / "timestamp.json").is_file()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the repository's write lock (one writer at a time), up to LOCK_TIMEOUT_S."""
        make_dirs(self.path)
        fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise self._fail(
                            f"locked by another writer for over {LOCK_TIMEOUT_S:.0f} s"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    # -- reading -------------------------------------------------------------------

    def _root_versions(self) -> list[int]:
        if not self.metadata_dir.is_dir():
            return []
        found = (_ROOT_FILE.match(p.name) for p in self.metadata_dir.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def _load(self, name: str, kind: type[T]) -> Metadata[T]:
        path = self.metadata_dir / name
        try:
            md = Metadata[T].from_bytes(path.read_bytes())
        except FileNotFoundError:
            raise self._fail(
                f"{METADATA_DIR}/{name} is missing"
                + ("" if self.initialized() else " (create the repository: fleetctl repo init)")
            ) from None
        except (OSError, DeserializationError) as exc:
            raise self._fail(f"{METADATA_DIR}/{name} is unreadable: {exc}") from exc
        if not isinstance(md.signed, kind):
            raise self._fail(f"{METADATA_DIR}/{name} holds {md.signed.type}, not {kind.type}")
        return md

    def root(self) -> Metadata[Root]:
        """The newest root (highest ``<N>.root.json``)."""
        versions = self._root_versions()
        if not versions:
            raise self._fail("no root metadata (create the repository: fleetctl repo init)")
        return self._load(f"{versions[-1]}.root.json", Root)

    def timestamp(self) -> Metadata[Timestamp]:
        """The current timestamp."""
        return self._load("timestamp.json", Timestamp)

    def snapshot(self) -> Metadata[Snapshot]:
        """The snapshot the current timestamp names."""
        version = self.timestamp().signed.snapshot_meta.version
        return self._load(f"{version}.snapshot.json", Snapshot)

    def targets(self) -> Metadata[Targets]:
        """The top-level targets the current snapshot names."""
        meta = self.snapshot().signed.meta.get("targets.json")
        if meta is None:
            raise self._fail("the current snapshot lists no targets.json")
        return self._load(f"{meta.version}.targets.json", Targets)

    # -- signing and writing --------------------------------------------------------

    def _sign(
        self, md: Metadata[T], role: str, signers: list[Signer], delegators: list[Root]
    ) -> bytes:
        """Sign ``md`` with every signer; check each delegator's threshold; return bytes."""
        md.signatures.clear()
        for signer in signers:
            md.sign(signer, append=True)
        for delegator in delegators:
            try:
                delegator.verify_delegate(role, md.signed_bytes, md.signatures)
            except UnsignedMetadataError as exc:
                keys = delegator.roles[role]
                raise self._fail(
                    f"{role} v{md.signed.version}: {len(signers)} usable key(s) in the "
                    f"keystore, root v{delegator.version} needs {keys.threshold} of "
                    f"{len(keys.keyids)} ({exc})"
                ) from exc
        return md.to_bytes(JSONSerializer())

    def _signers(self, keystore: KeyStore, root: Root, role: str) -> list[Signer]:
        return keystore.signers(root.roles[role].keyids)

    def _sign_role(self, md: Metadata[T], role: str, keystore: KeyStore, root: Root) -> bytes:
        """Sign ``md`` with the keystore's keys for ``role`` as ``root`` lists them."""
        return self._sign(md, role, self._signers(keystore, root, role), [root])

    def _write(self, name: str, data: bytes) -> None:
        try:
            make_dirs(self.metadata_dir)
            write_durable(self.metadata_dir / name, data)
        except OSError as exc:
            raise self._fail(f"cannot write {METADATA_DIR}/{name}: {exc}") from exc

    def _write_root(self, md: Metadata[Root], data: bytes) -> None:
        """Write a new root version: ``<N>.root.json`` first, then the ``root.json`` copy."""
        self._write(f"{md.signed.version}.root.json", data)
        self._write("root.json", data)

    def _commit(
        self,
        keystore: KeyStore,
        now: datetime,
        *,
        targets: Metadata[Targets] | None = None,
        new_snapshot: bool = True,
        root: Root | None = None,
    ) -> None:
        """Write ``targets`` (already changed; version and expiry set here) and/or a new
        snapshot, then always a new timestamp, each signed with the keystore's keys."""
        root = root or self.root().signed
        if targets is not None:
            targets.signed.version += 1
            targets.signed.expires = now + self.expiries.targets
            data = self._sign_role(targets, "targets", keystore, root)
            self._write(f"{targets.signed.version}.targets.json", data)
        timestamp = self.timestamp()
        if new_snapshot or targets is not None:
            snapshot = self.snapshot()
            snapshot.signed.version += 1
            snapshot.signed.expires = now + self.expiries.snapshot
            if targets is not None:
                snapshot.signed.meta["targets.json"] = MetaFile(version=targets.signed.version)
            snap_bytes = self._sign_role(snapshot, "snapshot", keystore, root)
            self._write(f"{snapshot.signed.version}.snapshot.json", snap_bytes)
            timestamp.signed.snapshot_meta = MetaFile.from_data(
                snapshot.signed.version, snap_bytes, ["sha256"]
            )
        timestamp.signed.version += 1
        timestamp.signed.expires = now + self.expiries.timestamp
        self._write("timestamp.json", self._sign_role(timestamp, "timestamp", keystore, root))
