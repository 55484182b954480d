"""Messages the ingest set aside (malformed, oversized, wrongly typed), kept for a look.

Each row keeps the topic, the reason, the full size and at most ``cap`` bytes of the
payload; only the newest ``keep`` rows are kept, so a misbehaving device can't fill the disk.
The topic and the reason are stored with what a database can't hold as text (NUL, lone
surrogates) escaped, so that a quarantine row can always be written; the payload is
bytes and is kept as it came.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import sqlalchemy as sa

from fleet_server.db._tx import Bind, reading, writing
from fleet_server.db.errors import StorageError
from fleet_server.db.tables import quarantine as table

PAYLOAD_CAP = 64 * 1024
KEEP = 10_000


@dataclass(frozen=True)
class Quarantined:
    """A message set aside: ``payload`` is cut to the cap, ``size`` is the original size."""

    id: int
    received_at: float
    topic: str
    reason: str
    size: int
    payload: bytes


def storable(text: str) -> str:
    """``text`` with NUL and lone surrogates escaped (``\\x00``, ``\\udc80``)."""
    clean = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return clean.replace("\x00", "\\x00")


def quarantine(
    bind: Bind,
    topic: str,
    reason: str,
    payload: bytes,
    *,
    now: float | None = None,
    cap: int = PAYLOAD_CAP,
    keep: int = KEEP,
) -> int:
    """Set a message aside; returns its id. Rows older than the newest ``keep`` go.

    Raises:
        StorageError: ``cap`` is negative or ``keep`` is not positive.
    """
    if cap < 0 or keep < 1:
        raise StorageError("quarantine", f"cap={cap} must be >= 0 and keep={keep} >= 1")
    row = {
        "received_at": time.time() if now is None else now,
        "topic": storable(topic),
        "reason": storable(reason),
        "size": len(payload),
        "payload": bytes(payload[:cap]),
    }
    with writing(bind) as conn:
        new_id = int(conn.execute(sa.insert(table).values(row).returning(table.c.id)).scalar_one())
        conn.execute(table.delete().where(table.c.id <= new_id - keep))
    return new_id


def list_quarantine(bind: Bind, *, limit: int = 100) -> list[Quarantined]:
    """The newest messages set aside, newest first."""
    query = sa.select(table).order_by(table.c.id.desc()).limit(limit)
    with reading(bind) as conn:
        return [Quarantined(**row._asdict()) for row in conn.execute(query)]
