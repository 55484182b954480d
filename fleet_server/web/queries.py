"""The console's reads of the fleet database: one query per page section, the same SQL
on SQLite and PostgreSQL (SQLAlchemy Core on :mod:`fleet_server.db.tables`).

A page with 1,000 devices makes a fixed number of queries, never one per device: the
overview reads the device rows in one query (filters in SQL) and the site/line choices
in another; the device page reads its health reports, events, newest state and decision
counts in one query each; the bundles page counts installations with one grouped query.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from agent.wire.messages import EVENT_INSTALL
from fleet_server.db.store import Device, EventRecord
from fleet_server.db.tables import decisions, devices, events, telemetry
from fleet_server.db.tokens import PendingDevice, pending_devices

MAX_HEALTH_ROWS = 20_000
"""Health reports read for one device page (the newest, when a range holds more)."""
MAX_EVENTS = 50
HEALTH_PREFIX = "health:"
"""Record ids of health reports in the telemetry table (``<kind>:<seq>:<ts>``)."""
STATE_KIND = "state"

_DEVICE_COLUMNS = [c for c in devices.c if c.name not in ("cert_serial",)]


@dataclass(frozen=True)
class DeviceFilter:
    """What the fleet overview shows: every field optional."""

    site: str = ""
    line: str = ""
    online: bool | None = None
    q: str = ""


def _label(key: str) -> sa.ColumnElement[str]:
    label: sa.ColumnElement[str] = devices.c.labels[key].as_string()
    return label


def overview_devices(engine: Engine, f: DeviceFilter) -> list[Device]:
    """The devices matching ``f``, ordered by site, line and id (one query)."""
    query = sa.select(*_DEVICE_COLUMNS).order_by(
        sa.func.coalesce(_label("site"), ""),
        sa.func.coalesce(_label("line"), ""),
        devices.c.device_id,
    )
    if f.site:
        query = query.where(_label("site") == f.site)
    if f.line:
        query = query.where(_label("line") == f.line)
    if f.online is not None:
        query = query.where(devices.c.online.is_(f.online))
    if f.q:
        query = query.where(
            sa.or_(
                devices.c.device_id.icontains(f.q, autoescape=True),
                sa.cast(devices.c.labels, sa.Text).icontains(f.q, autoescape=True),
                devices.c.profile.icontains(f.q, autoescape=True),
                devices.c.agent_version.icontains(f.q, autoescape=True),
                devices.c.active_bundle.icontains(f.q, autoescape=True),
            )
        )
    with engine.connect() as conn:
        return [Device(**row._asdict()) for row in conn.execute(query)]


def pending(engine: Engine, f: DeviceFilter) -> list[PendingDevice]:
    """The pending devices (enrolled, never connected) matching ``f``, by id (one query):
    none when ``f`` asks for online devices."""
    if f.online:
        return []
    selector = {k: v for k, v in (("site", f.site), ("line", f.line)) if v}
    found = pending_devices(engine, selector)
    if not f.q:
        return found
    q = f.q.casefold()
    return [
        p
        for p in found
        if any(q in text.casefold() for text in (p.device_id, p.profile, *p.labels.values()))
        or any(q in k.casefold() for k in p.labels)
    ]


def sites_and_lines(engine: Engine) -> list[tuple[str, str]]:
    """Every (site, line) pair the registry's labels name ('' where a label is missing)."""
    site = sa.func.coalesce(_label("site"), "")
    line = sa.func.coalesce(_label("line"), "")
    query = sa.select(site, line).distinct().order_by(site, line)
    with engine.connect() as conn:
        return [(str(s), str(ln)) for s, ln in conn.execute(query)]


MAX_CHOICES = 2000
"""Device ids offered in a filter's list of choices at most (any id can still be typed)."""


def filter_choices(engine: Engine) -> tuple[list[str], list[str]]:
    """The device ids (the first :data:`MAX_CHOICES`) and the bundle versions the devices
    run or ran before, for a filter's lists of choices: read from the registry, never from
    the decisions (one small query each)."""
    ids = sa.select(devices.c.device_id).order_by(devices.c.device_id).limit(MAX_CHOICES)
    versions = sa.union(
        sa.select(devices.c.active_version.label("v")).where(devices.c.active_version.isnot(None)),
        sa.select(devices.c.previous_version.label("v")).where(
            devices.c.previous_version.isnot(None)
        ),
    ).subquery()
    with engine.connect() as conn:
        found = [str(d) for (d,) in conn.execute(ids)]
        known = sorted(str(v) for (v,) in conn.execute(sa.select(versions.c.v)))
    return found, known


def health_reports(
    engine: Engine, device_id: str, start: float, end: float
) -> tuple[list[tuple[float, dict[str, Any]]], bool]:
    """The device's health reports in [start, end], oldest first, and whether the range
    held more than :data:`MAX_HEALTH_ROWS` (then the newest are returned)."""
    t = telemetry
    query = (
        sa.select(t.c.ts, t.c.payload)
        .where(
            t.c.device_id == device_id,
            t.c.ts >= start,
            t.c.ts <= end,
            t.c.record_id.startswith(HEALTH_PREFIX, autoescape=True),
        )
        .order_by(t.c.ts.desc())
        .limit(MAX_HEALTH_ROWS + 1)
    )
    with engine.connect() as conn:
        rows = [(float(ts), p) for ts, p in conn.execute(query) if isinstance(p, dict)]
    more = len(rows) > MAX_HEALTH_ROWS
    return rows[:MAX_HEALTH_ROWS][::-1], more


def recent_events(engine: Engine, device_id: str, limit: int = MAX_EVENTS) -> list[EventRecord]:
    """The device's newest events other than reported states, newest first, each once.

    An install report reaches the fleet twice: as an ``install`` event through the
    device's outbox and as its retained ``install/state`` message (stored as an
    ``install`` event with an id made from its content). Both carry the same report
    (its ``at`` makes every report distinct), so an install event whose payload equals
    a newer one's is that same report and is left out; other kinds are shown as stored
    (an alarm may repeat word for word). At most every record is doubled, so twice
    ``limit`` rows are read to fill ``limit``.
    """
    query = (
        sa.select(events)
        .where(events.c.device_id == device_id, events.c.kind != STATE_KIND)
        .order_by(events.c.ts.desc(), events.c.event_id.desc())
        .limit(2 * limit)
    )
    with engine.connect() as conn:
        rows = [EventRecord(**row._asdict()) for row in conn.execute(query)]
    seen: set[tuple[str, str]] = set()
    out: list[EventRecord] = []
    for e in rows:
        if e.kind == EVENT_INSTALL:
            key = (e.kind, json.dumps(e.payload, sort_keys=True, default=str))
            if key in seen:
                continue
            seen.add(key)
        out.append(e)
    return out[:limit]


def newest_state(engine: Engine, device_id: str) -> dict[str, Any] | None:
    """The newest reported state the device sent (its slots: active, previous)."""
    query = (
        sa.select(events.c.payload)
        .where(events.c.device_id == device_id, events.c.kind == STATE_KIND)
        .order_by(events.c.ts.desc())
        .limit(1)
    )
    with engine.connect() as conn:
        payload = conn.execute(query).scalar()
    return payload if isinstance(payload, dict) else None


def _bucket(conn: Connection, column: sa.ColumnElement[float], start: float, width: float) -> Any:
    offset = (column - start) / width
    if conn.dialect.name == "postgresql":
        return sa.cast(sa.func.floor(offset), sa.Integer)
    return sa.cast(offset, sa.Integer)  # SQLite truncates; offsets here are >= 0


def decisions_by_outcome(
    engine: Engine, device_id: str, start: float, end: float, buckets: int
) -> tuple[list[float], dict[str, list[int]]]:
    """Bucket edges over [start, end] and the device's decision count per outcome in
    each bucket (one grouped query on the ``(device_id, ts)`` index)."""
    width = max(1.0, (end - start) / buckets)
    edges = [start + i * width for i in range(buckets + 1)]
    d = decisions
    with engine.connect() as conn:
        b = _bucket(conn, d.c.ts, start, width).label("b")
        query = (
            sa.select(b, d.c.outcome, sa.func.count())
            .where(d.c.device_id == device_id, d.c.ts >= start, d.c.ts < end)
            .group_by(b, d.c.outcome)
        )
        rows = list(conn.execute(query))
    counts: dict[str, list[int]] = {}
    for index, outcome, n in rows:
        if 0 <= int(index) < buckets:
            counts.setdefault(str(outcome), [0] * buckets)[int(index)] += int(n)
    return edges, counts


def decision_outputs(engine: Engine, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """The ``outputs`` of each decision of a list page, by (device id, decision id): ids
    are per device (one query on the ids, the pairs kept)."""
    if not keys:
        return {}
    wanted = set(keys)
    c = decisions.c
    query = sa.select(c.device_id, c.id, c.payload["outputs"]).where(
        c.id.in_(sorted({i for _, i in wanted}))
    )
    with engine.connect() as conn:
        found = {(str(d), str(i)): o for d, i, o in conn.execute(query)}
    return {k: v for k, v in found.items() if k in wanted}


@dataclass(frozen=True)
class Installed:
    """Where one bundle release is installed: per (site, line), active and previous."""

    active: Mapping[tuple[str, str], int]
    previous: Mapping[tuple[str, str], int]

    @property
    def active_total(self) -> int:
        return sum(self.active.values())

    @property
    def previous_total(self) -> int:
        return sum(self.previous.values())


def installations(engine: Engine) -> dict[tuple[str, int], Installed]:
    """Device counts per bundle release, slot (active or previous), site and line (one
    grouped query)."""
    site = sa.func.coalesce(_label("site"), "").label("site")
    line = sa.func.coalesce(_label("line"), "").label("line")
    parts = []
    for slot, name, release in (
        ("active", devices.c.active_bundle, devices.c.active_release),
        ("previous", devices.c.previous_bundle, devices.c.previous_release),
    ):
        parts.append(
            sa.select(sa.literal(slot).label("slot"), name.label("bundle"),
                      release.label("release"), site, line, sa.func.count().label("n"))
            .where(name.is_not(None), release.is_not(None), devices.c.revoked.is_(False))
            .group_by(name, release, site, line)
        )  # fmt: skip
    out: dict[tuple[str, int], dict[str, dict[tuple[str, str], int]]] = {}
    with engine.connect() as conn:
        for slot, bundle, release, s, ln, n in conn.execute(sa.union_all(*parts)):
            key = (str(bundle), int(release))
            out.setdefault(key, {"active": {}, "previous": {}})[str(slot)][(str(s), str(ln))] = int(
                n
            )
    return {k: Installed(v["active"], v["previous"]) for k, v in out.items()}
