"""The ingest sink over the fleet database (:mod:`fleet_server.db.store`).

Every ``store_*`` call is one transaction. Records are inserted idempotently (the device's
ids are the keys), so redelivery, agent retries and several workers on one shared
subscription store each record once; the counts returned are rows actually inserted.
Besides the records:

- every record gets ``received_at``, the server's clock when it is stored;
- heartbeats move each device's ``last_seen`` forward to the receive time (never to a
  device's clock: a far-future heartbeat can't pin it) and mark it online;
- health reports also become the device's ``health`` (the newest by ``ts`` wins);
- a reported state updates the device row (agent version, active and previous bundle,
  online, last seen at the receive time) unless a newer state is held; the profile and
  labels the device reports go to ``reported_profile`` and ``reported_labels`` only:
  the fleet's ``profile`` and ``labels`` (enrollment, operators) are never taken from a
  device. Each state is also kept as an event of kind ``state`` (id ``state:<ts>``),
  which is how a newer state is told from an older one arriving late through another
  worker; a state without ``ts`` (the last will) only sets ``online``.

Quality records (:mod:`fleet_server.ingest.quality`) go to ``shadow_results`` (once)
and ``drift_hours`` (upserted with the larger totals) through
:mod:`fleet_server.quality.store`. :meth:`SqlSink.known_models` says which model
versions the fleet knows for a device: a version known before (kept in memory, bounded)
or one the fleet recorded as the device's (:mod:`fleet_server.quality.facts`). Lines are
the fleet's: a shadow record is filed under its device's enrolled line, and a drift
bucket naming another line is refused (ingest quarantines it with the reason).

Device times reach this sink already bounded (:mod:`fleet_server.ingest.clock`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from agent.wire.jpeg import jpeg_size
from agent.wire.messages import (
    DecisionRow,
    Event,
    Health,
    Heartbeat,
    ReportedState,
    Telemetry,
    ThumbnailUpload,
)
from fleet_server.db import store
from fleet_server.db.store import DecisionRecord, EventRecord, ImageRecord, Record
from fleet_server.db.tables import devices, events
from fleet_server.ingest.quality import DriftItem, ModelRef, ShadowItem, foreign_line_reason
from fleet_server.quality import store as quality_store
from fleet_server.quality.facts import enrolled_lines, recorded_version

log = logging.getLogger(__name__)

STATE_EVENT = "state"
KNOWN_CACHE = 100_000
"""How many known (device, model, version) a sink remembers (then it starts afresh)."""
"""Kind of the events that keep the history of reported states."""


CONNECTION_EVENT = "connection"
"""Kind of the events that say a device went offline or came back (``{"online": bool,
"message": ...}``, at the server's time of noticing)."""


def _connection_event(device_id: str, online: bool, now: float) -> EventRecord:
    message = "came back online" if online else "went offline (its connection dropped)"
    return EventRecord(
        device_id,
        f"{CONNECTION_EVENT}:{now!r}:{int(online)}",
        now,
        CONNECTION_EVENT,
        {"online": online, "message": message},
        now,
    )


def _back_online(conn: Connection, seen: Collection[str], now: float) -> None:
    """A came-back event for each of ``seen`` held offline (a heartbeat batch: checked
    before they are marked online)."""
    if not seen:
        return
    back = conn.execute(
        sa.select(devices.c.device_id).where(
            devices.c.device_id.in_(sorted(seen)), devices.c.online.is_(False)
        )
    ).scalars()
    records = [_connection_event(device_id, True, now) for device_id in back]
    if records:
        store.insert_events(conn, records)


def _connection_changed(conn: Connection, device_id: str, online: bool, now: float) -> None:
    """An event when the device's ``online`` flips (checked before the row is updated)."""
    held = conn.execute(
        sa.select(devices.c.online).where(devices.c.device_id == device_id)
    ).scalar_one_or_none()
    if held is None or bool(held) == online:
        return
    store.insert_events(conn, [_connection_event(device_id, online, now)])


def state_event_id(ts: float) -> str:
    """The event id of the state reported at ``ts`` (the same on every delivery)."""
    return f"{STATE_EVENT}:{ts!r}"


def _records(rows: Iterable[Heartbeat | Health | Telemetry], received_at: float) -> list[Record]:
    return [
        Record(r.device_id, r.record_id, r.ts, r.model_dump(mode="json"), received_at) for r in rows
    ]


def _newest_by_device(rows: Iterable[Heartbeat | Health]) -> dict[str, Heartbeat | Health]:
    newest: dict[str, Heartbeat | Health] = {}
    for row in rows:
        held = newest.get(row.device_id)
        if held is None or row.ts > held.ts:
            newest[row.device_id] = row
    return newest


_HEALTH_UPDATE = (
    devices.update()
    .where(
        devices.c.device_id == sa.bindparam("id", type_=sa.Text),
        sa.or_(
            devices.c.health.is_(None),
            sa.func.coalesce(devices.c.health["ts"].as_float(), 0.0)
            <= sa.bindparam("ts", type_=sa.Double),
        ),
    )
    .values(health=sa.bindparam("health", type_=devices.c.health.type))
)


class SqlSink:
    """A :class:`~fleet_server.ingest.sink.Sink` that writes to the fleet database.

    Thread-safe as the engine is: several ingest workers may share one sink (and one
    engine), or each have its own over the same database.
    """

    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self._known: set[ModelRef] = set()
        self._known_lock = threading.Lock()

    def store_heartbeats(self, rows: Sequence[Heartbeat]) -> int:
        """Insert the heartbeats not stored yet and touch their devices; how many new."""
        if not rows:
            return 0
        now = self.clock()
        seen = dict.fromkeys(_newest_by_device(rows), now)
        with store.write_transaction(self.engine) as conn:
            inserted = store.insert_heartbeats(conn, _records(rows, now))
            _back_online(conn, seen, now)
            store.touch_devices(conn, seen)
        return inserted

    def store_health(self, rows: Sequence[Health]) -> int:
        """Insert the health reports not stored yet (in ``telemetry``, ids ``health:…``)
        and keep each device's newest as its ``health``; how many new."""
        if not rows:
            return 0
        params = [
            {"id": d, "ts": r.ts, "health": r.model_dump(mode="json")}
            for d, r in sorted(_newest_by_device(rows).items())
        ]
        with store.write_transaction(self.engine) as conn:
            inserted = store.insert_telemetry(conn, _records(rows, self.clock()))
            conn.execute(_HEALTH_UPDATE, params)
        return inserted

    def store_telemetry(self, rows: Sequence[Telemetry]) -> int:
        """Insert the telemetry samples not stored yet; how many new."""
        if not rows:
            return 0
        return store.insert_telemetry(self.engine, _records(rows, self.clock()))

    def store_decisions(self, rows: Sequence[DecisionRow]) -> int:
        """Insert the decision rows not stored yet; how many new."""
        if not rows:
            return 0
        now = self.clock()
        records = [
            DecisionRecord(
                id=r.id,
                device_id=r.device_id,
                ts=r.decision_time,
                source=r.source,
                outcome=r.outcome,
                model_name=r.model_name,
                model_version=r.model_version,
                payload=r.model_dump(mode="json"),
                received_at=now,
                station=r.station,
                part_id=r.part_id,
                deadline_missed=r.deadline_missed,
            )
            for r in rows
        ]
        return store.insert_decisions(self.engine, records)

    def store_thumbnails(self, rows: Sequence[ThumbnailUpload]) -> int:
        """Insert the decision thumbnails not stored yet; how many new."""
        if not rows:
            return 0
        return store.insert_images(self.engine, [_image_record(r) for r in rows])

    def store_events(self, rows: Sequence[Event]) -> int:
        """Insert the events not stored yet; how many new. The stored payload is the
        event's ``payload`` (fields of the message this code does not know go under
        ``"_message"``)."""
        if not rows:
            return 0
        now = self.clock()
        return store.insert_events(self.engine, [_event_record(e, now) for e in rows])

    def store_shadow(self, rows: Sequence[ShadowItem]) -> int:
        """Insert the shadow records not stored yet; how many new."""
        if not rows:
            return 0
        now = self.clock()
        with store.write_transaction(self.engine) as conn:
            inserted = 0
            lines = enrolled_lines(conn, {r.device_id for r in rows})
            for device_id in sorted(lines):
                mine = [r.record for r in rows if r.device_id == device_id]
                line = lines[device_id] or ""  # the fleet's fact, never the record's
                inserted += quality_store.insert_shadow_records(
                    conn, device_id, mine, now=now, line=line
                )
        return inserted

    def store_drift(self, rows: Sequence[DriftItem]) -> int:
        """Insert the new drift buckets and replace those whose copy counts more
        decisions; how many written.

        Raises:
            ValueError: a bucket names a line its device is not enrolled on (ingest
                then isolates and quarantines it, naming both lines).
        """
        if not rows:
            return 0
        now = self.clock()
        with store.write_transaction(self.engine) as conn:
            written = 0
            lines = enrolled_lines(conn, {r.device_id for r in rows})
            for row in rows:
                if row.hour.line != lines[row.device_id]:
                    raise ValueError(foreign_line_reason(row, lines[row.device_id]))
            for device_id in sorted(lines):
                mine = [r.hour for r in rows if r.device_id == device_id]
                written += quality_store.upsert_drift_hours(conn, device_id, mine, now=now)
        return written

    def known_models(self, wanted: Collection[ModelRef]) -> set[ModelRef]:
        """Of ``wanted`` (device_id, model_name, model_version), those the fleet knows
        for the device: known before, or recorded as the device's
        (:func:`fleet_server.quality.facts.recorded_version`). A decision row or a
        drift bucket from the device, or a version published for others, does not make
        it known."""
        with self._known_lock:
            known = {w for w in wanted if w in self._known}
        missing = sorted(set(wanted) - known)
        if missing:
            with self.engine.connect() as conn:
                known.update(w for w in missing if recorded_version(conn, *w))
        with self._known_lock:
            if len(self._known) + len(known) > KNOWN_CACHE:
                self._known.clear()
            self._known.update(known)
        return known

    def store_state(self, device_id: str, state: ReportedState) -> None:
        """Record the device's reported state, unless a newer one is held (by ``ts``);
        a state without ``ts`` (the last will) changes only ``online``."""
        now = self.clock()
        with store.write_transaction(self.engine) as conn:
            if state.ts is None:
                _connection_changed(conn, device_id, state.online, now)
                conn.execute(
                    devices.update()
                    .where(devices.c.device_id == device_id)
                    .values(online=state.online)
                )
                return
            store.upsert_device(conn, device_id, now=now)  # the row exists from here
            _lock_device(conn, device_id)
            store.insert_events(
                conn,
                [
                    EventRecord(
                        device_id,
                        state_event_id(state.ts),
                        state.ts,
                        STATE_EVENT,
                        state.model_dump(mode="json"),
                        now,
                    )
                ],
            )
            if _newer_state_held(conn, device_id, state.ts):
                log.info(
                    "ingest: state of %s at %r is older than the one held", device_id, state.ts
                )
                return
            _connection_changed(conn, device_id, state.online, now)
            conn.execute(
                devices.update()
                .where(devices.c.device_id == device_id)
                .values(_state_values(state))
            )
            store.mark_seen(conn, device_id, now, state.online)

    def quarantine(self, topic: str, reason: str, payload: bytes) -> None:
        """Set the payload aside in the database's quarantine table."""
        store.quarantine(self.engine, topic, reason, payload)


def _image_record(upload: ThumbnailUpload) -> ImageRecord:
    data = upload.jpeg()  # decoded once: the message checked it is a JPEG with a size
    width, height = jpeg_size(data)
    return ImageRecord(
        upload.decision_id, upload.device_id, upload.decision_time, upload.content_type,
        width, height, data,
    )  # fmt: skip


def _event_record(event: Event, received_at: float) -> EventRecord:
    payload = dict(event.payload)
    extra = event.model_extra
    if extra:
        payload["_message"] = dict(extra)
    return EventRecord(event.device_id, event.event_id, event.ts, event.kind, payload, received_at)


def _lock_device(conn: Connection, device_id: str) -> None:
    """Hold the device's row until commit (PostgreSQL; SQLite's writer lock does it)."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            sa.select(devices.c.device_id).where(devices.c.device_id == device_id).with_for_update()
        )


def _newer_state_held(conn: Connection, device_id: str, ts: float) -> bool:
    query = (
        sa.select(events.c.event_id)
        .where(events.c.device_id == device_id, events.c.kind == STATE_EVENT, events.c.ts > ts)
        .limit(1)
    )
    return conn.execute(query).first() is not None


def _state_values(state: ReportedState) -> dict[str, Any]:
    values: dict[str, Any] = {
        "online": state.online,
        "active_bundle": state.active.name if state.active else None,
        "active_release": state.active.release if state.active else None,
        "previous_bundle": state.previous.name if state.previous else None,
        "previous_release": state.previous.release if state.previous else None,
        "active_version": state.active.version if state.active else None,
        "active_digest": state.active.digest if state.active else None,
        "previous_version": state.previous.version if state.previous else None,
        "previous_digest": state.previous.digest if state.previous else None,
    }
    if state.agent_version is not None:
        values["agent_version"] = state.agent_version
    # What the device says of its profile and labels is kept as reported, apart from
    # the fleet's own (which rollouts select and sign by).
    if state.profile is not None:
        values["reported_profile"] = state.profile
    if state.labels:
        values["reported_labels"] = dict(state.labels)
    return values
