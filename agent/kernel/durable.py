"""Durable file writes: temp file in the same directory, fsync, ``os.replace``, fsync dir.

One implementation for the agent and the fleet side (stdlib only). ``mode`` None keeps
the temp file's 0600, which is what keys and device state want; the fleet's published
files pass 0644 (:mod:`fleet_server.repository._files`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

_CHUNK = 1 << 20


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new entry in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path, mode: int = 0o755) -> None:
    """Create ``directory`` and missing parents, each new entry made durable."""
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        path.mkdir(mode=mode, exist_ok=True)
        fsync_dir(path.parent)


def write_durable(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` (permission bits ``mode``, default 0600), replacing it
    atomically and durably."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def copy_durable(src: Path, dst: Path, mode: int | None = None) -> tuple[str, int]:
    """Copy ``src`` to ``dst`` atomically and durably (permission bits ``mode``, default
    0600); return the copy's (sha256, size)."""
    h = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as out, src.open("rb") as f:
            if mode is not None:
                os.fchmod(out.fileno(), mode)
            while chunk := f.read(_CHUNK):
                out.write(chunk)
                h.update(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(dst.parent)
    return h.hexdigest(), size


def hash_file(path: Path) -> tuple[str, int]:
    """(sha256 hex, size) of a file, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size
