"""Sign-in sessions kept in the fleet database.

The browser holds a random session id (32 bytes, URL-safe) in a cookie; the database
keeps only its SHA-256, so a copy of the database signs nobody in. Each session has a
CSRF token of its own, an idle expiry (``last_seen`` + idle time; ``last_seen`` is
written at most once a minute) and an absolute one (``expires_at``). An expired session
is deleted when it is next presented, and every sign-in removes all expired ones.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass, field

import sqlalchemy as sa

from fleet_server.auth.errors import AuthError
from fleet_server.auth.roles import Role, parse_role
from fleet_server.db._tx import Bind, reading, writing
from fleet_server.db.tables import user_sessions, users

log = logging.getLogger(__name__)

SESSION_BYTES = 32
CSRF_BYTES = 32
TOUCH_EVERY_S = 60.0
"""``last_seen`` is written when it is older than this: idle expiry is to within it."""
MAX_SESSIONS_PER_USER = 16
"""Beyond this the user's oldest sessions end (one user signing in in a loop)."""


@dataclass(frozen=True)
class Session:
    """A live session and its user's current role."""

    username: str
    role: Role
    csrf_token: str = field(repr=False)
    created_at: float
    last_seen: float
    expires_at: float


def hash_session_id(session_id: str) -> str:
    """The stored form of a session id: its SHA-256 in hex (ids are long and random)."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def purge_expired(bind: Bind, idle_s: float, *, now: float | None = None) -> int:
    """Delete every session past its absolute or idle expiry; how many."""
    at = time.time() if now is None else now
    s = user_sessions
    with writing(bind) as conn:
        done = conn.execute(
            s.delete().where(sa.or_(s.c.expires_at <= at, s.c.last_seen <= at - idle_s))
        )
    return int(done.rowcount)


def start_session(
    bind: Bind, username: str, role: Role, *, max_s: float, now: float | None = None
) -> tuple[str, Session]:
    """A new session for ``username`` lasting at most ``max_s``: (session id, session).
    The id is returned once; only its hash is stored.

    Raises:
        StorageError: the database can't be written.
    """
    at = time.time() if now is None else now
    session_id = secrets.token_urlsafe(SESSION_BYTES)
    session = Session(username, role, secrets.token_urlsafe(CSRF_BYTES), at, at, at + max_s)
    s = user_sessions
    with writing(bind) as conn:
        conn.execute(
            s.insert().values(
                session_hash=hash_session_id(session_id),
                username=username,
                csrf_token=session.csrf_token,
                created_at=at,
                last_seen=at,
                expires_at=session.expires_at,
            )
        )
        keep = (
            sa.select(s.c.session_hash)
            .where(s.c.username == username)
            .order_by(s.c.created_at.desc())
            .limit(MAX_SESSIONS_PER_USER)
        )
        conn.execute(s.delete().where(s.c.username == username, s.c.session_hash.not_in(keep)))
    return session_id, session


def find_session(
    bind: Bind, session_id: str, *, idle_s: float, now: float | None = None
) -> Session | None:
    """The live session of ``session_id``, or None (unknown, expired, idle too long, or
    its user disabled). An expired or idle session is deleted; a live one's
    ``last_seen`` is moved on (at most once every :data:`TOUCH_EVERY_S`)."""
    at = time.time() if now is None else now
    key = hash_session_id(session_id)
    s, u = user_sessions, users
    stmt = (
        sa.select(s, u.c.role, u.c.disabled)
        .join(u, u.c.username == s.c.username)
        .where(s.c.session_hash == key)
    )
    with reading(bind) as conn:
        row = conn.execute(stmt).first()
    if row is None:
        return None
    m = row._mapping
    last_seen, expires_at = float(m["last_seen"]), float(m["expires_at"])
    if m["disabled"] or at >= expires_at or at - last_seen >= idle_s:
        with writing(bind) as conn:
            conn.execute(s.delete().where(s.c.session_hash == key))
        return None
    try:
        role = parse_role(str(m["role"]))
    except AuthError as exc:
        log.warning("session of %r refused: %s", m["username"], exc)
        return None
    if at - last_seen >= TOUCH_EVERY_S:
        with writing(bind) as conn:
            conn.execute(
                s.update().where(s.c.session_hash == key, s.c.last_seen < at).values(last_seen=at)
            )
        last_seen = at
    return Session(
        username=str(m["username"]),
        role=role,
        csrf_token=str(m["csrf_token"]),
        created_at=float(m["created_at"]),
        last_seen=last_seen,
        expires_at=expires_at,
    )


def end_session(bind: Bind, session_id: str) -> bool:
    """Delete the session of ``session_id``; whether there was one."""
    s = user_sessions
    with writing(bind) as conn:
        done = conn.execute(s.delete().where(s.c.session_hash == hash_session_id(session_id)))
    return bool(done.rowcount)
