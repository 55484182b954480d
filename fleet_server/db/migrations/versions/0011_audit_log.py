"""The audit trail: ``audit_log``, one row per change an operator, a line manager or a
command made (who, role, from where, the action, its target, the result, details).

``seq`` orders the rows and is never reused (SQLite AUTOINCREMENT, a PostgreSQL
sequence). Indexes serve the trail's filters, each read newest first: by time, by actor,
by action and by target; retention prunes by ``ts``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    jsonb = postgresql.JSONB(none_as_null=True)
    op.create_table(
        "audit_log",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), nullable=False),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("result", sa.Text, nullable=False),
        sa.Column(
            "detail", sa.JSON(none_as_null=True).with_variant(jsonb, "postgresql"), nullable=False
        ),
        sa.PrimaryKeyConstraint("seq", name="pk_audit_log"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_log_ts", "audit_log", ["ts"])
    op.create_index("ix_audit_log_actor_ts", "audit_log", ["actor", "ts"])
    op.create_index("ix_audit_log_action_ts", "audit_log", ["action", "ts"])
    op.create_index("ix_audit_log_target_ts", "audit_log", ["target", "ts"])


def downgrade() -> None:
    op.drop_table("audit_log")
