"""Storage of the quality records devices upload: shadow comparisons and drift buckets.

A shadow record is keyed by ``(device_id, decision_id)``: a second copy is a no-op.
A drift bucket is keyed by ``(device_id, model_name, model_version, line, source,
hour)`` and holds *totals* that only grow while the bucket is open on the device, so a
copy replaces the stored row only when its ``n`` is larger (a late redelivery of an
older copy never undoes a newer one; the same copy twice is a no-op). Rows are sorted
by key before writing so that concurrent batches lock in the same order (PostgreSQL).

The callers (ingest) have checked the device, the model version and the line
(:mod:`fleet_server.quality.facts`); these functions store what they are given.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from agent.wire.quality import HOUR_S, DriftHour, ShadowRecord
from fleet_server.db._tx import Bind, reading, upsert, writing
from fleet_server.db.errors import StorageError
from fleet_server.db.records import insert_new
from fleet_server.db.tables import drift_hours, shadow_results

MAX_LIST = 100_000
"""The most rows one list call returns."""


@dataclass(frozen=True)
class ShadowRow:
    """A stored shadow comparison; ``payload`` is the device's ShadowRecord as JSON."""

    device_id: str
    decision_id: str
    ts: float
    received_at: float
    line: str
    source: str
    live_model: str
    live_version: str
    live_outcome: str
    shadow_model: str
    shadow_version: str
    shadow_release: int | None
    shadow_outcome: str
    agree: bool
    payload: dict[str, Any]


@dataclass(frozen=True)
class DriftRow:
    """A stored drift bucket of one device: ``hour`` is its start, ``period_s`` its
    length; ``outcomes``, ``top_class`` and ``hist`` are counts (see DriftHour)."""

    device_id: str
    model_name: str
    model_version: str
    line: str
    source: str
    hour: int
    period_s: int
    n: int
    outcomes: dict[str, int]
    top_class: dict[str, int]
    hist: dict[str, list[int]]
    received_at: float


def shadow_row(
    device_id: str, record: ShadowRecord, received_at: float, line: str | None = None
) -> dict[str, Any]:
    """The ``shadow_results`` row of a device's record; ``line``: the device's enrolled
    line, which the row is filed under (the line the record names stays in its payload;
    None: the record's own, for callers that checked it)."""
    return {
        "device_id": device_id,
        "decision_id": record.decision_id,
        "ts": record.ts,
        "received_at": received_at,
        "line": record.line if line is None else line,
        "source": record.source,
        "live_model": record.live.model_name,
        "live_version": record.live.model_version,
        "live_outcome": record.live.outcome,
        "shadow_model": record.shadow.model_name,
        "shadow_version": record.shadow.model_version,
        "shadow_release": record.shadow.release,
        "shadow_outcome": record.shadow.outcome,
        "agree": record.agree,
        "payload": record.model_dump(mode="json"),
    }


def drift_row(device_id: str, hour: DriftHour, received_at: float) -> dict[str, Any]:
    """The ``drift_hours`` row of a device's bucket."""
    return {
        "device_id": device_id,
        "model_name": hour.model_name,
        "model_version": hour.model_version,
        "line": hour.line,
        "source": hour.source,
        "hour": hour.hour,
        "n": hour.n,
        "payload": {
            "period_s": hour.period_s,
            "outcomes": dict(hour.outcomes),
            "top_class": dict(hour.top_class),
            "hist": {k: list(v) for k, v in hour.hist.items()},
        },
        "received_at": received_at,
    }


def insert_shadow_records(
    bind: Bind,
    device_id: str,
    records: Iterable[ShadowRecord],
    *,
    now: float | None = None,
    line: str | None = None,
) -> int:
    """Store the device's shadow records not stored yet, filed under ``line`` when given
    (see :func:`shadow_row`); returns how many were new."""
    received = time.time() if now is None else now
    rows = (shadow_row(device_id, r, received, line) for r in records)
    return insert_new(bind, shadow_results, rows)


def upsert_drift_hours(
    bind: Bind, device_id: str, hours: Iterable[DriftHour], *, now: float | None = None
) -> int:
    """Store the device's drift buckets: new ones inserted, stored ones replaced when the
    copy counts more decisions (``n``); returns how many rows were written."""
    received = time.time() if now is None else now
    key = [c.name for c in drift_hours.primary_key.columns]
    unique: dict[tuple[Any, ...], dict[str, Any]] = {}
    for hour in hours:
        row = drift_row(device_id, hour, received)
        k = tuple(row[c] for c in key)
        if k not in unique or unique[k]["n"] < row["n"]:
            unique[k] = row
    if not unique:
        return 0
    ordered = [unique[k] for k in sorted(unique)]
    with writing(bind) as conn:
        insert = upsert(conn, drift_hours)
        stmt = insert.on_conflict_do_update(
            index_elements=key,
            set_={
                "n": insert.excluded.n,
                "payload": insert.excluded.payload,
                "received_at": insert.excluded.received_at,
            },
            where=insert.excluded.n > drift_hours.c.n,
        ).returning(drift_hours.c.device_id)
        return len(conn.execute(stmt, ordered).all())


def _check_limit(what: str, limit: int) -> None:
    if not 0 < limit <= MAX_LIST:
        raise StorageError(what, f"limit {limit} is not within 1..{MAX_LIST}")


def list_shadow_records(
    bind: Bind,
    *,
    device_id: str | None = None,
    shadow_model: str | None = None,
    shadow_version: str | None = None,
    line: str | None = None,
    agree: bool | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = 100,
) -> list[ShadowRow]:
    """Stored shadow records matching every filter given, newest first.

    Raises:
        StorageError: ``limit`` is not within 1..MAX_LIST.
    """
    _check_limit("shadow_results", limit)
    t = shadow_results
    where: list[sa.ColumnElement[bool]] = []
    for column, value in (
        (t.c.device_id, device_id),
        (t.c.shadow_model, shadow_model),
        (t.c.shadow_version, shadow_version),
        (t.c.line, line),
        (t.c.agree, agree),
    ):
        if value is not None:
            where.append(column == value)
    if since is not None:
        where.append(t.c.ts >= since)
    if until is not None:
        where.append(t.c.ts < until)
    query = (
        sa.select(t)
        .where(*where)
        .order_by(t.c.ts.desc(), t.c.device_id.desc(), t.c.decision_id.desc())
        .limit(limit)
    )
    with reading(bind) as conn:
        return [ShadowRow(**row._asdict()) for row in conn.execute(query)]


def _drift(row: sa.Row[Any]) -> DriftRow:
    payload = row.payload or {}
    return DriftRow(
        device_id=row.device_id,
        model_name=row.model_name,
        model_version=row.model_version,
        line=row.line,
        source=row.source,
        hour=int(row.hour),
        period_s=int(payload.get("period_s", HOUR_S)),
        n=int(row.n),
        outcomes=dict(payload.get("outcomes", {})),
        top_class=dict(payload.get("top_class", {})),
        hist={k: list(v) for k, v in payload.get("hist", {}).items()},
        received_at=float(row.received_at),
    )


def list_drift_hours(
    bind: Bind,
    *,
    model_name: str | None = None,
    model_version: str | None = None,
    line: str | None = None,
    device_id: str | None = None,
    since: int | None = None,
    until: int | None = None,
    limit: int = MAX_LIST,
) -> list[DriftRow]:
    """Stored drift buckets matching every filter given (``since`` <= hour <
    ``until``), oldest bucket first.

    Raises:
        StorageError: ``limit`` is not within 1..MAX_LIST.
    """
    _check_limit("drift_hours", limit)
    t = drift_hours
    where: list[sa.ColumnElement[bool]] = []
    for column, value in (
        (t.c.model_name, model_name),
        (t.c.model_version, model_version),
        (t.c.line, line),
        (t.c.device_id, device_id),
    ):
        if value is not None:
            where.append(column == value)
    if since is not None:
        where.append(t.c.hour >= since)
    if until is not None:
        where.append(t.c.hour < until)
    query = (
        sa.select(t)
        .where(*where)
        .order_by(t.c.hour, t.c.model_name, t.c.model_version, t.c.line, t.c.device_id, t.c.source)
        .limit(limit)
    )
    with reading(bind) as conn:
        return [_drift(row) for row in conn.execute(query)]


def drift_keys(bind: Bind) -> list[tuple[str, str, str]]:
    """Every (model_name, model_version, line) with stored drift buckets, sorted."""
    t = drift_hours
    query = (
        sa.select(t.c.model_name, t.c.model_version, t.c.line)
        .distinct()
        .order_by(t.c.model_name, t.c.model_version, t.c.line)
    )
    with reading(bind) as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(query)]


def bucket_span(
    bind: Bind,
    *,
    model_name: str | None = None,
    model_version: str | None = None,
    line: str | None = None,
) -> dict[tuple[str, str, str], tuple[int, int]]:
    """The first and the newest bucket's start per (model_name, model_version, line)
    matching the filters (the first: when that version reached that line)."""
    t = drift_hours
    where: list[sa.ColumnElement[bool]] = []
    for column, value in (
        (t.c.model_name, model_name),
        (t.c.model_version, model_version),
        (t.c.line, line),
    ):
        if value is not None:
            where.append(column == value)
    query = (
        sa.select(
            t.c.model_name,
            t.c.model_version,
            t.c.line,
            sa.func.min(t.c.hour),
            sa.func.max(t.c.hour),
        )
        .where(*where)
        .group_by(t.c.model_name, t.c.model_version, t.c.line)
        .order_by(t.c.model_name, t.c.model_version, t.c.line)
    )
    with reading(bind) as conn:
        return {(r[0], r[1], r[2]): (int(r[3]), int(r[4])) for r in conn.execute(query)}
