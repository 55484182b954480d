"""Users of the web console and API, and their sign-in sessions.

Revision ID: 0002
Revises: 0001
Create Date: 2025-02-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("username", sa.Text, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("password_hash", sa.Text, nullable=False),
        sa.Column("disabled", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("password_changed_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("username", name="pk_users"),
    )
    op.create_table(
        "user_sessions",
        sa.Column("session_hash", sa.Text, nullable=False),
        sa.Column("username", sa.Text, nullable=False),
        sa.Column("csrf_token", sa.Text, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("last_seen", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("session_hash", name="pk_user_sessions"),
        sa.ForeignKeyConstraint(
            ["username"],
            ["users.username"],
            name="fk_user_sessions_username_users",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_user_sessions_username", "user_sessions", ["username"])
    op.create_index("ix_user_sessions_expires_at", "user_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_user_sessions_expires_at", table_name="user_sessions")
    op.drop_index("ix_user_sessions_username", table_name="user_sessions")
    op.drop_table("user_sessions")
    op.drop_table("users")
