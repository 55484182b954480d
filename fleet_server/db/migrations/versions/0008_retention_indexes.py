"""Retention (issue 18): a time index on each table pruned by age or rows without one.

Retention deletes the oldest rows first, ``ORDER BY <time> LIMIT n``; these indexes
serve that order (and the row budgets' "time of the N-th newest row"):
``heartbeats.ts``, ``telemetry.ts``, ``events.ts``, ``quarantine.received_at``,
``drift_hours.hour``. ``IF NOT EXISTS``: on a large PostgreSQL database an operator may
build them beforehand with ``CREATE INDEX CONCURRENTLY`` (docs/retention.md), so that
the upgrade does not hold ingest up while it builds them.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-09
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

INDEXES = (
    ("ix_heartbeats_ts", "heartbeats", "ts"),
    ("ix_telemetry_ts", "telemetry", "ts"),
    ("ix_events_ts", "events", "ts"),
    ("ix_quarantine_received_at", "quarantine", "received_at"),
    ("ix_drift_hours_hour", "drift_hours", "hour"),
)


def upgrade() -> None:
    for name, table, column in INDEXES:
        op.create_index(name, table, [column], if_not_exists=True)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
