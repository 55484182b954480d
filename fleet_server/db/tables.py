"""The fleet database's tables (SQLAlchemy Core), the same on SQLite and PostgreSQL.

Timestamps are Unix seconds (float). JSON columns are JSONB on PostgreSQL. Records
uploaded by devices carry ids generated on the device, and their primary keys (always
led by ``device_id``: one device can't claim another's ids) make a second copy of a
record a no-op (see docs/fleet-storage.md). Beside each device time (``ts``) a record
keeps ``received_at``, the server's time of storing it (NULL for rows stored before
migration 0005). A device's ``labels`` and ``profile`` are the fleet's (enrollment,
operators); what the device reports of them is kept apart, in ``reported_*``. Users
and their sign-in sessions (only a hash of each session id is kept) belong to
:mod:`fleet_server.auth`. Changing a table here needs a new migration under
``migrations/versions``; a test compares the two.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = sa.MetaData(naming_convention=NAMING)


def json_type() -> sa.JSON:
    """JSON on SQLite, JSONB on PostgreSQL; Python ``None`` is stored as SQL NULL."""
    jsonb = postgresql.JSONB(none_as_null=True)
    return sa.JSON(none_as_null=True).with_variant(jsonb, "postgresql")


TS = sa.Double

devices = sa.Table(
    "devices",
    metadata,
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("labels", json_type(), nullable=False),
    sa.Column("profile", sa.Text, nullable=False),
    sa.Column("agent_version", sa.Text),
    sa.Column("enrolled_at", TS, nullable=False),
    sa.Column("last_seen", TS),
    sa.Column("online", sa.Boolean, nullable=False),
    sa.Column("active_bundle", sa.Text),
    sa.Column("active_release", sa.BigInteger),
    sa.Column("previous_bundle", sa.Text),
    sa.Column("previous_release", sa.BigInteger),
    sa.Column("active_version", sa.Text),
    sa.Column("active_digest", sa.Text),
    sa.Column("previous_version", sa.Text),
    sa.Column("previous_digest", sa.Text),
    sa.Column("health", json_type()),
    sa.Column("cert_serial", sa.Text),
    sa.Column("revoked", sa.Boolean, nullable=False),
    sa.Column("reported_profile", sa.Text),
    sa.Column("reported_labels", json_type()),
    sa.Column("shard", sa.Text),
)
"""``labels`` and ``profile`` are set by enrollment and operators only, and are what
rollout selectors and signed directives use; ``reported_profile`` and
``reported_labels`` are what the device last said of itself (shown, never used).
``shard`` is the broker the device was given at enrollment (NULL: the main broker, as
before migration 0007). ``*_version`` and ``*_digest`` complete the active and previous
bundle as the device reports them (migration 0009; NULL: not reported)."""

enrollment_tokens = sa.Table(
    "enrollment_tokens",
    metadata,
    sa.Column("token_hash", sa.Text, primary_key=True),
    sa.Column("device_id", sa.Text, nullable=False, index=True),
    sa.Column("labels", json_type(), nullable=False),
    sa.Column("profile", sa.Text, nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("expires_at", TS, nullable=False),
    sa.Column("used_at", TS),
)


def _record_table(name: str) -> sa.Table:
    """heartbeats and telemetry: one row per (device, record id the device made)."""
    return sa.Table(
        name,
        metadata,
        sa.Column("device_id", sa.Text, primary_key=True),
        sa.Column("record_id", sa.Text, primary_key=True),
        sa.Column("ts", TS, nullable=False),
        sa.Column("payload", json_type(), nullable=False),
        sa.Column("received_at", TS),
        sa.Index(None, "device_id", "ts"),
        sa.Index(None, "ts"),  # retention: oldest first (migration 0008)
    )


heartbeats = _record_table("heartbeats")
telemetry = _record_table("telemetry")

decisions = sa.Table(
    "decisions",
    metadata,
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("ts", TS, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("model_name", sa.Text, nullable=False),
    sa.Column("model_version", sa.Text, nullable=False),
    sa.Column("payload", json_type(), nullable=False),
    sa.Column("received_at", TS),
    sa.Column("station", sa.Text, nullable=False, server_default=""),
    sa.Column("part_id", sa.Text, nullable=False, server_default=""),
    sa.Column("deadline_missed", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Index(None, "device_id", "ts"),
)
"""A decision is known by (device_id, id): two devices may use the same id, and each
sees only its own row (docs/fleet-storage.md, "Decision ids"). ``station``, ``part_id``
and ``deadline_missed`` (migration 0010) are the row's own fields: the station whose PLC
trigger it answers, the part id the PLC passed, whether the station's deadline passed
first ('', '', false for a free-running pipeline and for rows stored before)."""

events = sa.Table(
    "events",
    metadata,
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("event_id", sa.Text, primary_key=True),
    sa.Column("ts", TS, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("payload", json_type(), nullable=False),
    sa.Column("received_at", TS),
    sa.Index(None, "device_id", "ts"),
    sa.Index(None, "kind", "ts"),
    sa.Index(None, "ts"),  # retention (migration 0008)
)

quarantine = sa.Table(
    "quarantine",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("received_at", TS, nullable=False),
    sa.Column("topic", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("payload", sa.LargeBinary, nullable=False),
    sa.Index(None, "received_at"),  # retention (migration 0008)
)

rollouts = sa.Table(
    "rollouts",
    metadata,
    sa.Column("rollout_id", sa.Text, primary_key=True),
    sa.Column("bundle", sa.Text, nullable=False),
    sa.Column("release", sa.BigInteger, nullable=False),
    sa.Column("version", sa.Text, nullable=False),
    sa.Column("selector", json_type(), nullable=False),
    sa.Column("waves", json_type(), nullable=False),
    sa.Column("soak_s", sa.Double, nullable=False),
    sa.Column("policy", json_type(), nullable=False),
    sa.Column("state", sa.Text, nullable=False, index=True),
    sa.Column("controller_state", json_type(), nullable=False),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("updated_at", TS, nullable=False),
)

rollout_devices = sa.Table(
    "rollout_devices",
    metadata,
    sa.Column(
        "rollout_id",
        sa.Text,
        sa.ForeignKey("rollouts.rollout_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("device_id", sa.Text, primary_key=True, index=True),
    sa.Column("wave", sa.Integer, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("updated_at", TS, nullable=False),
)

users = sa.Table(
    "users",
    metadata,
    sa.Column("username", sa.Text, primary_key=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("password_hash", sa.Text, nullable=False),
    sa.Column("disabled", sa.Boolean, nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("password_changed_at", TS, nullable=False),
)

user_sessions = sa.Table(
    "user_sessions",
    metadata,
    sa.Column("session_hash", sa.Text, primary_key=True),
    sa.Column(
        "username",
        sa.Text,
        sa.ForeignKey("users.username", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    sa.Column("csrf_token", sa.Text, nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("last_seen", TS, nullable=False),
    sa.Column("expires_at", TS, nullable=False, index=True),
)

# -- decision review (fleet_server.review, docs/decision-review.md) ---------------------

LINE_EXPRESSION = {
    "sqlite": "json_extract(payload, '$.line')",
    "postgresql": "(payload ->> 'line')",
}
"""The decision row's ``line`` as SQL, per dialect: the expression of the indexes
``ix_decisions_line_ts`` and ``ix_decisions_device_id_line_ts``; a query must spell it
the same way for an index to serve it. (The indexes below are declared with the
PostgreSQL form, which the migration tests compare; SQLite can't reflect expression
indexes, and the migration builds them there with the SQLite form.)"""

sa.Index("ix_decisions_ts", decisions.c.ts)
sa.Index("ix_decisions_outcome_ts", decisions.c.outcome, decisions.c.ts)
sa.Index("ix_decisions_source_ts", decisions.c.source, decisions.c.ts)
sa.Index("ix_decisions_model_version_ts", decisions.c.model_version, decisions.c.ts)
sa.Index("ix_decisions_part_id_ts", decisions.c.part_id, decisions.c.ts)  # migration 0010
sa.Index("ix_decisions_line_ts", sa.text(LINE_EXPRESSION["postgresql"]), decisions.c.ts)
sa.Index(
    "ix_decisions_device_id_line_ts",
    decisions.c.device_id,
    sa.text(LINE_EXPRESSION["postgresql"]),
    decisions.c.ts,
)

decision_reviews = sa.Table(
    "decision_reviews",
    metadata,
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("decision_id", sa.Text, primary_key=True),
    sa.Column("seq", sa.BigInteger, nullable=False, unique=True),
    sa.Column("decision_ts", TS, nullable=False),
    sa.Column("line", sa.Text, nullable=False),
    sa.Column("model_name", sa.Text, nullable=False),
    sa.Column("model_version", sa.Text, nullable=False),
    sa.Column("decided", sa.Text, nullable=False),
    sa.Column("verdict", sa.Text, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("reviewer", sa.Text, nullable=False),
    sa.Column("reviewed_at", TS, nullable=False),
    sa.ForeignKeyConstraint(
        ["device_id", "decision_id"],
        ["decisions.device_id", "decisions.id"],
        ondelete="CASCADE",
    ),
    sa.Index(None, "decision_ts", "decision_id"),
)
"""The current review of a decision (its ground-truth label): one row per reviewed
decision, replaced by a newer review; ``seq`` is the newest entry of
``decision_review_log`` for it, the cursor of ``GET /api/v1/labels``."""

decision_review_log = sa.Table(
    "decision_review_log",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("device_id", sa.Text, nullable=False),
    sa.Column("decision_id", sa.Text, nullable=False),
    sa.Column("decided", sa.Text, nullable=False),
    sa.Column("verdict", sa.Text, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("reviewer", sa.Text, nullable=False),
    sa.Column("reviewed_at", TS, nullable=False),
    sa.ForeignKeyConstraint(
        ["device_id", "decision_id"],
        ["decisions.device_id", "decisions.id"],
        ondelete="CASCADE",
    ),
    sa.Index(None, "device_id", "decision_id"),
    sqlite_autoincrement=True,  # a seq is never used twice, not even after a delete
)
"""Every review ever given, oldest first (an override of an override keeps both)."""

decision_images = sa.Table(
    "decision_images",
    metadata,
    sa.Column("decision_id", sa.Text, primary_key=True),
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("ts", TS, nullable=False),
    sa.Column("content_type", sa.Text, nullable=False),
    sa.Column("width", sa.Integer, nullable=False),
    sa.Column("height", sa.Integer, nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Column("received_at", TS, nullable=False),
    sa.Index(None, "ts"),
)
"""The thumbnail a device kept of a decision (a JPEG of a few tens of KB), keyed by the
decision's id and the uploading device (so a device that sends a picture under another
device's decision id first can't keep the real one out). No foreign key: it may arrive
before the decision row. An image is shown only with the decision of the same device."""

# -- model quality (fleet_server.quality, issue 17) --------------------------------------

shadow_results = sa.Table(
    "shadow_results",
    metadata,
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("decision_id", sa.Text, primary_key=True),
    sa.Column("ts", TS, nullable=False),
    sa.Column("received_at", TS, nullable=False),
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
    sa.Column("payload", json_type(), nullable=False),
    sa.Index(None, "shadow_model", "shadow_version", "ts"),
    sa.Index(None, "ts"),
)
"""One sampled frame decided by the live model and a candidate in a device's shadow slot
(the :class:`agent.wire.quality.ShadowRecord` in ``payload``), keyed by the device and
the live decision's id: a second copy is a no-op. ``line`` is the device's word (a
record is stored only for a model version the fleet knows for that device)."""

drift_hours = sa.Table(
    "drift_hours",
    metadata,
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("model_name", sa.Text, primary_key=True),
    sa.Column("model_version", sa.Text, primary_key=True),
    sa.Column("line", sa.Text, primary_key=True),
    sa.Column("source", sa.Text, primary_key=True),
    sa.Column("hour", sa.BigInteger, primary_key=True),
    sa.Column("n", sa.BigInteger, nullable=False),
    sa.Column("payload", json_type(), nullable=False),
    sa.Column("received_at", TS, nullable=False),
    sa.Index(None, "model_name", "model_version", "line", "hour"),
    sa.Index(None, "line", "hour"),
    sa.Index(None, "hour"),  # retention (migration 0008)
)
"""A device's drift bucket (:class:`agent.wire.quality.DriftHour`): ``hour`` is the
bucket's start (Unix s), ``payload`` holds ``period_s``, ``outcomes``, ``top_class`` and
``hist``. Rows are totals, so a newer copy of a bucket replaces the older one (upsert)."""

drift_status = sa.Table(
    "drift_status",
    metadata,
    sa.Column("model_name", sa.Text, primary_key=True),
    sa.Column("model_version", sa.Text, primary_key=True),
    sa.Column("line", sa.Text, primary_key=True),
    sa.Column("pin_start", TS),
    sa.Column("pin_end", TS),
    sa.Column("pinned_by", sa.Text),
    sa.Column("drifted", sa.Boolean, nullable=False),
    sa.Column("changed_at", TS),
    sa.Column("checked_at", TS),
    sa.Column("result", json_type()),
)
"""What the fleet holds per (model version, line) for drift: a reference window an
operator pinned (``pin_start``..``pin_end``, NULL = the default first hours), and the
last verdict of the drift job (``drifted``, since ``changed_at``; ``result`` the last
report), so that an event is emitted once per crossing and the console shows a badge
without recomputing."""

cluster_leader = sa.Table(
    "cluster_leader",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("acquired_at", TS, nullable=False),
)
"""One row per leader-only role (``rollouts``): the fencing ``epoch`` of the current term,
raised by each replica that takes the lead; a rollout save checks it in its transaction."""

cluster_replicas = sa.Table(
    "cluster_replicas",
    metadata,
    sa.Column("replica_id", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("pid", sa.BigInteger, nullable=False),
    sa.Column("started_at", TS, nullable=False),
    sa.Column("seen_at", TS, nullable=False),
    sa.Column("leader", sa.Boolean, nullable=False),
    sa.Column("epoch", sa.BigInteger),
    sa.Column("info", json_type()),
)
"""Each replica's last report (every ``[cluster] report_s``): whether it leads, and
``info`` (ingest rate per worker, version) for ``fleet-server status``."""

audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("ts", TS, nullable=False),
    sa.Column("actor", sa.Text, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("result", sa.Text, nullable=False),
    sa.Column("detail", json_type(), nullable=False),
    sa.Index(None, "ts"),
    sa.Index(None, "actor", "ts"),
    sa.Index(None, "action", "ts"),
    sa.Index(None, "target", "ts"),
    sqlite_autoincrement=True,  # a seq is never used twice, not even after retention
)
"""Who changed what, when, from where, and how it ended (fleet_server/audit/): one row a
change, written in the change's own transaction (or after a refusal); the API has no
route that edits or deletes a row, retention prunes by age and count."""

# -- alerts (fleet_server.alerts, docs/alerts.md) -----------------------------------------

alerts = sa.Table(
    "alerts",
    metadata,
    sa.Column("alert_id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("rule", sa.Text, nullable=False),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("severity", sa.Text, nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("labels", json_type(), nullable=False),
    sa.Column("sites", json_type(), nullable=False),
    sa.Column("detail", json_type(), nullable=False),
    sa.Column("fired_at", TS, nullable=False),
    sa.Column("resolved_at", TS),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Index(None, "rule", "key"),
    sa.Index(None, "resolved_at"),
    sa.Index(None, "fired_at"),
    sqlite_autoincrement=True,  # an alert id is never used twice, not even after retention
)
"""One alert: a condition a rule found (``rule``, ``key``: what it is about), from when it
fired until it resolved (``resolved_at`` NULL while firing). The leader writes it in a
transaction fenced by its ``epoch``; at most one open alert per (rule, key)."""

alert_deliveries = sa.Table(
    "alert_deliveries",
    metadata,
    sa.Column("delivery_id", sa.Text, primary_key=True),
    sa.Column(
        "alert_id",
        sa.BigInteger().with_variant(sa.Integer, "sqlite"),
        sa.ForeignKey("alerts.alert_id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    sa.Column("event", sa.Text, nullable=False),
    sa.Column("webhook", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("next_at", TS, nullable=False),
    sa.Column("done_at", TS),
    sa.Column("last_status", sa.Integer),
    sa.Column("last_error", sa.Text, nullable=False),
    sa.Index(None, "state", "next_at"),
)
"""One POST owed to a webhook: an alert's ``firing`` or ``resolved`` event, written in the
transaction that fired or resolved it; ``pending`` until a 2xx (``delivered``) or
``[alerts.delivery] attempts`` failures (``dead``: the dead letters)."""

# -- remote actions (fleet_server.actions, docs/device-logs-and-actions.md) -----------------

device_actions = sa.Table(
    "device_actions",
    metadata,
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("device_id", sa.Text, nullable=False),
    sa.Column("counter", sa.BigInteger, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("params", json_type(), nullable=False),
    sa.Column("requested_by", sa.Text, nullable=False),
    sa.Column("requested_at", TS, nullable=False),
    sa.Column("expires_at", TS, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("detail", json_type(), nullable=False),
    sa.Column("answered_at", TS),
    sa.Column("chunks", sa.BigInteger, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("sha256", sa.Text, nullable=False),
    sa.UniqueConstraint("device_id", "counter"),
    sa.Index(None, "device_id", "requested_at"),
    sa.Index(None, "requested_at"),
)
"""One remote action an operator asked of a device (logs, restart, reload, diagnostics):
what was signed (``counter``: the device's action counter, ``expires_at``), who asked,
and the device's newest answer (``status``: pending until the device answers, then
accepted, running, ok, refused or failed; ``superseded`` when the device answered a
newer request without ever seeing this one; ``chunks``, ``bytes``, ``sha256``: what
the final answer says was sent)."""

action_chunks = sa.Table(
    "action_chunks",
    metadata,
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True),
    sa.Column("device_id", sa.Text, nullable=False),
    sa.Column("encoding", sa.Text, nullable=False),
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Column("received_at", TS, nullable=False),
    sa.Index(None, "received_at"),
)
"""What a remote action collected, in the device's chunks (log lines as UTF-8, the
diagnostics archive as its bytes), once each; pruned on a shorter budget than the
requests."""

action_counters = sa.Table(
    "action_counters",
    metadata,
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("counter", sa.BigInteger, nullable=False),
)
"""The last action counter signed for each device (never lowered, never pruned: a
counter is never signed twice for a device)."""
