"""What the bundles page shows of each published release: version, size, latency budget,
models, profiles, and whether its signatures hold.

"Signatures hold" means two checks: the repository's targets, snapshot and timestamp
metadata are validly signed by the keys the newest root names
(:meth:`Repository.check_signatures`), and every stored file of the release has the
length and SHA-256 the signed targets metadata gives it. Published files are stored
under their hash and never change, so each file is hashed once per (size, mtime) and the
answer kept (:class:`Catalog` holds that cache, and one of parsed manifests).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from agent.kernel.errors import BundleError
from agent.wire.manifest import MANIFEST_NAME, BundleManifest, parse_manifest
from fleet_server.errors import FleetError
from fleet_server.repository import Repository
from fleet_server.repository.repo import PublishedBundle, PublishedFile

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
MAX_CACHED = 4096


@dataclass(frozen=True)
class RepoState:
    """The repository's metadata: signed as the root says, and until when."""

    ok: bool
    text: str
    targets_version: int | None = None
    expires: datetime | None = None


@dataclass(frozen=True)
class Release:
    """What a device row's (bundle, release) stands for."""

    version: str
    budget_ms: float | None


@dataclass(frozen=True)
class BundleInfo:
    """One published release as the bundles page shows it."""

    bundle: PublishedBundle
    size: int
    manifest: BundleManifest | None
    files_ok: bool
    problem: str

    @property
    def budget_ms(self) -> float | None:
        """The manifest's latency budget (None when the manifest can't be read)."""
        return self.manifest.latency_budget_ms if self.manifest is not None else None

    @property
    def models(self) -> list[str]:
        """Model names and formats in the manifest."""
        if self.manifest is None:
            return []
        return [
            f"{k} ({Path(v.file).suffix.lstrip('.') or 'file'})"
            for k, v in self.manifest.models.items()
        ]


class Catalog:
    """Published bundles with their manifests and file checks, over ``repo``."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self._lock = threading.Lock()
        self._files: dict[tuple[str, int, int], bool] = {}
        self._manifests: dict[str, BundleManifest] = {}

    def _stored(self, f: PublishedFile) -> Path:
        parent, _, base = f.target.rpartition("/")
        return self.repo.targets_dir / parent / f"{f.sha256}.{base}"

    def _file_ok(self, f: PublishedFile) -> tuple[bool, str]:
        path = self._stored(f)
        try:
            st = path.stat()
        except OSError:
            return False, f"{f.file}: missing from the repository"
        if st.st_size != f.length:
            return False, f"{f.file}: {st.st_size} bytes, signed {f.length}"
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            known = self._files.get(key)
        if known is None:
            digest = hashlib.sha256()
            try:
                with path.open("rb") as data:
                    while chunk := data.read(_CHUNK):
                        digest.update(chunk)
            except OSError as exc:
                return False, f"{f.file}: unreadable ({exc})"
            known = digest.hexdigest() == f.sha256
            with self._lock:
                if len(self._files) >= MAX_CACHED:
                    self._files.clear()
                self._files[key] = known
        return known, "" if known else f"{f.file}: SHA-256 differs from the signed one"

    def manifest(self, bundle: PublishedBundle) -> BundleManifest | None:
        """The release's parsed manifest (None, logged, when it can't be read)."""
        entry = next((f for f in bundle.files if f.file == MANIFEST_NAME), None)
        if entry is None:
            return None
        with self._lock:
            held = self._manifests.get(entry.sha256)
        if held is not None:
            return held
        path = self._stored(entry)
        try:
            manifest = parse_manifest(path.read_bytes(), str(path))
        except (OSError, BundleError) as exc:
            log.warning("bundle %s release %d: %s", bundle.name, bundle.release, exc)
            return None
        with self._lock:
            if len(self._manifests) >= MAX_CACHED:
                self._manifests.clear()
            self._manifests[entry.sha256] = manifest
        return manifest

    def state(self) -> RepoState:
        """Whether the repository's metadata is validly signed, and its targets expiry."""
        if not self.repo.initialized():
            return RepoState(False, f"no repository in {self.repo.path}")
        try:
            self.repo.check_signatures()
            targets = self.repo.targets().signed
        except FleetError as exc:
            return RepoState(False, str(exc))
        expires = targets.expires
        if expires <= datetime.now(timezone.utc):
            return RepoState(False, "targets metadata expired", targets.version, expires)
        return RepoState(True, "validly signed", targets.version, expires)

    def bundles(self) -> list[BundleInfo]:
        """Every published release, newest release of each name first.

        Raises:
            RepoError: the repository's metadata can't be read.
        """
        if not self.repo.initialized():
            return []
        out = []
        for b in sorted(self.repo.bundles(), key=lambda b: (b.name, -b.release)):
            problems = [p for ok, p in (self._file_ok(f) for f in b.files) if not ok]
            out.append(
                BundleInfo(
                    bundle=b,
                    size=sum(f.length for f in b.files),
                    manifest=self.manifest(b),
                    files_ok=not problems,
                    problem="; ".join(problems[:3]),
                )
            )
        return out

    def releases(self) -> dict[tuple[str, int], Release]:
        """Version and latency budget of every published release, by (name, release)."""
        if not self.repo.initialized():
            return {}
        out = {}
        for b in self.repo.bundles():
            manifest = self.manifest(b)
            budget = manifest.latency_budget_ms if manifest is not None else None
            out[(b.name, b.release)] = Release(b.version, budget)
        return out
