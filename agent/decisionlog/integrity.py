"""The open-time check: a database that fails ``PRAGMA integrity_check`` (or is no SQLite
database at all) is renamed to ``<name>.corrupt-<UTC time>`` with its -wal and -shm, so
that a fresh one can be started; the newest few such copies are kept for inspection.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

from agent.durable import fsync_dir
from agent.errors import DecisionLogError

log = logging.getLogger(__name__)

SIDE_FILES = ("-wal", "-shm")
KEEP_CORRUPT = 3


def check(path: Path) -> str | None:
    """What is wrong with the database at ``path``, or None if it is sound (or absent).

    Raises:
        DecisionLogError: the file can't be opened at all (permissions, missing dir).
    """
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(str(path), isolation_level=None)
    except sqlite3.Error as e:
        raise DecisionLogError(f"can't open decision log {path}: {e}") from e
    try:
        rows = [str(r[0]) for r in conn.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.OperationalError as e:
        if _is_corruption(e):
            return str(e)
        raise DecisionLogError(f"can't check decision log {path}: {e}") from e
    except sqlite3.DatabaseError as e:  # "file is not a database", "malformed", ...
        return str(e)
    finally:
        conn.close()
    if rows == ["ok"]:
        return None
    return "; ".join(rows[:5]) + (f" (and {len(rows) - 5} more)" if len(rows) > 5 else "")


def _is_corruption(error: sqlite3.Error) -> bool:
    name = getattr(error, "sqlite_errorname", "")
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


def move_aside(path: Path) -> Path:
    """Rename ``path`` and its -wal/-shm to ``<name>.corrupt-<time>``; returns the new path.

    Raises:
        DecisionLogError: a rename failed.
    """
    stamp = _stamp()
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while any(Path(f"{target}{s}").exists() for s in ("", *SIDE_FILES)):
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    try:
        for suffix in ("", *SIDE_FILES):
            src = Path(f"{path}{suffix}")
            if src.exists():
                os.replace(src, f"{target}{suffix}")
        fsync_dir(path.parent)
    except OSError as e:
        raise DecisionLogError(f"can't move corrupt decision log {path} aside: {e}") from e
    _prune(path)
    return target


def move_stray_side_files(path: Path) -> list[Path]:
    """Move aside a -wal/-shm whose database is gone, so SQLite can't replay it into a
    new file; returns the paths moved."""
    if path.exists():
        return []
    moved = []
    stamp = _stamp()
    for suffix in SIDE_FILES:
        src = Path(f"{path}{suffix}")
        if src.exists():
            dst = path.with_name(f"{path.name}.stray-{stamp}{suffix}")
            os.replace(src, dst)
            moved.append(dst)
    return moved


def _prune(path: Path) -> None:
    """Keep the newest KEEP_CORRUPT moved-aside copies of ``path``, delete older ones."""
    prefix = f"{path.name}.corrupt-"
    bases = sorted(
        {p.name.removesuffix("-wal").removesuffix("-shm") for p in path.parent.glob(f"{prefix}*")}
    )
    for base in bases[:-KEEP_CORRUPT]:
        for suffix in ("", *SIDE_FILES):
            old = path.parent / f"{base}{suffix}"
            if old.exists():
                log.warning("deleting old corrupt decision log copy %s", old)
                old.unlink()


def _stamp() -> str:
    """UTC time to the microsecond, e.g. 20261121T100000.123456Z: names sort by time."""
    now = time.time()
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1e6) % 1_000_000:06d}Z"
