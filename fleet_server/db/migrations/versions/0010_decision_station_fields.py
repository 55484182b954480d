"""A decision's station fields (the line: triggered inspection stations).

``decisions.station``, ``part_id`` (text, ``''`` by default) and ``deadline_missed``
(boolean, false by default): the station whose PLC trigger the decision answers, the
part id the PLC passed with the trigger, and whether the station's deadline passed
before the decision (the PLC got the station's fail-safe result). Rows stored before
take the defaults, as rows of free-running pipelines do; every row is kept (an added
column with a constant default rewrites no row on either engine).

``ix_decisions_part_id_ts`` serves the review's ``part_id`` filter (a line manager looks
a part up), read in time order like the other filters' indexes. ``station`` has no index
of its own: it is checked row by row while another index is read (a station's decisions
are a share of its camera's, ``source``).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-12
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None

INDEX = "ix_decisions_part_id_ts"


def upgrade() -> None:
    op.add_column("decisions", sa.Column("station", sa.Text, nullable=False, server_default=""))
    op.add_column("decisions", sa.Column("part_id", sa.Text, nullable=False, server_default=""))
    op.add_column(
        "decisions",
        sa.Column("deadline_missed", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_index(INDEX, "decisions", ["part_id", "ts"])


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+ too), not a batch rebuild: that would
    # lose the expression indexes on the row's line, which SQLite can't reflect.
    op.drop_index(INDEX, table_name="decisions")
    for name in ("deadline_missed", "part_id", "station"):
        op.drop_column("decisions", name)
