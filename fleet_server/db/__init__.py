"""The fleet server's storage: SQLAlchemy Core tables, Alembic migrations, data access.

An SQLite file by default, PostgreSQL by URL (docs/fleet-storage.md). Open a database
with :func:`open_database` (engine + migrations); the data-access functions live in
:mod:`fleet_server.db.store`.
"""

from __future__ import annotations

from fleet_server.db.engine import make_engine, sqlite_url
from fleet_server.db.errors import RolloutConflict, StorageError, TokenRejected
from fleet_server.db.migrate import (
    current_revision,
    downgrade,
    head_revision,
    open_database,
    upgrade,
)

__all__ = [
    "RolloutConflict",
    "StorageError",
    "TokenRejected",
    "current_revision",
    "downgrade",
    "head_revision",
    "make_engine",
    "open_database",
    "sqlite_url",
    "upgrade",
]
