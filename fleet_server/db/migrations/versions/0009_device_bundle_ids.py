"""Each device's active and previous bundle in full (issue 26).

``devices.active_version``, ``active_digest``, ``previous_version``, ``previous_digest``:
the version and digest the device reports with the bundle's name and release, also for
the bundle it was set up with (run from its configured directory, in no slot), so the
fleet knows what a revert returns it to. NULL: not reported (older agents), or none.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = ("active_version", "active_digest", "previous_version", "previous_digest")


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
