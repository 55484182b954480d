"""Decision thumbnails: the JPEG each device keeps of a decision, uploaded after it.

Revision ID: 0004
Revises: 0003
Create Date: 2025-04-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "decision_images",
        sa.Column("decision_id", sa.Text, nullable=False),
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("content_type", sa.Text, nullable=False),
        sa.Column("width", sa.Integer, nullable=False),
        sa.Column("height", sa.Integer, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("received_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("decision_id", "device_id", name="pk_decision_images"),
    )
    op.create_index("ix_decision_images_ts", "decision_images", ["ts"])


def downgrade() -> None:
    op.drop_index("ix_decision_images_ts", table_name="decision_images")
    op.drop_table("decision_images")
