"""``audit_log`` rows: written one a change, read newest first with filters.

A row holds ``actor`` (a user name, ``@operator-token`` for the operator's bearer token,
``anonymous`` before sign-in, ``<system user>@<host>`` for a local command), the role it
acted with, ``source`` (the client's address as the API saw it, after trusted proxies;
``cli`` for a local command), ``action`` (``rollout.pause``, ``user.add`` ...), ``target``
(``rollout:r-12``, ``device:cam-1``, ``user:ann`` ...; ``""`` when none), ``result``
(``ok``, ``refused``, ``failed``) and ``detail`` (a JSON object: the HTTP status, the
reason of a refusal, what the action named).
"""

from __future__ import annotations

import getpass
import json
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from fleet_server.db.tables import audit_log

log = logging.getLogger(__name__)

RESULTS = ("ok", "refused", "failed")
MAX_TEXT = 200
"""The longest actor, source, action or target kept (longer ones are cut)."""
MAX_DETAIL_BYTES = 4096
"""A detail object larger than this as JSON is replaced by a note saying so."""
MAX_QUERY = 1000


@dataclass(frozen=True)
class AuditEntry:
    """One row of the trail."""

    ts: float
    actor: str
    role: str
    source: str
    action: str
    target: str
    result: str
    detail: dict[str, Any] = field(default_factory=dict)
    seq: int = 0
    """0 until stored."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "actor": self.actor,
            "role": self.role,
            "source": self.source,
            "action": self.action,
            "target": self.target,
            "result": self.result,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class AuditFilter:
    """What :func:`query` returns: each set field must match (``action`` and ``target``
    match a whole name or, ending in ``*``, a prefix; ``actor`` and ``result`` match
    whole)."""

    actor: str | None = None
    action: str | None = None
    target: str | None = None
    result: str | None = None
    since: float | None = None
    until: float | None = None
    before_seq: int | None = None
    """Only rows older than this one (the next page)."""
    limit: int = 100


def _text(value: str) -> str:
    return "".join(ch for ch in str(value) if ch.isprintable())[:MAX_TEXT]


def _detail(detail: dict[str, Any]) -> dict[str, Any]:
    try:
        size = len(json.dumps(detail, default=str))
    except (TypeError, ValueError):
        return {"note": "the detail was not JSON"}
    if size > MAX_DETAIL_BYTES:
        return {"note": f"the detail ({size} bytes) was over {MAX_DETAIL_BYTES} bytes"}
    plain: dict[str, Any] = json.loads(json.dumps(detail, default=str))  # JSON types only
    return plain


def record(engine: Engine | sa.Connection, entry: AuditEntry) -> int:
    """Store ``entry`` (its texts cut to :data:`MAX_TEXT`); returns its ``seq``.

    ``engine`` may be a connection in a transaction, so a change and its row commit
    together.

    Raises:
        ValueError: ``entry.result`` is not one of :data:`RESULTS`.
        sqlalchemy.exc.SQLAlchemyError: the database refused the row.
    """
    if entry.result not in RESULTS:
        raise ValueError(f"audit result {entry.result!r} is not one of {', '.join(RESULTS)}")
    values = {
        "ts": entry.ts,
        "actor": _text(entry.actor),
        "role": _text(entry.role),
        "source": _text(entry.source),
        "action": _text(entry.action),
        "target": _text(entry.target),
        "result": entry.result,
        "detail": _detail(entry.detail),
    }
    stmt = sa.insert(audit_log).values(**values).returning(audit_log.c.seq)
    if isinstance(engine, sa.Connection):
        return int(engine.execute(stmt).scalar_one())
    with engine.begin() as conn:
        return int(conn.execute(stmt).scalar_one())


def local_actor() -> str:
    """``<system user>@<host>``: who ran a local command."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def record_local(
    engine: Engine,
    action: str,
    target: str,
    result: str = "ok",
    detail: dict[str, Any] | None = None,
) -> int:
    """Record a local command's change (``fleetctl users ...``): actor
    :func:`local_actor`, role ``local``, source ``cli``."""
    entry = AuditEntry(
        ts=time.time(),
        actor=local_actor(),
        role="local",
        source="cli",
        action=action,
        target=target,
        result=result,
        detail=detail or {},
    )
    return record(engine, entry)


def _match(column: sa.ColumnElement[str], value: str) -> sa.ColumnElement[bool]:
    if value.endswith("*"):
        prefix = value[:-1]
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return column.like(escaped + "%", escape="\\")
    return column == value


def query(engine: Engine, f: AuditFilter) -> list[AuditEntry]:
    """The rows matching ``f``, newest first, at most ``f.limit`` (1..:data:`MAX_QUERY`).

    Raises:
        ValueError: a limit out of range or an unknown result.
    """
    if not 1 <= f.limit <= MAX_QUERY:
        raise ValueError(f"limit must be 1..{MAX_QUERY}, not {f.limit}")
    if f.result is not None and f.result not in RESULTS:
        raise ValueError(f"result {f.result!r} is not one of {', '.join(RESULTS)}")
    t = audit_log
    where: list[sa.ColumnElement[bool]] = []
    if f.actor:
        where.append(t.c.actor == f.actor)
    if f.action:
        where.append(_match(t.c.action, f.action))
    if f.target:
        where.append(_match(t.c.target, f.target))
    if f.result:
        where.append(t.c.result == f.result)
    if f.since is not None:
        where.append(t.c.ts >= f.since)
    if f.until is not None:
        where.append(t.c.ts < f.until)
    if f.before_seq is not None:
        where.append(t.c.seq < f.before_seq)
    stmt = sa.select(t).where(*where).order_by(t.c.seq.desc()).limit(f.limit)
    with engine.connect() as conn:
        rows = conn.execute(stmt).mappings().all()
    return [
        AuditEntry(
            ts=float(r["ts"]),
            actor=r["actor"],
            role=r["role"],
            source=r["source"],
            action=r["action"],
            target=r["target"],
            result=r["result"],
            detail=dict(r["detail"] or {}),
            seq=int(r["seq"]),
        )
        for r in rows
    ]
