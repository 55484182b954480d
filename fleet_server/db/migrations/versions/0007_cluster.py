"""Replicas and broker shards (issue 18).

- ``cluster_leader``: the fencing epoch of each leader-only role's current term.
- ``cluster_replicas``: each replica's last report, for ``fleet-server status``.
- ``devices.shard``: the broker shard a device was given at enrollment (NULL: main).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def _json() -> sa.JSON:
    jsonb = postgresql.JSONB(none_as_null=True)
    return sa.JSON(none_as_null=True).with_variant(jsonb, "postgresql")


def upgrade() -> None:
    op.create_table(
        "cluster_leader",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("acquired_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_cluster_leader"),
    )
    op.create_table(
        "cluster_replicas",
        sa.Column("replica_id", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.BigInteger, nullable=False),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Column("seen_at", sa.Double, nullable=False),
        sa.Column("leader", sa.Boolean, nullable=False),
        sa.Column("epoch", sa.BigInteger),
        sa.Column("info", _json()),
        sa.PrimaryKeyConstraint("replica_id", name="pk_cluster_replicas"),
    )
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("shard", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("shard")
    op.drop_table("cluster_replicas")
    op.drop_table("cluster_leader")
