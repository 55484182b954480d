"""The decision log's tables, indexes and view, and the migrations that make them.

- ``decisions``: one row per decision (:data:`COLUMNS`).
- ``shadow_results`` (migration 0002): one row per sampled frame the candidate in the
  shadow slot decided beside the live model (:data:`SHADOW_COLUMNS`), keyed by the live
  decision's id; ``uploaded`` as for decisions.
- ``drift_hours`` (migration 0003): per (model, version, line, source, hour) the counts
  and fixed-bin histograms of what the model saw and said (:data:`DRIFT_COLUMNS`; the bin
  edges are :data:`agent.wire.quality.DRIFT_BINS`); ``uploaded`` is 0 while the hour
  changes after its last upload, 2 while queued, 1 once acknowledged.
- ``decisions.station``, ``part_id``, ``deadline_missed`` (migration 0004): the station
  whose PLC trigger a decision answers, the part id the PLC passed with it, and whether
  the station's deadline passed first (the PLC got the fail-safe result); '' and 0 for a
  free-running pipeline and for the rows logged before the migration. ``part_id`` is
  indexed: a line manager looks a part up.

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

# The columns migration 0001 created, in table order: every decision log has them.
BASE_COLUMNS: tuple[str, ...] = (
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
STATION_COLUMNS: tuple[str, ...] = ("station", "part_id", "deadline_missed")
"""Added by migration 0004 (after ``uploaded`` in the table)."""
STATION_MIGRATION = "0004_add_station_fields"

# Column order of the table, and of the tuples the writer inserts.
COLUMNS: tuple[str, ...] = BASE_COLUMNS + STATION_COLUMNS
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


def _view_sql(columns: tuple[str, ...]) -> str:
    """The readable view over ``columns``: ISO-8601 UTC times beside the unix ones."""
    return (
        "SELECT id, "  # noqa: S608 - fixed names
        + _ISO.format(col="decision_time")
        + " AS decision_time_utc, "
        + _ISO.format(col="capture_time")
        + " AS capture_time_utc, "
        + ", ".join(c for c in columns if c != "id")
        + f" FROM {TABLE}"
    )


class _Migrations(Migrations):
    migrations_table = MIGRATIONS_TABLE


MIGRATIONS = _Migrations("decisionlog")


@MIGRATIONS(name="0001_create_decisions")
def _create_decisions(db: Database) -> None:
    table = db.table(TABLE)
    table.create(  # 0001's columns only: later ones are added by their migrations
        {c: _TYPES.get(c, str) for c in BASE_COLUMNS},
        pk="id",
        not_null=[c for c in BASE_COLUMNS if c not in _NULLABLE],
        defaults={"uploaded": 0},
    )
    table.create_index(["decision_time"], index_name="idx_decisions_time")
    table.create_index(["source", "decision_time"], index_name="idx_decisions_source_time")
    table.create_index(["outcome", "decision_time"], index_name="idx_decisions_outcome_time")
    table.create_index(["model_version"], index_name="idx_decisions_model_version")
    table.create_index(["uploaded", "decision_time"], index_name="idx_decisions_uploaded_time")
    db.create_view(VIEW, _view_sql(BASE_COLUMNS))


SHADOW_TABLE = "shadow_results"
SHADOW_COLUMNS: tuple[str, ...] = (
    "decision_id",
    "ts",
    "source",
    "line",
    "live_model",
    "live_version",
    "live_outcome",
    "live_ms",
    "live_outputs",
    "shadow_model",
    "shadow_version",
    "shadow_release",
    "shadow_digest",
    "shadow_outcome",
    "shadow_ms",
    "shadow_outputs",
    "agree",
    "iou_threshold",
    "matched",
    "unmatched_live",
    "unmatched_shadow",
    "thumbnail",
    "uploaded",
)
"""``*_outputs`` are JSON texts (the post-processed outputs, as in ``decisions.outputs``);
``agree`` is 0 or 1; ``thumbnail`` the path of the frame kept when they disagree."""
_SHADOW_TYPES: dict[str, type] = {
    "ts": float,
    "live_ms": float,
    "shadow_ms": float,
    "shadow_release": int,
    "agree": int,
    "iou_threshold": float,
    "matched": int,
    "unmatched_live": int,
    "unmatched_shadow": int,
    "uploaded": int,
}
_SHADOW_NULLABLE = frozenset({"shadow_release", "thumbnail"})

DRIFT_TABLE = "drift_hours"
DRIFT_COLUMNS: tuple[str, ...] = (
    "model_name",
    "model_version",
    "line",
    "source",
    "hour",
    "n",
    "outcomes",
    "top_class",
    "hist",
    "updated",
    "uploaded",
)
"""``outcomes`` and ``top_class`` are JSON objects of counts, ``hist`` a JSON object of
histogram name -> list of counts; ``hour`` the hour's start (Unix seconds)."""
DRIFT_KEY = ("model_name", "model_version", "line", "source", "hour")


@MIGRATIONS(name="0002_create_shadow_results")
def _create_shadow_results(db: Database) -> None:
    table = db.table(SHADOW_TABLE)
    table.create(
        {c: _SHADOW_TYPES.get(c, str) for c in SHADOW_COLUMNS},
        pk="decision_id",
        not_null=[c for c in SHADOW_COLUMNS if c not in _SHADOW_NULLABLE],
        defaults={"uploaded": 0},
    )
    table.create_index(["uploaded", "ts"], index_name="idx_shadow_uploaded_ts")
    table.create_index(["ts"], index_name="idx_shadow_ts")


@MIGRATIONS(name="0003_create_drift_hours")
def _create_drift_hours(db: Database) -> None:
    table = db.table(DRIFT_TABLE)
    types = {"hour": int, "n": int, "updated": float, "uploaded": int}
    table.create(
        {c: types.get(c, str) for c in DRIFT_COLUMNS},
        pk=DRIFT_KEY,
        not_null=list(DRIFT_COLUMNS),
        defaults={"uploaded": 0},
    )
    table.create_index(["uploaded", "hour"], index_name="idx_drift_uploaded_hour")


@MIGRATIONS(name=STATION_MIGRATION)
def _add_station_fields(db: Database) -> None:
    """The station columns, with defaults that every existing row takes (kept in place:
    ``ALTER TABLE ... ADD COLUMN`` rewrites no row), the part id index, and the readable
    view made again with them."""
    for ddl in (
        "station TEXT NOT NULL DEFAULT ''",
        "part_id TEXT NOT NULL DEFAULT ''",
        "deadline_missed INTEGER NOT NULL DEFAULT 0",
    ):
        db.execute(f"ALTER TABLE {TABLE} ADD COLUMN {ddl}")
    db.table(TABLE).create_index(
        ["part_id", "decision_time"], index_name="idx_decisions_part_id_time"
    )
    db.execute(f"DROP VIEW IF EXISTS {VIEW}")
    db.create_view(VIEW, _view_sql(COLUMNS))


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
