"""The open-time checks: a database that fails ``PRAGMA integrity_check`` (or is no SQLite
database at all) is renamed to ``<name>.corrupt-<UTC time>`` with its -wal and -shm, so
that a fresh one can be started; the newest few such copies are kept for inspection.

A path that is not ours is moved aside the same way, with a suffix naming why:
``<name>.not-a-file-<time>`` for something that is not a regular file (a directory, a
FIFO, a device, a symlink to ``/dev/zero`` or to nothing), ``<name>.foreign-<time>`` for a
sound SQLite database of another schema (another application's, no ``decisions`` table,
or a column of it dropped). A log with every column and some extra ones is ours and kept;
so is a log from before a migration that added columns (the migration adds them).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
from pathlib import Path

from agent.decisionlog import schema
from agent.errors import DecisionLogError
from agent.kernel.durable import fsync_dir

log = logging.getLogger(__name__)

SIDE_FILES = ("-wal", "-shm")
_MIGRATION_COLUMNS = ("migration_set", "name", "applied_at")
KEEP_CORRUPT = 3
CORRUPT = "corrupt"
FOREIGN = "foreign"
NOT_A_FILE = "not-a-file"
"""Why a log was moved aside: the suffix of its new name."""

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def not_a_file(path: Path) -> str | None:
    """Why ``path`` is not a regular file SQLite may open, or None (a regular file, a
    symlink to one, or nothing there).
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(path)
        try:
            info = os.stat(path)
        except OSError as e:
            return f"a symlink to {target} that leads nowhere ({e.strerror or e})"
        if stat.S_ISREG(info.st_mode):
            return None
        return f"a symlink to {target}, {_kind(info.st_mode)}, not a regular file"
    if stat.S_ISREG(info.st_mode):
        return None
    return f"{_kind(info.st_mode)}, not a regular file"


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a file")


def foreign(path: Path) -> str | None:
    """Why the (sound) SQLite database at ``path`` is not a decision log, or None.

    Empty (no tables yet) is ours: the migrations create the tables. A ``decisions``
    table holding every column its recorded migrations made is ours, extra columns and
    all: one from before migration 0004 lacks the station columns, which that migration
    adds when the log opens.

    Raises:
        DecisionLogError: the file can't be read.
    """
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise DecisionLogError(f"can't open decision log {path}: {e}") from e
    try:
        tables = {
            str(name)
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if not tables - {"sqlite_sequence", "sqlite_stat1"}:
            return None
        if schema.TABLE not in tables:
            shown = ", ".join(sorted(tables)[:5]) + (" ..." if len(tables) > 5 else "")
            return f"no {schema.TABLE} table (tables: {shown})"
        return _missing(conn, schema.MIGRATIONS_TABLE, _MIGRATION_COLUMNS, tables) or _missing(
            conn, schema.TABLE, _expected_columns(conn, tables)
        )
    except sqlite3.Error as e:
        return f"its schema can't be read: {e}"
    finally:
        conn.close()


def _expected_columns(conn: sqlite3.Connection, tables: set[str]) -> tuple[str, ...]:
    """The ``decisions`` columns a log has after the migrations it records."""
    if schema.MIGRATIONS_TABLE not in tables:
        return schema.BASE_COLUMNS
    row = conn.execute(
        f"SELECT 1 FROM {schema.MIGRATIONS_TABLE} WHERE migration_set = ? AND name = ?",  # noqa: S608 - fixed name
        (schema.MIGRATIONS.name, schema.STATION_MIGRATION),
    ).fetchone()
    return schema.COLUMNS if row is not None else schema.BASE_COLUMNS


def _missing(
    conn: sqlite3.Connection,
    table: str,
    columns: tuple[str, ...],
    tables: set[str] | None = None,
) -> str | None:
    """Why ``table`` lacks one of ``columns`` (None when it has them, or is absent from
    ``tables`` when those are given)."""
    if tables is not None and table not in tables:
        return None
    have = {str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")}
    lacking = [c for c in columns if c not in have]
    if lacking:
        return f"table {table} lacks column(s) {', '.join(lacking)}"
    return None


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


def move_aside(path: Path, why: str = CORRUPT) -> Path:
    """Rename ``path`` and its -wal/-shm to ``<name>.<why>-<time>`` (``why``: one of
    CORRUPT, FOREIGN, NOT_A_FILE); returns the new path. A symlink is moved, never what
    it points to.

    Raises:
        DecisionLogError: a rename failed.
    """
    stamp = _stamp()
    target = path.with_name(f"{path.name}.{why}-{stamp}")
    n = 1
    while any(_present(Path(f"{target}{s}")) for s in ("", *SIDE_FILES)):
        target = path.with_name(f"{path.name}.{why}-{stamp}-{n}")
        n += 1
    try:
        for suffix in ("", *SIDE_FILES):
            src = Path(f"{path}{suffix}")
            if _present(src):
                os.replace(src, f"{target}{suffix}")
        fsync_dir(path.parent)
    except OSError as e:
        raise DecisionLogError(f"can't move {why} decision log {path} aside: {e}") from e
    _prune(path, why)
    return target


def _present(path: Path) -> bool:
    """Whether anything (a dangling symlink too) is at ``path``."""
    return path.exists() or path.is_symlink()


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


def _prune(path: Path, why: str = CORRUPT) -> None:
    """Keep the newest KEEP_CORRUPT copies of ``path`` moved aside for ``why``, delete
    older ones (files only: a directory moved aside is never deleted)."""
    prefix = f"{path.name}.{why}-"
    bases = sorted(
        {p.name.removesuffix("-wal").removesuffix("-shm") for p in path.parent.glob(f"{prefix}*")}
    )
    for base in bases[:-KEEP_CORRUPT]:
        for suffix in ("", *SIDE_FILES):
            old = path.parent / f"{base}{suffix}"
            if old.is_symlink() or old.is_file():
                log.warning("deleting old corrupt decision log copy %s", old)
                old.unlink()


def _stamp() -> str:
    """UTC time to the microsecond, e.g. 20261121T100000.123456Z: names sort by time."""
    now = time.time()
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1e6) % 1_000_000:06d}Z"
