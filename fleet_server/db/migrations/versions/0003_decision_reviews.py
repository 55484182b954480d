"""Decision review: the current review of each decision and every review given, and the
indexes on ``decisions`` that keep the filtered, keyset-paginated list fast.

On a large ``decisions`` table the new indexes take a while to build, and writes to the
table wait meanwhile (docs/decision-review.md).

Revision ID: 0003
Revises: 0002
Create Date: 2025-03-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

# The same text as fleet_server.db.tables.LINE_EXPRESSION (a migration does not import
# application code that may change after it).
LINE_EXPRESSION = {
    "sqlite": "json_extract(payload, '$.line')",
    "postgresql": "(payload ->> 'line')",
}
INDEXES = (
    ("ix_decisions_ts", ["ts"]),
    ("ix_decisions_outcome_ts", ["outcome", "ts"]),
    ("ix_decisions_source_ts", ["source", "ts"]),
    ("ix_decisions_model_version_ts", ["model_version", "ts"]),
)


def upgrade() -> None:
    for name, columns in INDEXES:
        op.create_index(name, "decisions", columns)
    line = LINE_EXPRESSION[op.get_bind().dialect.name]
    op.create_index("ix_decisions_line_ts", "decisions", [sa.text(line), "ts"])
    op.create_index(
        "ix_decisions_device_id_line_ts", "decisions", ["device_id", sa.text(line), "ts"]
    )
    op.create_table(
        "decision_reviews",
        sa.Column("decision_id", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("decision_ts", sa.Double, nullable=False),
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("line", sa.Text, nullable=False),
        sa.Column("model_name", sa.Text, nullable=False),
        sa.Column("model_version", sa.Text, nullable=False),
        sa.Column("decided", sa.Text, nullable=False),
        sa.Column("verdict", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("reviewer", sa.Text, nullable=False),
        sa.Column("reviewed_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("decision_id", name="pk_decision_reviews"),
        sa.UniqueConstraint("seq", name="uq_decision_reviews_seq"),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            name="fk_decision_reviews_decision_id_decisions",
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        "ix_decision_reviews_decision_ts_decision_id",
        "decision_reviews",
        ["decision_ts", "decision_id"],
    )
    op.create_table(
        "decision_review_log",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), nullable=False),
        sa.Column("decision_id", sa.Text, nullable=False),
        sa.Column("decided", sa.Text, nullable=False),
        sa.Column("verdict", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("reviewer", sa.Text, nullable=False),
        sa.Column("reviewed_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_decision_review_log"),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            name="fk_decision_review_log_decision_id_decisions",
            ondelete="CASCADE",
        ),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_decision_review_log_decision_id", "decision_review_log", ["decision_id"])


def downgrade() -> None:
    op.drop_index("ix_decision_review_log_decision_id", table_name="decision_review_log")
    op.drop_table("decision_review_log")
    op.drop_index("ix_decision_reviews_decision_ts_decision_id", table_name="decision_reviews")
    op.drop_table("decision_reviews")
    op.drop_index("ix_decisions_device_id_line_ts", table_name="decisions")
    op.drop_index("ix_decisions_line_ts", table_name="decisions")
    for name, _ in reversed(INDEXES):
        op.drop_index(name, table_name="decisions")
