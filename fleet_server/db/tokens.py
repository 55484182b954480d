"""One-time enrollment tokens, and the devices still waiting to use one (pending: enrolled
by an operator, never connected). Only a token's hash is stored."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import sqlalchemy as sa

from fleet_server.db._tx import Bind, reading, upsert, writing
from fleet_server.db.devices import PROFILE_KEY
from fleet_server.db.errors import StorageError, TokenRejected
from fleet_server.db.tables import devices, enrollment_tokens


@dataclass(frozen=True)
class EnrollmentToken:
    """What a token enrolls: the device id, its labels and its hardware profile."""

    token_hash: str
    device_id: str
    labels: dict[str, str]
    profile: str
    created_at: float
    expires_at: float
    used_at: float | None = None


def hash_token(token: str) -> str:
    """The stored form of a token: its SHA-256 in hex (tokens are long and random)."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    bind: Bind,
    token_hash: str,
    device_id: str,
    *,
    labels: Mapping[str, str],
    profile: str,
    ttl_s: float,
    now: float | None = None,
) -> EnrollmentToken:
    """Store a token that enrolls ``device_id`` once within ``ttl_s`` seconds.

    Raises:
        StorageError: ``ttl_s`` is not positive, or a token with this hash exists.
    """
    if ttl_s <= 0:
        raise StorageError(f"enrollment token for '{device_id}'", f"ttl_s={ttl_s} is not > 0")
    created = time.time() if now is None else now
    token = EnrollmentToken(token_hash, device_id, dict(labels), profile, created, created + ttl_s)
    with writing(bind) as conn:
        stmt = (
            upsert(conn, enrollment_tokens)
            .values(
                token_hash=token.token_hash,
                device_id=token.device_id,
                labels=token.labels,
                profile=token.profile,
                created_at=token.created_at,
                expires_at=token.expires_at,
            )
            .on_conflict_do_nothing(index_elements=["token_hash"])
            .returning(enrollment_tokens.c.token_hash)
        )
        if conn.execute(stmt).first() is None:
            raise StorageError(
                f"enrollment token for '{device_id}'", "a token with this hash exists"
            )
    return token


def consume_token(bind: Bind, token_hash: str, *, now: float | None = None) -> EnrollmentToken:
    """Use the token: it succeeds once, atomically (one ``UPDATE``), before it expires.

    Raises:
        TokenRejected: the token is unknown, already used or expired.
    """
    used = time.time() if now is None else now
    t = enrollment_tokens
    stmt = (
        t.update()
        .where(t.c.token_hash == token_hash, t.c.used_at.is_(None), t.c.expires_at > used)
        .values(used_at=used)
        .returning(*t.c)
    )
    with writing(bind) as conn:
        row = conn.execute(stmt).first()
        if row is None:
            found = conn.execute(sa.select(t).where(t.c.token_hash == token_hash)).first()
    if row is not None:
        return EnrollmentToken(**row._asdict())
    if found is None:
        raise TokenRejected(token_hash, "unknown token")
    if found.used_at is not None:
        raise TokenRejected(token_hash, f"already used at {found.used_at:.0f}")
    raise TokenRejected(token_hash, f"expired at {found.expires_at:.0f}")


@dataclass(frozen=True)
class PendingDevice:
    """A device the operator enrolled (a token made) that never used its token: no
    certificate, no registry row, never connected. ``token_*`` are its newest unused
    token's; ``tokens`` counts its unused ones (expired ones too, until retention)."""

    device_id: str
    labels: dict[str, str]
    profile: str
    token_created_at: float
    token_expires_at: float
    tokens: int = 1

    def expired(self, now: float) -> bool:
        """Its newest token can no longer enroll it (a new one is needed)."""
        return self.token_expires_at <= now


def pending_devices(
    bind: Bind,
    selector: Mapping[str, str] | None = None,
    *,
    device_id: str | None = None,
) -> list[PendingDevice]:
    """The devices with an unused enrollment token and no registry row, by id (one
    query), matching every ``key=value`` of ``selector`` as the registry's listing does
    (``profile`` the profile, any other key a label of the newest token).

    A device that enrolled (even revoked since) is in the registry, so never here.
    """
    t = enrollment_tokens
    registered = sa.select(devices.c.device_id).where(devices.c.device_id == t.c.device_id)
    query = (
        sa.select(t.c.device_id, t.c.labels, t.c.profile, t.c.created_at, t.c.expires_at)
        .where(t.c.used_at.is_(None), ~registered.exists())
        .order_by(t.c.device_id, t.c.created_at.desc(), t.c.expires_at.desc())
    )
    if device_id is not None:
        query = query.where(t.c.device_id == device_id)
    with reading(bind) as conn:
        rows = list(conn.execute(query))
    found: dict[str, PendingDevice] = {}
    for d, labels, profile, created, expires in rows:
        seen = found.get(d)
        if seen is not None:
            found[d] = replace(seen, tokens=seen.tokens + 1)
            continue
        found[d] = PendingDevice(str(d), dict(labels or {}), str(profile), created, expires)
    return [p for p in found.values() if _matches(p, selector or {})]


def _matches(p: PendingDevice, selector: Mapping[str, str]) -> bool:
    return all(
        (p.profile if key == PROFILE_KEY else p.labels.get(key)) == value
        for key, value in selector.items()
    )
