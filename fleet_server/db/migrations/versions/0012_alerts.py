"""Alerts: ``alerts`` (one row per alert, from firing until resolved) and
``alert_deliveries`` (each webhook POST owed, its tries, delivered or dead).

``alert_id`` is never reused (SQLite AUTOINCREMENT, a PostgreSQL sequence): a receiver
may key on it. Open alerts are found by ``resolved_at IS NULL``; retention prunes
resolved alerts by ``fired_at``, and their deliveries go with them (ON DELETE CASCADE).
Due deliveries are found by (``state``, ``next_at``).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def _json() -> sa.JSON:
    jsonb = postgresql.JSONB(none_as_null=True)
    return sa.JSON(none_as_null=True).with_variant(jsonb, "postgresql")


def _id() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("alert_id", _id(), nullable=False),
        sa.Column("rule", sa.Text, nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("severity", sa.Text, nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("labels", _json(), nullable=False),
        sa.Column("sites", _json(), nullable=False),
        sa.Column("detail", _json(), nullable=False),
        sa.Column("fired_at", sa.Double, nullable=False),
        sa.Column("resolved_at", sa.Double),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("alert_id", name="pk_alerts"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_alerts_rule_key", "alerts", ["rule", "key"])
    op.create_index("ix_alerts_resolved_at", "alerts", ["resolved_at"])
    op.create_index("ix_alerts_fired_at", "alerts", ["fired_at"])
    op.create_table(
        "alert_deliveries",
        sa.Column("delivery_id", sa.Text, nullable=False),
        sa.Column("alert_id", _id(), nullable=False),
        sa.Column("event", sa.Text, nullable=False),
        sa.Column("webhook", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("next_at", sa.Double, nullable=False),
        sa.Column("done_at", sa.Double),
        sa.Column("last_status", sa.Integer),
        sa.Column("last_error", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("delivery_id", name="pk_alert_deliveries"),
        sa.ForeignKeyConstraint(
            ["alert_id"],
            ["alerts.alert_id"],
            name="fk_alert_deliveries_alert_id_alerts",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_alert_deliveries_alert_id", "alert_deliveries", ["alert_id"])
    op.create_index("ix_alert_deliveries_state_next_at", "alert_deliveries", ["state", "next_at"])


def downgrade() -> None:
    op.drop_table("alert_deliveries")
    op.drop_table("alerts")
