"""The quality topic through a real Mosquitto into the fleet database (SQLite and
PostgreSQL): shadow and drift batches stored once however often they come, and every bad
payload or record quarantined with a reason that names the problem, without holding up
the good records beside it."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import sqlalchemy as sa
from paho.mqtt.enums import CallbackAPIVersion
from sqlalchemy.engine import Engine

from agent.wire import topics
from agent.wire.messages import DecisionRow, encode
from agent.wire.quality import (
    DRIFT_BINS,
    DriftBatch,
    DriftHour,
    ShadowBatch,
    ShadowRecord,
    ShadowSide,
)
from agent.wire.reports import BundleRef, ReportedState
from fleet_server.broker import acl_text, identity
from fleet_server.broker.acl import service_grant
from fleet_server.db import store
from fleet_server.db.tables import drift_hours, shadow_results
from fleet_server.ingest import IngestWorker, MemorySink
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.quality.store import list_drift_hours
from tests.support.broker import Broker

pytest_plugins = ["tests.fleet_server.db_fixtures"]

NOW = float(int(time.time()) // 60 * 60)


def _wait(cond: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def decision(device_id: str, n: int, version: str = "1.0.0") -> DecisionRow:
    return DecisionRow(
        id=f"d-{device_id}-{n}",
        capture_time=NOW - 0.01,
        decision_time=NOW,
        device_id=device_id,
        source="cam0",
        line="1",
        model_name="cls",
        model_version=version,
        bundle_digest="sha256:ab",
        backend="onnxruntime",
        config_hash="c0ffee",
        input_digest=f"in{n}",
        outputs={"label": "ok", "score": 0.9},
        outcome="pass",
        thresholds={},
        latencies_ms={"infer": 2.0},
    )


def shadow(decision_id: str, *, live_version: str = "1.0.0", agree: bool = True) -> ShadowRecord:
    return ShadowRecord(
        decision_id=decision_id,
        ts=NOW,
        source="cam0",
        line="1",
        live=ShadowSide(
            model_name="cls", model_version=live_version, outcome="pass", latency_ms=2.0
        ),
        shadow=ShadowSide(
            model_name="cls",
            model_version="1.1.0",
            release=3,
            outcome="pass" if agree else "reject",
            latency_ms=3.0,
        ),
        agree=agree,
    )


def bucket(minute: int, n: int, *, version: str = "1.0.0") -> DriftHour:
    bins = len(DRIFT_BINS["brightness"]) - 1
    return DriftHour(
        model_name="cls",
        model_version=version,
        line="1",
        source="cam0",
        hour=int(NOW) - 60 * minute,
        period_s=60,
        n=n,
        outcomes={"pass": n},
        top_class={"ok": n},
        hist={"brightness": [n if i == 7 else 0 for i in range(bins)]},
    )


class Publisher:
    """A device-side paho client publishing at QoS 1 and waiting for every PUBACK."""

    def __init__(self, broker: Broker) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"test-pub-{uuid.uuid4().hex[:8]}",
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


@pytest.fixture
def publisher(own_mosquitto: Broker) -> Iterator[Publisher]:
    pub = Publisher(own_mosquitto)
    yield pub
    pub.close()


@pytest.fixture
def start_worker(own_mosquitto: Broker) -> Iterator[Callable[[Any], IngestWorker]]:
    started: list[IngestWorker] = []

    def make(sink: Any) -> IngestWorker:
        worker = IngestWorker(own_mosquitto.host, own_mosquitto.port, sink=sink)
        worker.start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()


def enrolled(db: Engine, device_id: str, line: str = "1", version: str = "1.0.0") -> None:
    """Register the device on ``line`` and record the state it reports (running cls
    ``version``): what makes that version the device's for the fleet."""
    store.upsert_device(db, device_id, labels={"line": line}, profile="orin")
    active = BundleRef(name="cls", version=version, release=1)
    SqlSink(db).store_state(device_id, ReportedState(device_id=device_id, ts=NOW, active=active))


def _count(db: Engine, table: sa.Table) -> int:
    with db.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_a_shadow_batch_and_a_drift_batch_are_stored_once_when_sent_twice(
    db: Engine, publisher: Publisher, start_worker: Callable[[Any], IngestWorker]
) -> None:
    worker = start_worker(SqlSink(db))
    enrolled(db, "gw-1")
    shadows = ShadowBatch(
        device_id="gw-1", records=[shadow("d-gw-1-0"), shadow("d-gw-1-1", agree=False)]
    )
    drifts = DriftBatch(device_id="gw-1", hours=[bucket(2, 40), bucket(1, 30)])
    messages = [(topics.quality("gw-1"), encode(shadows)), (topics.quality("gw-1"), encode(drifts))]
    publisher.send(messages)
    publisher.send(messages)  # the outbox sent them again (no PUBACK seen, say)
    assert _wait(lambda: worker.stats().received == 4 and worker.stats().duplicates == 4)
    assert _count(db, shadow_results) == 2
    assert _count(db, drift_hours) == 2
    assert worker.stats().quarantined == 0
    # a bucket still open on the device grows: the larger totals replace the stored ones
    publisher.send(
        [(topics.quality("gw-1"), encode(DriftBatch(device_id="gw-1", hours=[bucket(1, 55)])))]
    )
    assert _wait(lambda: worker.stats().received == 5)
    assert _wait(lambda: [r.n for r in list_drift_hours(db)] == [40, 55])


def test_bad_quality_payloads_are_quarantined_with_the_reason(
    db: Engine, publisher: Publisher, start_worker: Callable[[Any], IngestWorker]
) -> None:
    worker = start_worker(SqlSink(db))
    enrolled(db, "gw-1")
    good = json.loads(encode(DriftBatch(device_id="gw-1", hours=[bucket(1, 5)])))
    bad = [
        (topics.quality("gw-2"), json.dumps(good).encode()),  # another device's batch
        (topics.quality("gw-1"), b"{not json"),
        (topics.quality("gw-1"), json.dumps({**good, "kind": "weather"}).encode()),
        (
            topics.quality("gw-1"),
            json.dumps(
                {**good, "hours": [{**good["hours"][0], "hist": {"brightness": [1, 2]}}]}
            ).encode(),
        ),
    ]
    publisher.send(bad)
    # one record of a model version this device never ran, beside good ones
    mixed = ShadowBatch(
        device_id="gw-1",
        records=[shadow("d-gw-1-0"), shadow("d-gw-1-5", live_version="9.9.9"), shadow("d-gw-1-6")],
    )
    drift = DriftBatch(device_id="gw-1", hours=[bucket(1, 5, version="9.9.9"), bucket(2, 5)])
    publisher.send(
        [(topics.quality("gw-1"), encode(mixed)), (topics.quality("gw-1"), encode(drift))]
    )
    assert _wait(lambda: worker.stats().quarantined == len(bad) + 2)
    assert _wait(lambda: _count(db, shadow_results) == 2 and _count(db, drift_hours) == 1)
    reasons = {(q.topic, q.reason) for q in store.list_quarantine(db)}
    by_topic: dict[str, list[str]] = {}
    for topic, reason in reasons:
        by_topic.setdefault(topic, []).append(reason)
    assert any(
        "device_id 'gw-1' differs from the topic's 'gw-2'" in r
        for r in by_topic[topics.quality("gw-2")]
    )
    gw1 = " | ".join(by_topic[topics.quality("gw-1")])
    assert "not JSON" in gw1
    assert "kind 'weather' is neither 'shadow' nor 'drift'" in gw1
    assert "hist.brightness: 2 bins, expected 16" in gw1
    assert "shadow record d-gw-1-5: live model cls 9.9.9 is unknown for device gw-1" in gw1
    assert "drift bucket cls 9.9.9 line 1 cam0" in gw1
    (kept,) = [q for q in store.list_quarantine(db) if "d-gw-1-5" in q.reason]
    assert json.loads(kept.payload)["decision_id"] == "d-gw-1-5"  # the record alone
    assert worker.stats().internal_errors == 0


def test_a_version_is_known_from_the_fleets_records_of_the_device_not_a_decision_row(
    db: Engine,
) -> None:
    sink = SqlSink(db)
    mine, other = ("gw-1", "cls", "1.0.0"), ("gw-2", "cls", "1.0.0")
    sink.store_decisions([decision("gw-1", 0)])  # the device's own word
    assert sink.known_models({mine, other}) == set()
    enrolled(db, "gw-1")  # its reported state, recorded by the fleet
    assert sink.known_models({mine, other}) == {mine}
    assert sink.known_models({("gw-1", "cls", "2.0.0")}) == set()


def test_the_memory_sink_knows_reported_and_assigned_versions_not_decided_ones() -> None:
    sink = MemorySink(assigned={("gw-2", "cls", "2.0.0")})
    sink.store_decisions([decision("gw-1", 0)])
    wanted = {("gw-1", "cls", "1.0.0"), ("gw-2", "cls", "1.0.0"), ("gw-2", "cls", "2.0.0")}
    assert sink.known_models(wanted) == {("gw-2", "cls", "2.0.0")}
    active = BundleRef(name="cls", version="1.0.0", release=1)
    sink.store_state("gw-1", ReportedState(device_id="gw-1", ts=NOW, active=active))
    assert sink.known_models(wanted) == {("gw-1", "cls", "1.0.0"), ("gw-2", "cls", "2.0.0")}


def test_a_device_may_publish_its_own_quality_topic_and_ingest_reads_every_device() -> None:
    text = acl_text("fleet-server", [identity.ingest_service(0)])
    assert f"pattern write {topics.device_pattern(topics.quality)}" in text.splitlines()
    grant = service_grant(identity.ingest_service(0))
    assert topics.device_filter(topics.quality) in grant.reads
    assert topics.device_filter(topics.quality) not in grant.writes
