"""Opening the decision log's SQLite file: the writer's connection and read-only ones."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from agent.errors import DecisionLogError
from agent.kernel.sqlitewal import switch_to_wal

WAL_LIMIT_BYTES = 8 * 1024 * 1024  # the WAL is truncated to this after a checkpoint
BUSY_TIMEOUT_S = 5.0


def connect_writer(path: Path) -> sqlite3.Connection:
    """The one writing connection: WAL, synchronous=NORMAL, incremental auto-vacuum.

    Autocommit mode (``isolation_level=None``): the writer opens its transactions itself.
    Usable from another thread than the one that opened it, one thread at a time.

    Raises:
        DecisionLogError: the file can't be opened or won't go into WAL mode.
    """
    try:
        conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S
        )
    except sqlite3.Error as e:
        raise DecisionLogError(f"can't open decision log {path}: {e}") from e
    try:
        if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
            # Only a new file can take it; it lets retention give pages back to the disk.
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        mode = switch_to_wal(conn, BUSY_TIMEOUT_S)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
    except sqlite3.Error as e:
        conn.close()
        raise DecisionLogError(f"can't set up decision log {path}: {e}") from e
    if mode != "wal":
        conn.close()
        raise DecisionLogError(f"decision log {path} can't use WAL mode (got {mode!r})")
    return conn


def connect_reader(path: Path) -> sqlite3.Connection:
    """A read-only connection (URI ``mode=ro``) that works while the agent writes.

    Raises:
        DecisionLogError: there is no database at ``path`` or it can't be read.
    """
    if not path.is_file():
        raise DecisionLogError(f"no decision log at {path}")
    uri = path.resolve().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
        conn.execute("PRAGMA query_only=1")
    except sqlite3.Error as e:
        raise DecisionLogError(f"can't read decision log {path}: {e}") from e
    return conn


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT on an autocommit connection; ROLLBACK if anything fails."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
