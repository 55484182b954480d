"""Remote actions: ``device_actions`` (each request an operator made of a device and the
device's newest answer), ``action_chunks`` (what the action collected: log lines, a
diagnostics archive) and ``action_counters`` (the last counter signed per device).

A device's counter is unique in ``device_actions`` (one request per counter); requests
are listed per device newest first and pruned by ``requested_at``, chunks by
``received_at``. ``action_counters`` is never pruned: a counter is never signed twice.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def _json() -> sa.JSON:
    jsonb = postgresql.JSONB(none_as_null=True)
    return sa.JSON(none_as_null=True).with_variant(jsonb, "postgresql")


def upgrade() -> None:
    op.create_table(
        "device_actions",
        sa.Column("request_id", sa.Text, nullable=False),
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("counter", sa.BigInteger, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("params", _json(), nullable=False),
        sa.Column("requested_by", sa.Text, nullable=False),
        sa.Column("requested_at", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("detail", _json(), nullable=False),
        sa.Column("answered_at", sa.Double),
        sa.Column("chunks", sa.BigInteger, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("request_id", name="pk_device_actions"),
        sa.UniqueConstraint("device_id", "counter", name="uq_device_actions_device_id_counter"),
    )
    op.create_index(
        "ix_device_actions_device_id_requested_at", "device_actions", ["device_id", "requested_at"]
    )
    op.create_index("ix_device_actions_requested_at", "device_actions", ["requested_at"])
    op.create_table(
        "action_chunks",
        sa.Column("request_id", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("encoding", sa.Text, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("received_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("request_id", "seq", name="pk_action_chunks"),
    )
    op.create_index("ix_action_chunks_received_at", "action_chunks", ["received_at"])
    op.create_table(
        "action_counters",
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("counter", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("device_id", name="pk_action_counters"),
    )


def downgrade() -> None:
    op.drop_table("action_counters")
    op.drop_table("action_chunks")
    op.drop_table("device_actions")
