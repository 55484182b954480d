"""The drift job: the verdicts of :mod:`fleet_server.quality.drift` over the stored
buckets, the flag per (model version, line) and the ``drift`` events.

:func:`compute` reads, per (model version, line), its first and newest bucket, then
only the buckets of its two windows, and judges them (the API's answer: always fresh).
:func:`run_drift` (every ``[drift] interval_s`` in ``fleet-server serve``, and on demand
through ``POST /api/v1/drift/check``) computes every key and keeps the flag in
``drift_status``: it changes only on a *judged* verdict (a line that stopped keeps its
last verdict), and each change from not drifted to drifted writes one event of kind
:data:`DRIFT_EVENT` in the fleet's events table, under the pseudo device id
``line:<line>`` (as rollout notes are kept under their rollout id), its payload the
report. The console's badges read the flags (:func:`list_status`), never recompute.

Pinned reference windows live in the same table (:func:`pin_reference`,
:func:`unpin_reference`): an operator fixes the reference of one (model version, line),
e.g. after a camera was moved on purpose.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from fleet_server.db import store
from fleet_server.db._tx import Bind, reading, upsert, writing
from fleet_server.db.errors import StorageError
from fleet_server.db.store import EventRecord
from fleet_server.db.tables import drift_status
from fleet_server.quality.drift import (
    HOUR_S,
    Counts,
    DriftReport,
    DriftSettings,
    Key,
    Window,
    current_window,
    judge,
    merge,
    reference_window,
    sum_window,
)
from fleet_server.quality.store import bucket_span, list_drift_hours

log = logging.getLogger(__name__)

DRIFT_EVENT = "drift"
"""Kind of the event written when a (model version, line) starts to drift."""
_RUN_LOCK = threading.Lock()
"""One run at a time in this process (the loop and an on-demand check): each crossing
gets one event. (Two servers on one PostgreSQL could each see a crossing: run the job
in one of them.)"""


def line_source(line: str) -> str:
    """The pseudo device id drift events of ``line`` are kept under."""
    return f"line:{line}"


@dataclass(frozen=True)
class DriftStatus:
    """What the fleet holds for one (model version, line): the flag of the last judged
    verdict (since ``changed_at``), the last check, an operator's pinned reference."""

    model_name: str
    model_version: str
    line: str
    drifted: bool
    changed_at: float | None
    checked_at: float | None
    pin: tuple[float, float] | None
    pinned_by: str | None
    result: dict[str, Any] | None

    @property
    def key(self) -> Key:
        return (self.model_name, self.model_version, self.line)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "model_version": self.model_version,
            "line": self.line,
            "drifted": self.drifted,
            "changed_at": self.changed_at,
            "checked_at": self.checked_at,
            "pin": list(self.pin) if self.pin else None,
            "pinned_by": self.pinned_by,
        }


def _status(row: sa.Row[Any]) -> DriftStatus:
    pin = None
    if row.pin_start is not None and row.pin_end is not None:
        pin = (float(row.pin_start), float(row.pin_end))
    return DriftStatus(
        row.model_name, row.model_version, row.line, bool(row.drifted), row.changed_at,
        row.checked_at, pin, row.pinned_by, row.result,
    )  # fmt: skip


def list_status(
    bind: Bind,
    *,
    line: str | None = None,
    model_name: str | None = None,
    drifted: bool | None = None,
) -> list[DriftStatus]:
    """The held flags and pins matching every filter given, by key."""
    t = drift_status
    where: list[sa.ColumnElement[bool]] = []
    if line is not None:
        where.append(t.c.line == line)
    if model_name is not None:
        where.append(t.c.model_name == model_name)
    if drifted is not None:
        where.append(t.c.drifted == drifted)
    query = sa.select(t).where(*where).order_by(t.c.model_name, t.c.model_version, t.c.line)
    with reading(bind) as conn:
        return [_status(r) for r in conn.execute(query)]


def pin_reference(
    bind: Bind,
    model_name: str,
    model_version: str,
    line: str,
    start: float,
    end: float,
    *,
    by: str,
) -> None:
    """Fix the reference window of (model version, line) to ``[start, end)``.

    Raises:
        StorageError: ``start`` is not before ``end``, or a time is not finite.
    """
    if not (math.isfinite(start) and math.isfinite(end) and start < end):
        raise StorageError("drift_status", f"pin [{start}, {end}) is not a finite window")
    values = {"pin_start": start, "pin_end": end, "pinned_by": by}
    key = {"model_name": model_name, "model_version": model_version, "line": line}
    with writing(bind) as conn:
        stmt = upsert(conn, drift_status).values(**key, drifted=False, **values)
        conn.execute(stmt.on_conflict_do_update(index_elements=list(key), set_=values))


def unpin_reference(bind: Bind, model_name: str, model_version: str, line: str) -> bool:
    """Go back to the default reference window; whether a pin was held."""
    t = drift_status
    with writing(bind) as conn:
        result = conn.execute(
            t.update()
            .where(
                t.c.model_name == model_name,
                t.c.model_version == model_version,
                t.c.line == line,
                t.c.pin_start.is_not(None),
            )
            .values(pin_start=None, pin_end=None, pinned_by=None)
        )
        return bool(result.rowcount)


def compute(
    bind: Bind,
    settings: DriftSettings,
    now: float | None = None,
    *,
    model_name: str | None = None,
    model_version: str | None = None,
    line: str | None = None,
) -> list[DriftReport]:
    """The verdict of every (model version, line) matching the filters, by key."""
    now = time.time() if now is None else now
    pins = {s.key: s.pin for s in list_status(bind, line=line, model_name=model_name)}
    spans = bucket_span(bind, model_name=model_name, model_version=model_version, line=line)
    reports = []
    for key, (first, newest) in spans.items():
        reference = reference_window(float(first), settings, pins.get(key))
        current = current_window(reference, settings, now, float(newest))
        rows = []
        for window in (reference, current):
            if window.end > window.start:
                rows += list_drift_hours(
                    bind,
                    model_name=key[0],
                    model_version=key[1],
                    line=key[2],
                    since=math.ceil(window.start),
                    until=math.ceil(window.end),
                )
        buckets = merge(rows).get(key, {})
        ref, cur = sum_window(buckets, reference), sum_window(buckets, current)
        if reference.end > current.start:  # a pinned reference reaching into the current
            cur = Counts()
        if newest in buckets and current.end > current.start:  # shown: the bucket's end
            shown_end = min(now, newest + (buckets[newest].period_s or HOUR_S))
            current = Window(current.start, max(current.end, shown_end))
        reports.append(judge(key, reference, current, ref, cur, settings))
    return reports


@dataclass(frozen=True)
class DriftRun:
    """One run of the job: every report, and those that started to drift (an event each)."""

    reports: list[DriftReport]
    raised: list[DriftReport]


def run_drift(bind: Bind, settings: DriftSettings, now: float | None = None) -> DriftRun:
    """Judge every (model version, line), update the flags, write an event for each
    that crossed into drift."""
    with _RUN_LOCK:
        return _run(bind, settings, time.time() if now is None else now)


def _run(bind: Bind, settings: DriftSettings, now: float) -> DriftRun:
    reports = compute(bind, settings, now)
    raised = []
    with writing(bind) as conn:
        held = {s.key: s for s in list_status(conn)}
        for report in reports:
            status = held.get(report.key)
            was = status is not None and status.drifted
            drifted = report.drifted if report.judged else was
            changed = drifted != was
            values: dict[str, Any] = {"checked_at": now, "result": report.to_dict()}
            if changed or status is None:
                values |= {"drifted": drifted, "changed_at": now if changed else None}
            _save(conn, report.key, values)
            if drifted and not was:
                raised.append(report)
        if raised:
            store.insert_events(conn, [_event(r, now) for r in raised])
    for r in raised:
        log.warning("drift: %s %s on line %s: %s", r.model_name, r.model_version, r.line, r.reason)
    return DriftRun(reports, raised)


def _save(conn: sa.Connection, key: Key, values: dict[str, Any]) -> None:
    names = {"model_name": key[0], "model_version": key[1], "line": key[2]}
    insert = upsert(conn, drift_status).values(**names, **{"drifted": False, **values})
    conn.execute(insert.on_conflict_do_update(index_elements=list(names), set_=values))


def _event(report: DriftReport, now: float) -> EventRecord:
    event_id = f"{DRIFT_EVENT}:{report.model_name}:{report.model_version}:{report.line}:{now!r}"
    return EventRecord(line_source(report.line), event_id, now, DRIFT_EVENT, report.to_dict(), now)
