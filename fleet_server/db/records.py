"""Records devices upload: heartbeats, telemetry, decisions and events.

Every record carries an id made on the device, and inserting is idempotent: a record
already stored (broker redelivery, agent retry, two ingest workers) is skipped, and the
insert functions return how many rows were new. Rows are sorted by key before they are
written so that concurrent overlapping batches take row locks in the same order (no
deadlock on PostgreSQL). Every key is led by the device id: a decision is
``(device_id, id)``, so a device can't take another device's ids. ``received_at`` is the
server's time of storing a record (``None`` for rows from before migration 0005);
``ts`` is the device's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from fleet_server.db._tx import Bind, reading, upsert, writing
from fleet_server.db.errors import StorageError
from fleet_server.db.tables import decisions, events, heartbeats, quarantine, telemetry

MAX_LIST = 10_000
"""The most rows one list call returns."""

TABLES: dict[str, sa.Table] = {
    t.name: t for t in (heartbeats, telemetry, decisions, events, quarantine)
}


@dataclass(frozen=True)
class Record:
    """A heartbeat or a telemetry sample: ``record_id`` is unique per device."""

    device_id: str
    record_id: str
    ts: float
    payload: dict[str, Any]
    received_at: float | None = None


@dataclass(frozen=True)
class DecisionRecord:
    """An uploaded decision: ``id`` is the device's UUIDv7 of the decision; ``station``,
    ``part_id`` and ``deadline_missed`` are the row's station fields (empty and false
    for a free-running pipeline), kept in columns of their own to be filtered on."""

    id: str
    device_id: str
    ts: float
    source: str
    outcome: str
    model_name: str
    model_version: str
    payload: dict[str, Any]
    received_at: float | None = None
    station: str = ""
    part_id: str = ""
    deadline_missed: bool = False


@dataclass(frozen=True)
class EventRecord:
    """An event (install progress, alarm, ...): ``event_id`` is unique per device."""

    device_id: str
    event_id: str
    ts: float
    kind: str
    payload: dict[str, Any]
    received_at: float | None = None


def insert_new(bind: Bind, table: sa.Table, rows: Iterable[dict[str, Any]]) -> int:
    """Insert the rows whose primary key ``table`` does not hold; how many were new."""
    key = [c.name for c in table.primary_key.columns]
    unique: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        unique.setdefault(tuple(row[k] for k in key), row)
    if not unique:
        return 0
    ordered = [unique[k] for k in sorted(unique)]
    with writing(bind) as conn:
        stmt = (
            upsert(conn, table)
            .on_conflict_do_nothing(index_elements=key)
            .returning(*(table.c[k] for k in key))
        )
        return len(conn.execute(stmt, ordered).all())


def _record_rows(rows: Iterable[Record]) -> Iterable[dict[str, Any]]:
    return (
        {
            "device_id": r.device_id,
            "record_id": r.record_id,
            "ts": r.ts,
            "payload": r.payload,
            "received_at": r.received_at,
        }
        for r in rows
    )


def insert_heartbeats(bind: Bind, rows: Iterable[Record]) -> int:
    """Store the heartbeats not stored yet; returns how many were new."""
    return insert_new(bind, heartbeats, _record_rows(rows))


def insert_telemetry(bind: Bind, rows: Iterable[Record]) -> int:
    """Store the telemetry samples not stored yet; returns how many were new."""
    return insert_new(bind, telemetry, _record_rows(rows))


def insert_decisions(bind: Bind, rows: Iterable[DecisionRecord]) -> int:
    """Store the decisions not stored yet; returns how many were new."""
    return insert_new(
        bind,
        decisions,
        (
            {
                "id": r.id,
                "device_id": r.device_id,
                "ts": r.ts,
                "source": r.source,
                "outcome": r.outcome,
                "model_name": r.model_name,
                "model_version": r.model_version,
                "payload": r.payload,
                "received_at": r.received_at,
                "station": r.station,
                "part_id": r.part_id,
                "deadline_missed": r.deadline_missed,
            }
            for r in rows
        ),
    )


def insert_events(bind: Bind, rows: Iterable[EventRecord]) -> int:
    """Store the events not stored yet; returns how many were new."""
    return insert_new(
        bind,
        events,
        (
            {
                "device_id": r.device_id,
                "event_id": r.event_id,
                "ts": r.ts,
                "kind": r.kind,
                "payload": r.payload,
                "received_at": r.received_at,
            }
            for r in rows
        ),
    )


def _recent(
    bind: Bind, table: sa.Table, where: Sequence[sa.ColumnElement[bool]], limit: int
) -> list[sa.Row[Any]]:
    if not 0 < limit <= MAX_LIST:
        raise StorageError(table.name, f"limit {limit} is not within 1..{MAX_LIST}")
    order = [table.c.ts.desc(), *(c.desc() for c in table.primary_key.columns)]
    query = sa.select(table).where(*where).order_by(*order).limit(limit)
    with reading(bind) as conn:
        return list(conn.execute(query))


def _filters(
    table: sa.Table, device_id: str | None, since: float | None
) -> list[sa.ColumnElement[bool]]:
    where: list[sa.ColumnElement[bool]] = []
    if device_id is not None:
        where.append(table.c.device_id == device_id)
    if since is not None:
        where.append(table.c.ts >= since)
    return where


def list_heartbeats(
    bind: Bind, device_id: str, *, since: float | None = None, limit: int = 100
) -> list[Record]:
    """The device's newest heartbeats (at or after ``since``), newest first."""
    rows = _recent(bind, heartbeats, _filters(heartbeats, device_id, since), limit)
    return [Record(**r._asdict()) for r in rows]


def list_telemetry(
    bind: Bind, device_id: str, *, since: float | None = None, limit: int = 100
) -> list[Record]:
    """The device's newest telemetry samples (at or after ``since``), newest first."""
    rows = _recent(bind, telemetry, _filters(telemetry, device_id, since), limit)
    return [Record(**r._asdict()) for r in rows]


def list_decision_records(
    bind: Bind, device_id: str | None = None, *, since: float | None = None, limit: int = 100
) -> list[DecisionRecord]:
    """The newest decisions as stored (of one device, at or after ``since``), newest
    first, payload included: what ingest wrote. The review's pages of decisions, with
    filters, cursors and reviews, are :func:`fleet_server.review.list_decisions`."""
    rows = _recent(bind, decisions, _filters(decisions, device_id, since), limit)
    return [DecisionRecord(**r._asdict()) for r in rows]


def list_events(
    bind: Bind,
    device_id: str | None = None,
    *,
    kind: str | None = None,
    since: float | None = None,
    limit: int = 100,
) -> list[EventRecord]:
    """The newest events (of one device, of one kind, at or after ``since``), newest first."""
    where = _filters(events, device_id, since)
    if kind is not None:
        where.append(events.c.kind == kind)
    return [EventRecord(**r._asdict()) for r in _recent(bind, events, where, limit)]


def count_records(bind: Bind, table: str, device_id: str | None = None) -> int:
    """How many rows ``table`` (heartbeats, telemetry, decisions, events, quarantine)
    holds, of one device when ``device_id`` is given (not for quarantine).

    Raises:
        StorageError: ``table`` is not one of those.
    """
    t = TABLES.get(table)
    if t is None:
        raise StorageError(table, f"not a record table (one of {sorted(TABLES)})")
    query = sa.select(sa.func.count()).select_from(t)
    if device_id is not None:
        if "device_id" not in t.c:
            raise StorageError(table, "has no device_id column")
        query = query.where(t.c.device_id == device_id)
    with reading(bind) as conn:
        return int(conn.execute(query).scalar_one())
