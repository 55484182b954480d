"""The fleet database's tables (SQLAlchemy Core), the same on SQLite and PostgreSQL.

Timestamps are Unix seconds (float). JSON columns are JSONB on PostgreSQL. Records
uploaded by devices carry ids generated on the device, and their primary keys make a
second copy of a record a no-op (see docs/fleet-storage.md). Users and their sign-in
sessions (only a hash of each session id is kept) belong to :mod:`fleet_server.auth`.
Changing a table here needs a new migration under ``migrations/versions``; a test
compares the two.
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
    sa.Column("health", json_type()),
    sa.Column("cert_serial", sa.Text),
    sa.Column("revoked", sa.Boolean, nullable=False),
)

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
        sa.Index(None, "device_id", "ts"),
    )


heartbeats = _record_table("heartbeats")
telemetry = _record_table("telemetry")

decisions = sa.Table(
    "decisions",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("device_id", sa.Text, nullable=False),
    sa.Column("ts", TS, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("model_name", sa.Text, nullable=False),
    sa.Column("model_version", sa.Text, nullable=False),
    sa.Column("payload", json_type(), nullable=False),
    sa.Index(None, "device_id", "ts"),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("event_id", sa.Text, primary_key=True),
    sa.Column("ts", TS, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("payload", json_type(), nullable=False),
    sa.Index(None, "device_id", "ts"),
    sa.Index(None, "kind", "ts"),
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
