"""Slot directories: ``<state_dir>/bundles/<name>/slot-a`` and ``slot-b``.

Staging copies a verified bundle's files into the inactive slot, each through a synced
temp file, model files first and the manifest last (a slot without its manifest never
loads). Any write error removes what was written, so a failed stage leaves an empty slot.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from agent.installer.errors import InstallError
from agent.installer.machine import BundleId, Step
from agent.kernel.bundle import Bundle, load_bundle
from agent.kernel.durable import fsync_dir
from agent.kernel.errors import BundleError
from agent.wire.manifest import MANIFEST_NAME

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
Progress = Callable[[str, int], None]
"""Called as ``progress(relative_file, bytes_written_so_far)`` after every chunk."""


def slot_dir(name_dir: Path, slot: str) -> Path:
    return name_dir / f"slot-{slot}"


def bundle_id(bundle: Bundle) -> BundleId:
    m = bundle.manifest
    return BundleId(m.name, m.version, m.release, bundle.digest)


def inspect(path: Path) -> Bundle | None:
    """The bundle in slot ``path``; ``None`` when the slot is empty or does not load
    (the reason is logged)."""
    if not is_present(path):
        return None
    try:
        return load_bundle(path)
    except BundleError as exc:
        log.warning("%s does not hold a loadable bundle: %s", path, exc.reason)
        return None


def is_present(path: Path) -> bool:
    """Whether the slot directory exists and holds anything."""
    try:
        return any(path.iterdir())
    except FileNotFoundError:
        return False


def wipe(path: Path) -> None:
    """Empty the slot directory (it stays), durably.

    Raises:
        OSError: something in it could not be removed.
    """
    if not path.exists():
        return
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    fsync_dir(path)


def _files(bundle: Bundle) -> list[str]:
    """The files a slot needs, model files first and the manifest last."""
    models = sorted({v.file for v in bundle.manifest.models.values()})
    return [*models, MANIFEST_NAME]


def _copy(src: Path, dst: Path, rel: str, progress: Progress | None) -> str:
    """Copy through a synced temp file beside ``dst``; return the copy's sha256.

    The temp file is removed if anything fails (or the process is stopped by a signal
    Python sees); a temp file left by a power cut is removed by recovery's wipe.
    """
    h = hashlib.sha256()
    written = 0
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as out, src.open("rb") as f:
            while chunk := f.read(CHUNK):
                out.write(chunk)
                out.flush()
                h.update(chunk)
                written += len(chunk)
                if progress is not None:
                    progress(rel, written)
            os.fsync(out.fileno())
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return h.hexdigest()


def stage(source: Bundle, dest: Path, *, progress: Progress | None = None) -> Bundle:
    """Put ``source``'s files into the slot ``dest`` and load them from there.

    Idempotent: a slot that already holds the same bundle (same digest) is kept as it
    is. Otherwise the slot is emptied first.

    Raises:
        InstallError: step "stage" — a write failed (disk full, file too large, I/O
            error; the slot is emptied again), or the copy does not match the source.
    """
    name = source.manifest.name
    existing = inspect(dest)
    if existing is not None and existing.digest == source.digest:
        log.info("%s already holds %s (digest %s)", dest, name, source.digest[:12])
        return existing
    done: list[str] = []
    try:
        return _stage(source, dest, progress, done)
    except (OSError, BundleError, InstallError) as exc:
        _clean_after_failure(dest)
        if isinstance(exc, InstallError):
            raise
        if isinstance(exc, BundleError):
            raise InstallError(Step.STAGE.value, f"staged copy: {exc.reason}", name) from exc
        what = f"cannot write {done[-1]}" if done else f"cannot prepare {dest}"
        raise InstallError(
            Step.STAGE.value, f"{what}: {exc.strerror or exc} (errno {exc.errno})", name
        ) from exc


def _stage(source: Bundle, dest: Path, progress: Progress | None, done: list[str]) -> Bundle:
    """Copy every file (``done`` gets each name as its copy starts) and load the copy."""
    name = source.manifest.name
    dest.mkdir(parents=True, exist_ok=True)
    fsync_dir(dest.parent)
    wipe(dest)
    expected = {v.file: v.sha256 for v in source.manifest.models.values()}
    for rel in _files(source):
        done.append(rel)
        target = dest / rel
        if target.parent != dest:
            target.parent.mkdir(parents=True, exist_ok=True)
        digest = _copy(source.path / rel, target, rel, progress)
        if rel in expected and digest != expected[rel]:
            raise InstallError(
                Step.STAGE.value, f"{rel} changed while it was copied (sha256 {digest})", name
            )
        fsync_dir(target.parent)
    staged = load_bundle(dest)
    if staged.digest != source.digest:
        raise InstallError(Step.STAGE.value, "the staged copy differs from the source", name)
    return staged


def _clean_after_failure(dest: Path) -> None:
    try:
        wipe(dest)
    except OSError as exc:
        log.error("could not remove the partial files in %s: %s", dest, exc)  # noqa: TRY400
