"""One device can't hurt the fleet (issue 13): decisions keyed by (device_id, id), the
server's receive time beside device times, what a device reports of its labels and
profile kept apart from the fleet's.

- ``decisions``: primary key ``(device_id, id)`` (was ``id``); ``decision_reviews``
  keyed by ``(device_id, decision_id)``; ``decision_review_log`` gains ``device_id``
  (filled from the decision); both refer to the decision by the pair.
- ``received_at`` (nullable: NULL for rows stored before) on ``heartbeats``,
  ``telemetry``, ``events`` and ``decisions``.
- ``devices.reported_profile`` and ``devices.reported_labels``.

Every row is kept. SQLite can't change a primary key in place: the three decision
tables are renamed, built again and filled from the old ones (the review log's
``AUTOINCREMENT`` counter carried over), the old ones dropped (children first, so
that no cascade runs). Downgrading refuses when two devices share a decision id.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

# The same text as fleet_server.db.tables.LINE_EXPRESSION (see 0003).
LINE_EXPRESSION = {
    "sqlite": "json_extract(payload, '$.line')",
    "postgresql": "(payload ->> 'line')",
}
DECISION_INDEXES = (
    ("ix_decisions_ts", ["ts"]),
    ("ix_decisions_outcome_ts", ["outcome", "ts"]),
    ("ix_decisions_source_ts", ["source", "ts"]),
    ("ix_decisions_model_version_ts", ["model_version", "ts"]),
    ("ix_decisions_device_id_ts", ["device_id", "ts"]),
)
RECEIVED = ("heartbeats", "telemetry", "events", "decisions")
DECISION_COLUMNS = (
    "id, device_id, ts, source, outcome, model_name, model_version, payload"  # 0001's
)
REVIEW_COLUMNS = (
    "decision_id, seq, decision_ts, device_id, line, model_name, model_version, decided, "
    "verdict, outcome, note, reviewer, reviewed_at"
)
LOG_COLUMNS = "seq, decision_id, decided, verdict, outcome, note, reviewer, reviewed_at"


def _json() -> sa.JSON:
    jsonb = postgresql.JSONB(none_as_null=True)
    return sa.JSON(none_as_null=True).with_variant(jsonb, "postgresql")


def upgrade() -> None:
    for table in RECEIVED:
        if table != "decisions":
            op.add_column(table, sa.Column("received_at", sa.Double))
    op.add_column("devices", sa.Column("reported_profile", sa.Text))
    op.add_column("devices", sa.Column("reported_labels", _json()))
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(paired=True)
    else:
        op.add_column("decisions", sa.Column("received_at", sa.Double))
        _rekey_postgresql(paired=True)


def downgrade() -> None:
    conn = op.get_bind()
    shared = conn.execute(
        sa.text("SELECT id FROM decisions GROUP BY id HAVING count(*) > 1 LIMIT 1")
    ).first()
    if shared is not None:
        raise RuntimeError(
            f"can't downgrade below 0005: decision id {shared[0]!r} is used by several "
            "devices (delete all but one first)"
        )
    if conn.dialect.name == "sqlite":
        _rebuild_sqlite(paired=False)
    else:
        _rekey_postgresql(paired=False)
        op.drop_column("decisions", "received_at")
    op.drop_column("devices", "reported_labels")
    op.drop_column("devices", "reported_profile")
    for table in RECEIVED:
        if table != "decisions":
            op.drop_column(table, "received_at")


def _fk(paired: bool) -> tuple[list[str], list[str]]:
    if paired:
        return ["device_id", "decision_id"], ["decisions.device_id", "decisions.id"]
    return ["decision_id"], ["decisions.id"]


def _fk_name(table: str, paired: bool) -> str:
    return f"fk_{table}_{'device_id' if paired else 'decision_id'}_decisions"


def _log_index(paired: bool) -> tuple[str, list[str]]:
    if paired:
        return "ix_decision_review_log_device_id_decision_id", ["device_id", "decision_id"]
    return "ix_decision_review_log_decision_id", ["decision_id"]


def _rekey_postgresql(paired: bool) -> None:
    for table in ("decision_reviews", "decision_review_log"):
        op.drop_constraint(_fk_name(table, not paired), table, type_="foreignkey")
    op.drop_constraint("pk_decisions", "decisions", type_="primary")
    op.create_primary_key("pk_decisions", "decisions", ["device_id", "id"] if paired else ["id"])
    op.drop_constraint("pk_decision_reviews", "decision_reviews", type_="primary")
    op.create_primary_key(
        "pk_decision_reviews",
        "decision_reviews",
        ["device_id", "decision_id"] if paired else ["decision_id"],
    )
    old_index, _ = _log_index(not paired)
    op.drop_index(old_index, table_name="decision_review_log")
    if paired:
        op.add_column("decision_review_log", sa.Column("device_id", sa.Text))
        op.execute(
            "UPDATE decision_review_log AS l SET device_id = d.device_id "
            "FROM decisions AS d WHERE d.id = l.decision_id"
        )
        op.alter_column("decision_review_log", "device_id", nullable=False)
    else:
        op.drop_column("decision_review_log", "device_id")
    name, columns = _log_index(paired)
    op.create_index(name, "decision_review_log", columns)
    local, remote = _fk(paired)
    for table in ("decision_reviews", "decision_review_log"):
        op.create_foreign_key(
            _fk_name(table, paired),
            table,
            "decisions",
            local,
            [r.split(".")[1] for r in remote],
            ondelete="CASCADE",
        )


def _create_decision_tables(paired: bool) -> None:
    key = ["device_id", "id"] if paired else ["id"]
    received = [sa.Column("received_at", sa.Double)] if paired else []
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
        *received,
        sa.PrimaryKeyConstraint(*key, name="pk_decisions"),
    )
    local, remote = _fk(paired)
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
        sa.PrimaryKeyConstraint(
            *(["device_id", "decision_id"] if paired else ["decision_id"]),
            name="pk_decision_reviews",
        ),
        sa.UniqueConstraint("seq", name="uq_decision_reviews_seq"),
        sa.ForeignKeyConstraint(
            local, remote, name=_fk_name("decision_reviews", paired), ondelete="CASCADE"
        ),
    )
    device = [sa.Column("device_id", sa.Text, nullable=False)] if paired else []
    op.create_table(
        "decision_review_log",
        sa.Column("seq", sa.Integer, nullable=False),
        *device,
        sa.Column("decision_id", sa.Text, nullable=False),
        sa.Column("decided", sa.Text, nullable=False),
        sa.Column("verdict", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("reviewer", sa.Text, nullable=False),
        sa.Column("reviewed_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_decision_review_log"),
        sa.ForeignKeyConstraint(
            local, remote, name=_fk_name("decision_review_log", paired), ondelete="CASCADE"
        ),
        sqlite_autoincrement=True,
    )


def _rebuild_sqlite(paired: bool) -> None:
    conn = op.get_bind()
    counter = conn.execute(
        sa.text("SELECT seq FROM sqlite_sequence WHERE name = 'decision_review_log'")
    ).scalar()
    for table in ("decision_review_log", "decision_reviews", "decisions"):
        op.rename_table(table, f"_old_{table}")
    _create_decision_tables(paired)
    # Only this module's constants are formatted into the SQL below.
    op.execute(
        f"INSERT INTO decisions ({DECISION_COLUMNS}) "  # noqa: S608
        f"SELECT {DECISION_COLUMNS} FROM _old_decisions"
    )
    op.execute(
        f"INSERT INTO decision_reviews ({REVIEW_COLUMNS}) "  # noqa: S608
        f"SELECT {REVIEW_COLUMNS} FROM _old_decision_reviews"
    )
    if paired:
        picked = ", ".join(f"l.{c.strip()}" for c in LOG_COLUMNS.split(","))
        op.execute(
            f"INSERT INTO decision_review_log ({LOG_COLUMNS}, device_id) "  # noqa: S608
            f"SELECT {picked}, d.device_id FROM _old_decision_review_log AS l "
            "JOIN _old_decisions AS d ON d.id = l.decision_id"
        )
    else:
        op.execute(
            f"INSERT INTO decision_review_log ({LOG_COLUMNS}) "  # noqa: S608
            f"SELECT {LOG_COLUMNS} FROM _old_decision_review_log"
        )
    if counter is not None:  # a seq is never used twice, not even after a delete
        conn.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = 'decision_review_log'"))
        conn.execute(
            sa.text(
                "INSERT INTO sqlite_sequence (name, seq) SELECT 'decision_review_log', "
                "max(:n, coalesce((SELECT max(seq) FROM decision_review_log), 0))"
            ),
            {"n": counter},
        )
    for table in ("decision_review_log", "decision_reviews", "decisions"):
        op.drop_table(f"_old_{table}")
    for name, cols in DECISION_INDEXES:
        op.create_index(name, "decisions", cols)
    line = LINE_EXPRESSION["sqlite"]
    op.create_index("ix_decisions_line_ts", "decisions", [sa.text(line), "ts"])
    op.create_index(
        "ix_decisions_device_id_line_ts", "decisions", ["device_id", sa.text(line), "ts"]
    )
    op.create_index(
        "ix_decision_reviews_decision_ts_decision_id",
        "decision_reviews",
        ["decision_ts", "decision_id"],
    )
    name, cols = _log_index(paired)
    op.create_index(name, "decision_review_log", cols)
