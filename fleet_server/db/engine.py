"""Engines for the fleet database: an SQLite file by default, PostgreSQL by URL.

SQLite connections run in WAL mode with a busy timeout and foreign keys on, and the
driver's own transaction handling is replaced by explicit ``BEGIN`` statements so that
DDL is transactional (a migration and its version stamp commit together) and write
transactions can take the write lock up front (``BEGIN IMMEDIATE``, see
:func:`fleet_server.db._tx.writing`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import ConnectionPoolEntry

from agent.kernel.sqlitewal import switch_to_wal
from fleet_server.db.errors import StorageError

SQLITE_IMMEDIATE = "edgefleet_sqlite_immediate"
"""Execution option: on SQLite, begin this connection's transactions with BEGIN IMMEDIATE."""

DEFAULT_BUSY_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 10
DEFAULT_STATEMENT_TIMEOUT_S = 60.0
POOL_TIMEOUT_S = 30.0


def sqlite_url(path: Path | str) -> str:
    """The SQLAlchemy URL of the SQLite database file ``path``."""
    return URL.create("sqlite", database=str(path)).render_as_string()


def make_engine(
    url: str,
    *,
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
    statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S,
) -> Engine:
    """An engine for ``url``: ``sqlite:///PATH`` or ``postgresql+psycopg://...``.

    ``postgresql://`` is taken as ``postgresql+psycopg://``. The SQLite file's directory
    must exist; the file is created on first use.

    Raises:
        StorageError: the URL is malformed, or names another database or driver.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StorageError("database URL", f"can't parse it: {exc}") from exc
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    shown = parsed.render_as_string(hide_password=True)
    if backend == "sqlite" and driver == "pysqlite":
        return _sqlite_engine(parsed, busy_timeout_s)
    if backend == "postgresql" and (driver == "psycopg" or parsed.drivername == "postgresql"):
        return _postgresql_engine(parsed, connect_timeout_s, statement_timeout_s)
    raise StorageError(
        shown, "unsupported database; use sqlite:///PATH or postgresql+psycopg://HOST/DB"
    )


def _sqlite_engine(url: URL, busy_timeout_s: float) -> Engine:
    if url.database in (None, "", ":memory:"):
        raise StorageError(
            url.render_as_string(), "the fleet database needs a file (sqlite:///PATH)"
        )
    engine = sa.create_engine(
        url, connect_args={"timeout": busy_timeout_s}, pool_timeout=POOL_TIMEOUT_S
    )
    busy_ms = int(busy_timeout_s * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: ConnectionPoolEntry) -> None:
        conn: sqlite3.Connection = dbapi_conn
        conn.isolation_level = None  # we emit BEGIN ourselves (see _on_begin)
        mode = switch_to_wal(conn, busy_timeout_s)
        if mode != "wal":
            raise StorageError(str(url.database), f"can't switch to WAL mode (got {mode})")
        conn.execute(f"PRAGMA busy_timeout={busy_ms}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=FULL")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(SQLITE_IMMEDIATE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _postgresql_engine(url: URL, connect_timeout_s: int, statement_timeout_s: float) -> Engine:
    url = url.set(drivername="postgresql+psycopg")
    options = f"-c statement_timeout={int(statement_timeout_s * 1000)}"
    return sa.create_engine(
        url,
        connect_args={"connect_timeout": connect_timeout_s, "options": options},
        pool_pre_ping=True,
        pool_timeout=POOL_TIMEOUT_S,
    )
