"""Initial schema: devices, enrollment tokens, device records, quarantine, rollouts.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def _json() -> sa.JSON:
    jsonb = postgresql.JSONB(none_as_null=True)
    return sa.JSON(none_as_null=True).with_variant(jsonb, "postgresql")


def _record_table(name: str) -> None:
    op.create_table(
        name,
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("record_id", sa.Text, nullable=False),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("payload", _json(), nullable=False),
        sa.PrimaryKeyConstraint("device_id", "record_id", name=f"pk_{name}"),
    )
    op.create_index(f"ix_{name}_device_id_ts", name, ["device_id", "ts"])


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("labels", _json(), nullable=False),
        sa.Column("profile", sa.Text, nullable=False),
        sa.Column("agent_version", sa.Text),
        sa.Column("enrolled_at", sa.Double, nullable=False),
        sa.Column("last_seen", sa.Double),
        sa.Column("online", sa.Boolean, nullable=False),
        sa.Column("active_bundle", sa.Text),
        sa.Column("active_release", sa.BigInteger),
        sa.Column("previous_bundle", sa.Text),
        sa.Column("previous_release", sa.BigInteger),
        sa.Column("health", _json()),
        sa.Column("cert_serial", sa.Text),
        sa.Column("revoked", sa.Boolean, nullable=False),
        sa.PrimaryKeyConstraint("device_id", name="pk_devices"),
    )
    op.create_table(
        "enrollment_tokens",
        sa.Column("token_hash", sa.Text, nullable=False),
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("labels", _json(), nullable=False),
        sa.Column("profile", sa.Text, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
        sa.Column("used_at", sa.Double),
        sa.PrimaryKeyConstraint("token_hash", name="pk_enrollment_tokens"),
    )
    op.create_index("ix_enrollment_tokens_device_id", "enrollment_tokens", ["device_id"])
    _record_table("heartbeats")
    _record_table("telemetry")
    op.create_table(
        "decisions",
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("model_name", sa.Text, nullable=False),
        sa.Column("model_version", sa.Text, nullable=False),
        sa.Column("payload", _json(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_decisions"),
    )
    op.create_index("ix_decisions_device_id_ts", "decisions", ["device_id", "ts"])
    op.create_table(
        "events",
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("payload", _json(), nullable=False),
        sa.PrimaryKeyConstraint("device_id", "event_id", name="pk_events"),
    )
    op.create_index("ix_events_device_id_ts", "events", ["device_id", "ts"])
    op.create_index("ix_events_kind_ts", "events", ["kind", "ts"])
    op.create_table(
        "quarantine",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), nullable=False),
        sa.Column("received_at", sa.Double, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_quarantine"),
    )
    op.create_table(
        "rollouts",
        sa.Column("rollout_id", sa.Text, nullable=False),
        sa.Column("bundle", sa.Text, nullable=False),
        sa.Column("release", sa.BigInteger, nullable=False),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("selector", _json(), nullable=False),
        sa.Column("waves", _json(), nullable=False),
        sa.Column("soak_s", sa.Double, nullable=False),
        sa.Column("policy", _json(), nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("controller_state", _json(), nullable=False),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("rollout_id", name="pk_rollouts"),
    )
    op.create_index("ix_rollouts_state", "rollouts", ["state"])
    op.create_table(
        "rollout_devices",
        sa.Column("rollout_id", sa.Text, nullable=False),
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("wave", sa.Integer, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("rollout_id", "device_id", name="pk_rollout_devices"),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollouts.rollout_id"],
            name="fk_rollout_devices_rollout_id_rollouts",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_rollout_devices_device_id", "rollout_devices", ["device_id"])


def downgrade() -> None:
    for index, table in (
        ("ix_rollout_devices_device_id", "rollout_devices"),
        ("ix_rollouts_state", "rollouts"),
        ("ix_events_kind_ts", "events"),
        ("ix_events_device_id_ts", "events"),
        ("ix_decisions_device_id_ts", "decisions"),
        ("ix_telemetry_device_id_ts", "telemetry"),
        ("ix_heartbeats_device_id_ts", "heartbeats"),
        ("ix_enrollment_tokens_device_id", "enrollment_tokens"),
    ):
        op.drop_index(index, table_name=table)
    for table in (
        "rollout_devices",
        "rollouts",
        "quarantine",
        "events",
        "decisions",
        "telemetry",
        "heartbeats",
        "enrollment_tokens",
        "devices",
    ):
        op.drop_table(table)
