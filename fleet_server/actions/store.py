"""The fleet's record of remote actions: each request an operator made of a device
(``device_actions``), the device's answers folded into it, what the action collected
(``action_chunks``), and the last counter signed per device (``action_counters``).

- :func:`create` takes the device's next counter and stores the request in one write
  transaction, signing it in between (a request that can't be signed is not stored and
  its counter not used: the transaction is rolled back).
- :func:`store_answer` folds a device's answer in: ``accepted`` < ``running`` < a final
  one (``ok``, ``refused``, ``failed``); an answer never replaces one further on, and a
  final one is never replaced. An answer to a request names its device: a device can't
  answer another's. When a device answers a request, its older requests still
  ``pending`` are ``superseded`` (the retained topic held only the newest: it never saw
  them); an answer of its own to one of them later still wins.
- :func:`store_chunk` stores each chunk once.
- :func:`state` is what a request is now: ``expired`` when it is still pending past its
  expiry, else its status.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from agent.wire.actions import (
    ENCODING_BASE64,
    FINAL,
    STATUS_ACCEPTED,
    STATUS_RUNNING,
    ActionChunk,
    ActionResult,
)
from fleet_server.db._tx import Bind, reading, upsert, writing
from fleet_server.db.tables import action_chunks, action_counters, device_actions

PENDING = "pending"
SUPERSEDED = "superseded"
EXPIRED = "expired"
MAX_LIST = 500
MAX_CHUNKS = 65_536
"""The most chunks a request may bring: the device's largest ``[remote] max_bytes_kb``
(64 MiB) in its smallest chunks (1 KiB)."""
_RANK = {PENDING: 0, SUPERSEDED: 0, STATUS_ACCEPTED: 1, STATUS_RUNNING: 2}
_FINAL_RANK = 3


def _rank(status: str) -> int:
    return _FINAL_RANK if status in FINAL else _RANK.get(status, 0)


def new_request_id() -> str:
    """``act-`` and 20 hex digits (80 random bits)."""
    return f"act-{secrets.token_hex(10)}"


@dataclass(frozen=True)
class ActionRecord:
    """One request and the newest answer to it."""

    request_id: str
    device_id: str
    counter: int
    action: str
    params: dict[str, Any]
    requested_by: str
    requested_at: float
    expires_at: float
    status: str
    reason: str
    detail: dict[str, Any]
    answered_at: float | None
    chunks: int
    bytes: int
    sha256: str


def _record(row: Any) -> ActionRecord:
    m = row._mapping
    return ActionRecord(**{c.name: m[c.name] for c in device_actions.columns})


def state(record: ActionRecord, now: float) -> str:
    """What the request is now (``expired``: pending past its expiry)."""
    if record.status == PENDING and now >= record.expires_at:
        return EXPIRED
    return record.status


def _next_counter(conn: Connection, device_id: str) -> int:
    insert = upsert(conn, action_counters).values(device_id=device_id, counter=1)
    bumped = insert.on_conflict_do_update(
        index_elements=["device_id"], set_={"counter": action_counters.c.counter + 1}
    ).returning(action_counters.c.counter)
    return int(conn.execute(bumped).scalar_one())


def create(
    bind: Bind,
    *,
    device_id: str,
    action: str,
    params: dict[str, Any],
    requested_by: str,
    expires_at: float,
    sign: Callable[[int, str], bytes],
    now: float | None = None,
) -> tuple[ActionRecord, bytes]:
    """Store a new request for ``device_id`` with its next counter; ``sign(counter,
    request_id)`` makes the signed request (raising rolls everything back).

    Returns:
        The stored record and the signed request.
    """
    now = time.time() if now is None else now
    with writing(bind) as conn:
        counter = _next_counter(conn, device_id)
        request_id = new_request_id()
        signed = sign(counter, request_id)
        values: dict[str, Any] = {
            "request_id": request_id, "device_id": device_id, "counter": counter,
            "action": action, "params": params, "requested_by": requested_by,
            "requested_at": now, "expires_at": expires_at, "status": PENDING, "reason": "",
            "detail": {}, "answered_at": None, "chunks": 0, "bytes": 0, "sha256": "",
        }  # fmt: skip
        conn.execute(device_actions.insert().values(**values))
    return ActionRecord(**values), signed


def mark_failed(bind: Bind, request_id: str, reason: str, now: float | None = None) -> None:
    """A request the fleet could not send: ``failed`` with why (unless answered)."""
    with writing(bind) as conn:
        conn.execute(
            device_actions.update()
            .where(device_actions.c.request_id == request_id)
            .where(device_actions.c.status.in_((PENDING, SUPERSEDED)))
            .values(status="failed", reason=reason, answered_at=now or time.time())
        )


def get(bind: Bind, request_id: str) -> ActionRecord | None:
    with reading(bind) as conn:
        row = conn.execute(
            sa.select(device_actions).where(device_actions.c.request_id == request_id)
        ).first()
    return None if row is None else _record(row)


def list_for_device(bind: Bind, device_id: str, *, limit: int = 20) -> list[ActionRecord]:
    """The device's requests, newest first."""
    with reading(bind) as conn:
        rows = conn.execute(
            sa.select(device_actions)
            .where(device_actions.c.device_id == device_id)
            .order_by(device_actions.c.requested_at.desc(), device_actions.c.counter.desc())
            .limit(max(1, min(limit, MAX_LIST)))
        ).all()
    return [_record(r) for r in rows]


def store_answer(bind: Bind, device_id: str, answer: ActionResult, now: float | None = None) -> str:
    """Fold ``answer`` into its request: ``stored``, ``stale`` (an answer no further
    on than what is held) or ``unknown`` (no request of that id for that device)."""
    now = time.time() if now is None else now
    with writing(bind) as conn:
        row = conn.execute(
            sa.select(device_actions)
            .where(device_actions.c.request_id == answer.request_id)
            .where(device_actions.c.device_id == device_id)
        ).first()
        if row is None:
            return "unknown"
        held = _record(row)
        if held.status in FINAL or _rank(answer.status) < _rank(held.status):
            return "stale"
        values: dict[str, Any] = {
            "status": answer.status,
            "reason": answer.reason,
            "detail": dict(answer.detail),
            "answered_at": now,
        }
        if answer.status in FINAL:
            values |= {"chunks": answer.chunks, "bytes": answer.bytes, "sha256": answer.sha256}
        conn.execute(
            device_actions.update()
            .where(device_actions.c.request_id == held.request_id)
            .values(**values)
        )
        conn.execute(
            device_actions.update()
            .where(device_actions.c.device_id == device_id)
            .where(device_actions.c.counter < held.counter)
            .where(device_actions.c.status == PENDING)
            .values(
                status=SUPERSEDED,
                reason=f"the device answered {held.request_id}, a newer request, without "
                "seeing this one (the fleet keeps only the newest for a device)",
                answered_at=now,
            )
        )
    return "stored"


def chunk_bytes(chunk: ActionChunk) -> bytes:
    """The bytes a chunk carries.

    Raises:
        ValueError: base64 that does not decode.
    """
    if chunk.encoding == ENCODING_BASE64:
        try:
            return base64.b64decode(chunk.data, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"chunk {chunk.seq}: not base64: {exc}") from None
    return chunk.data.encode("utf-8")


def store_chunk(bind: Bind, device_id: str, chunk: ActionChunk, now: float | None = None) -> bool:
    """Store a chunk once; False when no request of that id is the device's, or the
    chunk is past what a request may bring (:data:`MAX_CHUNKS`, or the count its final
    answer gave): a device can't fill the database through its own request.

    Raises:
        ValueError: base64 that does not decode.
    """
    data = chunk_bytes(chunk)
    now = time.time() if now is None else now
    if chunk.seq >= MAX_CHUNKS:
        return False
    with writing(bind) as conn:
        held = conn.execute(
            sa.select(
                device_actions.c.device_id, device_actions.c.status, device_actions.c.chunks
            ).where(device_actions.c.request_id == chunk.request_id)
        ).first()
        if held is None or held.device_id != device_id:
            return False
        if held.status in FINAL and chunk.seq >= held.chunks:
            return False
        stmt = upsert(conn, action_chunks).values(
            request_id=chunk.request_id, seq=chunk.seq, device_id=device_id,
            encoding=chunk.encoding, data=data, received_at=now,
        )  # fmt: skip
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["request_id", "seq"]))
    return True


@dataclass(frozen=True)
class Received:
    """What the fleet holds of a request's chunks."""

    chunks: int
    bytes: int
    last_seq: int


def received(bind: Bind, request_id: str) -> Received:
    c = action_chunks.c
    with reading(bind) as conn:
        row = conn.execute(
            sa.select(
                sa.func.count(), sa.func.coalesce(sa.func.sum(sa.func.length(c.data)), 0),
                sa.func.coalesce(sa.func.max(c.seq), -1),
            ).where(c.request_id == request_id)
        ).one()  # fmt: skip
    return Received(int(row[0]), int(row[1]), int(row[2]))


def list_with_received(
    bind: Bind, device_id: str, *, limit: int = 20
) -> list[tuple[ActionRecord, Received]]:
    """The device's requests, newest first, each with what the fleet holds of its
    chunks: one statement (the console's device page)."""
    c = action_chunks.c
    got = (
        sa.select(
            c.request_id.label("rid"),
            sa.func.count().label("n"),
            sa.func.sum(sa.func.length(c.data)).label("size"),
            sa.func.max(c.seq).label("last"),
        )
        .where(c.device_id == device_id)
        .group_by(c.request_id)
        .subquery()
    )
    query = (
        sa.select(device_actions, got.c.n, got.c.size, got.c.last)
        .select_from(device_actions.outerjoin(got, got.c.rid == device_actions.c.request_id))
        .where(device_actions.c.device_id == device_id)
        .order_by(device_actions.c.requested_at.desc(), device_actions.c.counter.desc())
        .limit(max(1, min(limit, MAX_LIST)))
    )
    with reading(bind) as conn:
        rows = conn.execute(query).all()
    return [
        (
            _record(r),
            Received(int(r.n or 0), int(r.size or 0), -1 if r.last is None else int(r.last)),
        )
        for r in rows
    ]


def read_chunks(bind: Bind, request_id: str, *, after: int = -1) -> list[tuple[int, bytes]]:
    """``(seq, data)`` of the request's chunks after ``after``, in order."""
    c = action_chunks.c
    with reading(bind) as conn:
        rows = conn.execute(
            sa.select(c.seq, c.data)
            .where(c.request_id == request_id, c.seq > after)
            .order_by(c.seq)
        ).all()
    return [(int(r[0]), bytes(r[1])) for r in rows]


def read_all(engine: Engine, record: ActionRecord) -> bytes | None:
    """Every byte of a finished request's chunks, checked against what the device said
    it sent (count, length, sha256); None when some are missing (not arrived, or pruned)."""
    parts = read_chunks(engine, record.request_id)
    if [seq for seq, _ in parts] != list(range(record.chunks)):
        return None
    data = b"".join(d for _, d in parts)
    if len(data) != record.bytes or hashlib.sha256(data).hexdigest() != record.sha256:
        return None
    return data
