"""The fleet's durable writes: :mod:`agent.kernel.durable` with 0644 files by default (what
the repository, CA and broker publish is public; their private keys pass 0600)."""

from __future__ import annotations

from pathlib import Path

from agent.kernel import durable
from agent.kernel.durable import fsync_dir, hash_file, make_dirs

__all__ = ["copy_durable", "fsync_dir", "hash_file", "make_dirs", "write_durable"]

PUBLIC = 0o644


def write_durable(path: Path, data: bytes, mode: int = PUBLIC) -> None:
    """:func:`agent.kernel.durable.write_durable`, 0644 unless told otherwise."""
    durable.write_durable(path, data, mode)


def copy_durable(src: Path, dst: Path, mode: int = PUBLIC) -> tuple[str, int]:
    """:func:`agent.kernel.durable.copy_durable`, 0644 unless told otherwise."""
    return durable.copy_durable(src, dst, mode)
