"""The ingest sink over the fleet database, on SQLite and on PostgreSQL: records stored
once with the counts of rows inserted, device rows kept up to date by heartbeats, health
and reported state; and two ingest workers on one shared subscription against a real
Mosquitto storing each record once."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence

import cv2
import numpy as np
import paho.mqtt.client as mqtt
import sqlalchemy as sa
from paho.mqtt.enums import CallbackAPIVersion
from sqlalchemy.engine import Engine

from agent.wire import topics
from agent.wire.messages import (
    BundleRef,
    DecisionRow,
    DecisionUpload,
    Event,
    Health,
    Heartbeat,
    Percentiles,
    ReportedState,
    Telemetry,
    ThumbnailUpload,
    encode,
    install_state_event,
    parse,
)
from fleet_server.db import store
from fleet_server.db.tables import decisions, events, heartbeats, telemetry
from fleet_server.ingest import IngestWorker
from fleet_server.ingest.sqlsink import CONNECTION_EVENT, STATE_EVENT, SqlSink
from tests.support.broker import Broker

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # the db, db_url and pg_cluster fixtures

TS = 1_750_000_000.0


def _wait(cond: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _row(device_id: str, n: int) -> DecisionRow:
    return DecisionRow(
        id=f"0197-{device_id}-{n}",
        capture_time=TS + n - 0.01,
        decision_time=TS + n,
        device_id=device_id,
        source="cam1",
        line="3",
        model_name="cls",
        model_version="1.0.0",
        bundle_digest="sha256:ab",
        backend="onnxruntime",
        config_hash="c0ffee",
        input_digest=f"in{n}",
        outputs={"score": 0.1 * n},
        outcome="reject" if n % 2 else "pass",
        thresholds={"reject": 0.5},
        latencies_ms={"infer": 2.0},
    )


def _health(device_id: str, seq: int, ts: float, p99: float) -> Health:
    return Health(
        device_id=device_id,
        seq=seq,
        ts=ts,
        latency_ms={"cls": Percentiles(p50=1.0, p95=2.0, p99=p99)},
    )


# -- records ----------------------------------------------------------------------


def test_each_kind_of_record_is_stored_once_and_the_counts_are_rows_inserted(db: Engine) -> None:
    sink = SqlSink(db)
    beats = [Heartbeat(device_id="dev-a", seq=n, ts=TS + n) for n in range(5)]
    assert sink.store_heartbeats([*beats, beats[0]]) == 5
    assert sink.store_heartbeats(beats) == 0
    assert sink.store_health([_health("dev-a", 0, TS, 5.0)]) == 1
    assert sink.store_health([_health("dev-a", 0, TS, 5.0)]) == 0
    sample = Telemetry(device_id="dev-a", seq=0, ts=TS, metrics={"belt": 1.5})
    assert sink.store_telemetry([sample, sample]) == 1  # same seq as the health: other kind
    rows = [_row("dev-a", n) for n in range(3)]
    assert sink.store_decisions(rows) == 3
    assert sink.store_decisions([*rows, _row("dev-a", 3)]) == 1
    alarm = Event(device_id="dev-a", kind="alarm", event_id="a-1", ts=TS, payload={"x": 1})
    assert sink.store_events([alarm, alarm]) == 1
    assert sink.store_events([alarm]) == 0
    assert sink.store_heartbeats([]) == sink.store_events([]) == 0

    assert store.count_records(db, "heartbeats") == 5
    assert store.count_records(db, "telemetry") == 2
    assert store.count_records(db, "decisions") == 4
    assert store.count_records(db, "events") == 1
    (decision,) = [d for d in store.list_decision_records(db, "dev-a") if d.id == rows[1].id]
    assert (decision.ts, decision.outcome, decision.model_version) == (TS + 1, "reject", "1.0.0")
    assert decision.payload["outputs"] == {"score": 0.1}
    (event,) = store.list_events(db, "dev-a", kind="alarm")
    assert event.payload == {"x": 1}


def test_a_station_decisions_fields_are_stored_in_their_columns_and_an_old_row_takes_defaults(
    db: Engine,
) -> None:
    sink = SqlSink(db)
    late = _row("dev-a", 0).model_copy(
        update={"station": "st-1", "part_id": "P-0042", "deadline_missed": True}
    )
    older = json.loads(encode(DecisionUpload(device_id="dev-a", rows=[_row("dev-a", 1)])))
    for name in ("station", "part_id", "deadline_missed"):  # as an older agent sends it
        del older["rows"][0][name]
    (old_row,) = parse(DecisionUpload, json.dumps(older).encode()).rows
    assert sink.store_decisions([late, old_row]) == 2
    with db.connect() as conn:
        columns = (decisions.c.station, decisions.c.part_id, decisions.c.deadline_missed)
        stored = {r[0]: tuple(r[1:]) for r in conn.execute(sa.select(decisions.c.id, *columns))}
    assert stored == {late.id: ("st-1", "P-0042", True), old_row.id: ("", "", False)}
    by_id = {d.id: d for d in store.list_decision_records(db, "dev-a")}
    assert (by_id[late.id].station, by_id[late.id].part_id, by_id[late.id].deadline_missed) == (
        "st-1",
        "P-0042",
        True,
    )
    assert by_id[late.id].payload["part_id"] == "P-0042"  # and in the row as uploaded
    assert by_id[old_row.id].deadline_missed is False


def _jpeg(width: int, height: int, grey: int = 120) -> bytes:
    ok, buf = cv2.imencode(".jpg", np.full((height, width, 3), grey, np.uint8))
    assert ok
    return bytes(buf)


def test_a_thumbnail_is_stored_once_and_shown_only_with_the_decision_of_its_device(
    db: Engine,
) -> None:
    sink = SqlSink(db)
    rows = [_row("dev-a", n) for n in range(3)]
    picture = _jpeg(64, 48)
    thumb = ThumbnailUpload.of("dev-a", rows[0].id, TS, picture)
    assert sink.store_thumbnails([thumb, thumb]) == 1  # before its decision arrives
    assert store.get_image(db, rows[0].id) is None  # no decision yet: nothing to show
    assert sink.store_decisions(rows) == 3
    image = store.get_image(db, rows[0].id)
    assert image is not None
    assert (image.data, image.width, image.height, image.content_type) == (
        picture, 64, 48, "image/jpeg",
    )  # fmt: skip
    assert sink.store_thumbnails([ThumbnailUpload.of("dev-a", rows[0].id, TS, _jpeg(8, 8))]) == 0
    assert store.get_image(db, rows[0].id) == image  # the first one stays
    # Another device's picture under dev-a's decision id is kept but never shown, and it
    # does not keep dev-a's own picture out.
    assert sink.store_thumbnails([ThumbnailUpload.of("dev-b", rows[1].id, TS, _jpeg(9, 9))]) == 1
    assert store.get_image(db, rows[1].id) is None
    assert store.image_sizes(db, [r.id for r in rows]) == {rows[0].id: (64, 48)}
    own = ThumbnailUpload.of("dev-a", rows[1].id, TS, _jpeg(32, 24))
    assert sink.store_thumbnails([own]) == 1
    shown = store.get_image(db, rows[1].id)
    assert shown is not None
    assert (shown.device_id, shown.width, shown.data) == ("dev-a", 32, own.jpeg())
    assert store.image_sizes(db, []) == {}


def test_unknown_fields_of_an_event_message_are_kept_with_its_payload(db: Engine) -> None:
    event = Event.model_validate(
        {"device_id": "dev-a", "kind": "alarm", "event_id": "e1", "ts": TS,
         "payload": {"x": 1}, "severity": "high"}
    )  # fmt: skip
    SqlSink(db).store_events([event])
    (stored,) = store.list_events(db, "dev-a")
    assert stored.payload == {"x": 1, "_message": {"severity": "high"}}


def test_a_retained_install_report_seen_twice_is_one_event(db: Engine) -> None:
    report = {"outcome": "committed", "step": "commit", "bundle": "cls", "release": 2}
    sink = SqlSink(db)
    assert sink.store_events([install_state_event("dev-a", report)]) == 1
    assert sink.store_events([install_state_event("dev-a", report)]) == 0
    (event,) = store.list_events(db, "dev-a", kind="install")
    assert event.payload == report


class _Clock:
    """The server's clock, set by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_heartbeats_move_last_seen_forward_by_receive_time_and_mark_devices_online(
    db: Engine,
) -> None:
    store.upsert_device(db, "dev-a", profile="x86-gateway")
    assert store.get_device(db, "dev-a").online is False  # type: ignore[union-attr]
    clock = _Clock(TS + 100)
    sink = SqlSink(db, clock=clock)
    sink.store_heartbeats([Heartbeat(device_id="dev-a", seq=n, ts=TS + n) for n in (3, 1, 2)])
    sink.store_heartbeats([Heartbeat(device_id="dev-b", seq=0, ts=TS)])  # not registered
    device = store.get_device(db, "dev-a")
    assert device is not None
    assert (device.online, device.last_seen) == (True, TS + 100)  # receive time, not ts
    clock.now = TS + 200
    sink.store_heartbeats([Heartbeat(device_id="dev-a", seq=9, ts=TS + 1e9)])  # far future
    assert store.get_device(db, "dev-a").last_seen == TS + 200  # type: ignore[union-attr]
    clock.now = TS + 150  # a worker whose batch was received earlier commits later
    sink.store_heartbeats([Heartbeat(device_id="dev-a", seq=0, ts=TS)])
    assert store.get_device(db, "dev-a").last_seen == TS + 200  # type: ignore[union-attr]
    assert store.get_device(db, "dev-b") is None
    assert store.count_records(db, "heartbeats") == 6
    (newest, *_) = store.list_heartbeats(db, "dev-a")
    assert (newest.ts, newest.received_at) == (TS + 1e9, TS + 200)


def test_the_newest_health_report_becomes_the_devices_health(db: Engine) -> None:
    store.upsert_device(db, "dev-a")
    sink = SqlSink(db)
    sink.store_health([_health("dev-a", 1, TS + 10, 7.0), _health("dev-a", 0, TS, 5.0)])
    health = store.get_device(db, "dev-a").health  # type: ignore[union-attr]
    assert health is not None
    assert (health["seq"], health["latency_ms"]["cls"]["p99"]) == (1, 7.0)
    sink.store_health([_health("dev-a", 9, TS + 5, 9.0)])  # older than the one held
    assert store.get_device(db, "dev-a").health["seq"] == 1  # type: ignore[union-attr,index]
    sink.store_health([_health("dev-a", 2, TS + 20, 8.0)])
    assert store.get_device(db, "dev-a").health["seq"] == 2  # type: ignore[union-attr,index]
    assert store.count_records(db, "telemetry") == 4


def _state(ts: float, release: int, **kw: object) -> ReportedState:
    return ReportedState(
        device_id="dev-a",
        ts=ts,
        agent_version="0.5.0",
        profile="x86-gateway",
        active=BundleRef(name="cls", version=f"{release}.0.0", release=release),
        previous=BundleRef(name="cls", version="1.0.0", release=1) if release > 1 else None,
        **kw,
    )


def test_a_reported_state_updates_the_device_and_an_older_one_arriving_late_does_not(
    db: Engine,
) -> None:
    store.upsert_device(db, "dev-a", labels={"line": "3"}, profile="old-profile")
    sink = SqlSink(db, clock=_Clock(TS + 30))
    sink.store_state("dev-a", _state(TS + 10, 2))
    device = store.get_device(db, "dev-a")
    assert device is not None
    assert (device.active_bundle, device.active_release) == ("cls", 2)
    assert (device.previous_bundle, device.previous_release) == ("cls", 1)
    assert (device.agent_version, device.profile, device.labels) == (
        "0.5.0", "old-profile", {"line": "3"}  # the fleet's: never what the device says
    )  # fmt: skip
    assert (device.reported_profile, device.reported_labels) == ("x86-gateway", None)
    assert (device.online, device.last_seen) == (True, TS + 30)

    sink.store_state("dev-a", _state(TS + 5, 1))  # delivered late through another worker
    device = store.get_device(db, "dev-a")
    assert device is not None
    assert device.active_release == 2
    sink.store_state("dev-a", _state(TS + 10, 2))  # the retained copy again: one event
    states = store.list_events(db, "dev-a", kind=STATE_EVENT)
    assert sorted(e.ts for e in states) == [TS + 5, TS + 10]

    sink.store_state("dev-a", _state(TS + 20, 1, labels={"line": "4"}))
    device = store.get_device(db, "dev-a")
    assert device is not None
    assert (device.active_release, device.previous_release) == (1, None)
    assert (device.labels, device.reported_labels) == ({"line": "3"}, {"line": "4"})


def test_a_last_will_marks_the_device_offline_and_changes_nothing_else(db: Engine) -> None:
    sink = SqlSink(db, clock=_Clock(TS + 1))
    sink.store_state("dev-a", _state(TS, 2))  # an unknown device is registered by its state
    sink.store_state("dev-a", ReportedState.offline("dev-a"))
    device = store.get_device(db, "dev-a")
    assert device is not None
    assert (device.online, device.active_release, device.last_seen) == (False, 2, TS + 1)
    sink.store_heartbeats([Heartbeat(device_id="dev-a", seq=0, ts=TS + 1)])
    assert store.get_device(db, "dev-a").online is True  # type: ignore[union-attr]


def test_a_quarantined_payload_is_kept_with_its_reason(db: Engine) -> None:
    SqlSink(db).quarantine("edgefleet/devices/x/heartbeat", "not JSON", b"{nope")
    (kept,) = store.list_quarantine(db)
    assert (kept.topic, kept.reason, kept.payload) == (
        "edgefleet/devices/x/heartbeat", "not JSON", b"{nope"
    )  # fmt: skip


# -- real broker ------------------------------------------------------------------


class Publisher:
    """A device-side paho client publishing at QoS 1 and waiting for every PUBACK."""

    def __init__(self, broker: Broker) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"sqlsink-pub-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()

    def send(self, items: Sequence[tuple[str, bytes]]) -> None:
        infos = [self.client.publish(t, p, qos=1) for t, p in items]
        for info in infos:
            info.wait_for_publish(10)
            assert info.is_published()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _stored(db: Engine, prefix: str) -> int:
    total = 0
    with db.connect() as conn:
        for table in (heartbeats, telemetry, decisions, events):
            query = sa.select(sa.func.count()).where(table.c.device_id.startswith(prefix))
            if table is events:  # the uploaded ones, not the server's connection events
                query = query.where(events.c.kind != CONNECTION_EVENT)
            total += int(conn.execute(query).scalar_one())
    return total


def test_two_workers_on_one_shared_subscription_store_each_record_once(
    db: Engine, own_mosquitto: Broker
) -> None:
    # A broker of this test's own: retained messages other tests left on the session
    # broker (install reports, states) would be stored too and skew the counts.
    mosquitto = own_mosquitto
    prefix = f"s{uuid.uuid4().hex[:6]}"
    ids = [f"{prefix}-{i:03d}" for i in range(40)]
    for device_id in ids:
        store.upsert_device(db, device_id, profile="x86-gateway")
    messages: list[tuple[str, bytes]] = []
    records: list[int] = []  # records in each message
    for i, device_id in enumerate(ids):
        for seq in range(8):
            beat = Heartbeat(device_id=device_id, seq=seq, ts=TS + seq)
            messages.append((topics.heartbeat(device_id), encode(beat)))
        messages.append((topics.telemetry(device_id), encode(_health(device_id, 0, TS, 4.0))))
        event = Event(device_id=device_id, kind="alarm", event_id=f"e{i}", ts=TS)
        messages.append((topics.events(device_id), encode(event)))
        upload = DecisionUpload(device_id=device_id, rows=[_row(device_id, n) for n in range(2)])
        messages.append((topics.decisions(device_id), encode(upload)))
        records += [1] * 10 + [2]
    unique = sum(records)
    again = messages[::3]  # the agent's outbox sends these again (no PUBACK seen, say)
    doubled = sum(records[::3])

    started = time.time()
    sink = SqlSink(db)
    group = f"sqlsink-{prefix}"
    workers = [
        IngestWorker(mosquitto.host, mosquitto.port, sink=sink, group=group, batch_size=50)
        for _ in range(2)
    ]
    publisher = Publisher(mosquitto)
    try:
        for worker in workers:
            worker.start()
        publisher.send(messages)
        publisher.send(again)
        assert _wait(lambda: sum(w.stats().received for w in workers) >= len(messages) + len(again))
        assert _wait(lambda: _stored(db, prefix) >= unique)
        time.sleep(0.3)  # a late duplicate would show here
    finally:
        publisher.close()
        for worker in workers:
            worker.stop()
    stats = [w.stats() for w in workers]
    assert all(s.received > 0 for s in stats), stats
    assert _stored(db, prefix) == unique
    assert sum(s.stored for s in stats) == unique
    assert sum(s.duplicates for s in stats) == doubled
    assert sum(s.received for s in stats) == len(messages) + len(again)
    assert sum(s.quarantined + s.sink_errors + s.internal_errors for s in stats) == 0
    device = store.get_device(db, ids[0])
    assert device is not None
    assert device.online is True
    assert device.last_seen is not None
    assert started <= device.last_seen <= time.time()  # receive time, not the device's
    assert device.health is not None


def test_going_offline_and_coming_back_are_events_once_each(db: Engine) -> None:
    """The last will, a heartbeat after it and a state after another last will: one
    connection event per change of ``online``, none for a repeat."""
    clock = _Clock(TS + 1)
    sink = SqlSink(db, clock=clock)
    sink.store_state("dev-c", _state(TS, 2))  # registered by its state: came online
    sink.store_state("dev-c", ReportedState.offline("dev-c"))
    sink.store_state("dev-c", ReportedState.offline("dev-c"))  # the will again: no event
    clock.now = TS + 5
    sink.store_heartbeats([Heartbeat(device_id="dev-c", seq=1, ts=TS + 5)])
    sink.store_heartbeats([Heartbeat(device_id="dev-c", seq=2, ts=TS + 6)])  # still online
    clock.now = TS + 9
    sink.store_state("dev-c", ReportedState.offline("dev-c"))
    clock.now = TS + 12
    sink.store_state("dev-c", _state(TS + 12, 2))
    seen = store.list_events(db, "dev-c", kind="connection")
    got = sorted((e.ts, e.payload["online"]) for e in seen)
    # the first state of a device its row held offline (enrolled) counts as coming online
    assert got == [(TS + 1, False), (TS + 1, True), (TS + 5, True), (TS + 9, False),
                   (TS + 12, True)]  # fmt: skip
    assert {e.payload["message"] for e in seen} == {
        "came back online",
        "went offline (its connection dropped)",
    }
