"""The decision log's tables, indexes and view, and the migrations that make them.

Migrations are sqlite-utils migrations recorded in ``_migrations`` (one row each: set,
name, applied_at) in the same transaction that applies them; a reopened database
applies only the ones it has not recorded.
"""

from __future__ import annotations

import sqlite3

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

TABLE = "decisions"
VIEW = "decisions_readable"
MIGRATIONS_TABLE = "_migrations"

NOT_UPLOADED = 0
"""``uploaded``: the fleet does not have the row, and it is not queued for upload."""
UPLOADED = 1
"""``uploaded``: the broker acknowledged an upload holding the row."""
QUEUED = 2
"""``uploaded``: the row is in an upload batch in the uplink's outbox."""

# Column order of the table, and of the tuples the writer inserts.
COLUMNS: tuple[str, ...] = (
    "id",
    "capture_time",
    "decision_time",
    "device_id",
    "source",
    "line",
    "model_name",
    "model_version",
    "bundle_digest",
    "backend",
    "config_hash",
    "input_digest",
    "outputs",
    "outcome",
    "thresholds",
    "latencies_ms",
    "e2e_ms",
    "thumbnail",
    "uploaded",
)
_TYPES: dict[str, type] = {
    "capture_time": float,
    "decision_time": float,
    "e2e_ms": float,
    "uploaded": int,
}
_NULLABLE = frozenset({"e2e_ms", "thumbnail"})

_NAMES = ", ".join(COLUMNS)
_MARKS = ", ".join("?" for _ in COLUMNS)
INSERT_SQL = f"INSERT INTO {TABLE} ({_NAMES}) VALUES ({_MARKS})"  # noqa: S608 - fixed names

_ISO = "strftime('%Y-%m-%dT%H:%M:%fZ', {col}, 'unixepoch')"
_VIEW_SQL = (
    "SELECT id, "  # noqa: S608 - fixed names
    + _ISO.format(col="decision_time")
    + " AS decision_time_utc, "
    + _ISO.format(col="capture_time")
    + " AS capture_time_utc, "
    + ", ".join(c for c in COLUMNS if c != "id")
    + f" FROM {TABLE}"
)


class _Migrations(Migrations):
    migrations_table = MIGRATIONS_TABLE


MIGRATIONS = _Migrations("decisionlog")


@MIGRATIONS(name="0001_create_decisions")
def _create_decisions(db: Database) -> None:
    table = db.table(TABLE)
    table.create(
        {c: _TYPES.get(c, str) for c in COLUMNS},
        pk="id",
        not_null=[c for c in COLUMNS if c not in _NULLABLE],
        defaults={"uploaded": 0},
    )
    table.create_index(["decision_time"], index_name="idx_decisions_time")
    table.create_index(["source", "decision_time"], index_name="idx_decisions_source_time")
    table.create_index(["outcome", "decision_time"], index_name="idx_decisions_outcome_time")
    table.create_index(["model_version"], index_name="idx_decisions_model_version")
    table.create_index(["uploaded", "decision_time"], index_name="idx_decisions_uploaded_time")
    db.create_view(VIEW, _VIEW_SQL)


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply the pending migrations on ``conn``; returns the names applied."""
    db = Database(conn, recursive_triggers=False, execute_plugins=False)
    pending = [m.name for m in MIGRATIONS.pending(db)]
    MIGRATIONS.apply(db)
    return pending


def applied(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """(name, applied_at) of every migration recorded in the database, oldest first."""
    db = Database(conn, recursive_triggers=False, execute_plugins=False)
    return [(m.name, m.applied_at) for m in MIGRATIONS.applied(db)]
