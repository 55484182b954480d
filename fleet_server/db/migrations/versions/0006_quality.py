"""Model quality (issue 17): shadow comparisons, drift buckets and the drift verdicts.

- ``shadow_results``: one row per sampled frame a device's shadow candidate decided
  beside the live model, keyed by ``(device_id, decision_id)``.
- ``drift_hours``: a device's histogram totals per (model version, line, source,
  bucket), upserted by that key.
- ``drift_status``: per (model version, line) an operator's pinned reference window
  and the drift job's last verdict.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def _json() -> sa.JSON:
    jsonb = postgresql.JSONB(none_as_null=True)
    return sa.JSON(none_as_null=True).with_variant(jsonb, "postgresql")


def upgrade() -> None:
    op.create_table(
        "shadow_results",
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("decision_id", sa.Text, nullable=False),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("received_at", sa.Double, nullable=False),
        sa.Column("line", sa.Text, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("live_model", sa.Text, nullable=False),
        sa.Column("live_version", sa.Text, nullable=False),
        sa.Column("live_outcome", sa.Text, nullable=False),
        sa.Column("shadow_model", sa.Text, nullable=False),
        sa.Column("shadow_version", sa.Text, nullable=False),
        sa.Column("shadow_release", sa.BigInteger),
        sa.Column("shadow_outcome", sa.Text, nullable=False),
        sa.Column("agree", sa.Boolean, nullable=False),
        sa.Column("payload", _json(), nullable=False),
        sa.PrimaryKeyConstraint("device_id", "decision_id", name="pk_shadow_results"),
    )
    op.create_index(
        "ix_shadow_results_shadow_model_shadow_version_ts",
        "shadow_results",
        ["shadow_model", "shadow_version", "ts"],
    )
    op.create_index("ix_shadow_results_ts", "shadow_results", ["ts"])
    op.create_table(
        "drift_hours",
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("model_name", sa.Text, nullable=False),
        sa.Column("model_version", sa.Text, nullable=False),
        sa.Column("line", sa.Text, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("hour", sa.BigInteger, nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.Column("payload", _json(), nullable=False),
        sa.Column("received_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint(
            "device_id",
            "model_name",
            "model_version",
            "line",
            "source",
            "hour",
            name="pk_drift_hours",
        ),
    )
    op.create_index(
        "ix_drift_hours_model_name_model_version_line_hour",
        "drift_hours",
        ["model_name", "model_version", "line", "hour"],
    )
    op.create_index("ix_drift_hours_line_hour", "drift_hours", ["line", "hour"])
    op.create_table(
        "drift_status",
        sa.Column("model_name", sa.Text, nullable=False),
        sa.Column("model_version", sa.Text, nullable=False),
        sa.Column("line", sa.Text, nullable=False),
        sa.Column("pin_start", sa.Double),
        sa.Column("pin_end", sa.Double),
        sa.Column("pinned_by", sa.Text),
        sa.Column("drifted", sa.Boolean, nullable=False),
        sa.Column("changed_at", sa.Double),
        sa.Column("checked_at", sa.Double),
        sa.Column("result", _json()),
        sa.PrimaryKeyConstraint("model_name", "model_version", "line", name="pk_drift_status"),
    )


def downgrade() -> None:
    op.drop_table("drift_status")
    op.drop_index("ix_drift_hours_line_hour", table_name="drift_hours")
    op.drop_index("ix_drift_hours_model_name_model_version_line_hour", table_name="drift_hours")
    op.drop_table("drift_hours")
    op.drop_index("ix_shadow_results_ts", table_name="shadow_results")
    op.drop_index("ix_shadow_results_shadow_model_shadow_version_ts", table_name="shadow_results")
    op.drop_table("shadow_results")
