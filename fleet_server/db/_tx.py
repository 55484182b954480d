"""Connections for the data-access functions: one per call, or the caller's own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeAlias

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from fleet_server.db.engine import SQLITE_IMMEDIATE
from fleet_server.db.errors import StorageError

Bind: TypeAlias = Engine | Connection
"""An engine (each call runs in its own transaction) or a connection (the caller's
transaction: the call neither commits nor rolls back)."""


@contextmanager
def writing(bind: Bind) -> Iterator[Connection]:
    """A connection in a write transaction, committed at the end when it is ours."""
    if isinstance(bind, Connection):
        yield bind
        return
    with bind.connect() as conn:
        conn.execution_options(**{SQLITE_IMMEDIATE: True})
        with conn.begin():
            yield conn


@contextmanager
def reading(bind: Bind) -> Iterator[Connection]:
    """A connection to read with."""
    if isinstance(bind, Connection):
        yield bind
        return
    with bind.connect() as conn:
        yield conn


def upsert(conn: Connection, table: sa.Table) -> sqlite.Insert | postgresql.Insert:
    """``INSERT`` with ``ON CONFLICT`` support, in the connection's dialect.

    Raises:
        StorageError: the database is neither SQLite nor PostgreSQL.
    """
    name = conn.dialect.name
    if name == "sqlite":
        return sqlite.insert(table)
    if name == "postgresql":
        return postgresql.insert(table)
    raise StorageError(table.name, f"unsupported database dialect '{name}'")
