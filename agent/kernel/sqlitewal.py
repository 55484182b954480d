"""Switching an SQLite file to WAL mode when other connections may be doing the same.

One implementation for the agent's decision log and the fleet's SQLite database (stdlib
only). Two connections switching a new (rollback-journal) file at once can deadlock on its
lock; SQLite then answers "database is locked" to one of them at once, without waiting in
its busy handler. That one tries again until the other has switched, within ``timeout_s``.
"""

from __future__ import annotations

import sqlite3
import time

RETRY_S = 0.02


def switch_to_wal(conn: sqlite3.Connection, timeout_s: float) -> str:
    """Run ``PRAGMA journal_mode=WAL`` on ``conn``; the journal mode the file ends in.

    Raises:
        sqlite3.OperationalError: the file stayed locked for ``timeout_s``, or another error.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            row = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(RETRY_S)
            continue
        return "" if row is None else str(row[0]).lower()
