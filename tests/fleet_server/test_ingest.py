"""Ingest against a real Mosquitto: every kind of report stored, bad payloads set aside
while good ones flow, retries and redeliveries stored once, two workers sharing one
subscription group storing each record once."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from agent.wire import topics
from agent.wire.compress import compress
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
)
from fleet_server.ingest import IngestError, IngestWorker, MemorySink
from hil.bench.simfleet import SimFleet
from tests.support.broker import Broker, free_port

TS = 1_750_000_000.0


def _wait(cond: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


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

    def send(self, items: Sequence[tuple[str, bytes]], retain: bool = False) -> None:
        infos = [self.client.publish(t, p, qos=1, retain=retain) for t, p in items]
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
def worker_factory(own_mosquitto: Broker) -> Iterator[Callable[..., IngestWorker]]:
    started: list[IngestWorker] = []

    def make(sink: Any, **kwargs: Any) -> IngestWorker:
        worker = IngestWorker(own_mosquitto.host, own_mosquitto.port, sink=sink, **kwargs)
        worker.start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()


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
        outcome="pass",
        thresholds={"reject": 0.5},
        latencies_ms={"infer": 2.0},
    )


def _jpeg(width: int = 40, height: int = 30) -> bytes:
    ok, buf = cv2.imencode(".jpg", np.full((height, width, 3), 120, np.uint8))
    assert ok
    return bytes(buf)


def _reports(device_id: str) -> list[tuple[str, bytes]]:
    """One message of every kind the agent sends, on its topic."""
    return [
        (
            topics.state(device_id),
            encode(
                ReportedState(
                    device_id=device_id,
                    ts=TS,
                    agent_version="0.1.0",
                    active=BundleRef(name="cls", version="1.0.0", release=1),
                )
            ),
        ),
        (topics.heartbeat(device_id), encode(Heartbeat(device_id=device_id, seq=0, ts=TS))),
        (
            topics.telemetry(device_id),
            encode(
                Health(
                    device_id=device_id,
                    seq=0,
                    ts=TS,
                    fps={"cam1": 30.0},
                    latency_ms={"cls": Percentiles(p50=2.0, p95=3.0, p99=5.0)},
                    cpu_percent=20.0,
                )
            ),
        ),
        (
            topics.telemetry(device_id),
            encode(Telemetry(device_id=device_id, seq=0, ts=TS, metrics={"belt": 1.0})),
        ),
        (
            topics.decisions(device_id),
            encode(
                DecisionUpload(device_id=device_id, rows=[_row(device_id, n) for n in range(3)])
            ),
        ),
        (
            topics.thumbnails(device_id),
            encode(ThumbnailUpload.of(device_id, f"0197-{device_id}-0", TS, _jpeg())),
        ),
        (
            topics.events(device_id),
            encode(Event(device_id=device_id, kind="alarm", event_id="a-1", ts=TS)),
        ),
        (
            topics.install_state(device_id),
            json.dumps({"outcome": "committed", "step": "commit", "stale": False}).encode(),
        ),
    ]


def test_every_kind_of_report_is_stored(
    publisher: Publisher, worker_factory: Callable[..., IngestWorker]
) -> None:
    sink = MemorySink()
    worker = worker_factory(sink)
    publisher.send(_reports("dev-1"))

    assert _wait(lambda: sink.total() == 9 and "dev-1" in sink.states)
    assert len(sink.heartbeats) == 1
    assert [t.jpeg() for t in sink.thumbnails.values()] == [_jpeg()]
    assert len(sink.health) == 1
    assert len(sink.telemetry) == 1
    assert sorted(r.input_digest for r in sink.decisions.values()) == ["in0", "in1", "in2"]
    kinds = sorted(e.kind for e in sink.events.values())
    assert kinds == ["alarm", "install"]
    assert sink.states["dev-1"].active == BundleRef(name="cls", version="1.0.0", release=1)
    stats = worker.stats()
    assert (stats.received, stats.stored, stats.states, stats.quarantined) == (8, 9, 1, 0)


def test_bad_payloads_are_quarantined_and_counted_while_good_ones_keep_flowing(
    own_mosquitto: Broker, publisher: Publisher, worker_factory: Callable[..., IngestWorker]
) -> None:
    sink = MemorySink()
    worker = worker_factory(sink, max_payload_bytes=4096)
    beat = json.loads(encode(Heartbeat(device_id="dev-1", seq=0, ts=TS)))
    thumb = json.loads(encode(ThumbnailUpload.of("dev-1", "d-1", TS, _jpeg())))
    oversized = json.dumps({**beat, "pad": "x" * 5000}).encode()
    bad = [
        (topics.heartbeat("dev-1"), b"{not json"),
        (topics.heartbeat("dev-1"), json.dumps({**beat, "seq": "seven"}).encode()),
        (topics.heartbeat("dev-1"), oversized),
        (topics.heartbeat("dev-1"), encode(Health(device_id="dev-1", seq=0, ts=TS))),
        (topics.heartbeat("dev-2"), json.dumps(beat).encode()),
        (topics.decisions("dev-1"), b"[]"),
        (topics.events("dev-1"), b""),
        (topics.install_state("dev-1"), b"42"),
        (topics.thumbnails("dev-1"), json.dumps({**thumb, "data": "bm90IGEganBlZw=="}).encode()),
        (topics.thumbnails("dev-1"), json.dumps({**thumb, "data": "%%%%"}).encode()),
    ]
    good = [
        (topics.heartbeat("dev-1"), encode(Heartbeat(device_id="dev-1", seq=n, ts=TS)))
        for n in range(1, 21)
    ]
    mixed = [
        m
        for pair in zip(good, bad + [None] * len(good), strict=False)
        for m in pair
        if m is not None
    ]
    publisher.send(mixed)
    # A real command-line client too.
    subprocess.run(
        [
            "mosquitto_pub", "-h", own_mosquitto.host, "-p", str(own_mosquitto.port),
            "-V", "mqttv5", "-q", "1", "-t", topics.events("dev-1"), "-m", '{"kind": 7}',
        ],
        check=True,
        timeout=10,
    )  # fmt: skip
    publisher.send(
        [(topics.heartbeat("dev-1"), encode(Heartbeat(device_id="dev-1", seq=99, ts=TS)))]
    )

    assert _wait(lambda: worker.stats().quarantined == len(bad) + 1 and sink.total() == 21)
    reasons: dict[str, list[str]] = {}
    for q in sink.quarantined:
        reasons.setdefault(q.topic, []).append(q.reason)
    hb1 = " | ".join(reasons[topics.heartbeat("dev-1")])
    assert "not JSON" in hb1
    assert "seq" in hb1
    assert f"payload of {len(oversized)} bytes is over the limit of 4096" in hb1
    assert "kind: Input should be 'heartbeat'" in hb1  # a health report on the wrong topic
    assert "differs from the topic's 'dev-2'" in reasons[topics.heartbeat("dev-2")][0]
    assert "not an object" in reasons[topics.decisions("dev-1")][0]
    assert any("kind" in r for r in reasons[topics.events("dev-1")])
    assert "not an object" in reasons[topics.install_state("dev-1")][0]
    thumbs = reasons[topics.thumbnails("dev-1")]
    assert "data: not a JPEG (no FF D8 start-of-image marker)" in thumbs[0]
    assert "not base64" in thumbs[1]
    stats = worker.stats()
    assert stats.received == len(mixed) + 2
    assert stats.stored == 21
    assert stats.internal_errors == 0
    assert worker.ready


def test_retried_and_redelivered_records_are_stored_once(
    publisher: Publisher, worker_factory: Callable[..., IngestWorker]
) -> None:
    sink = MemorySink()
    worker = worker_factory(sink)
    reports = [r for r in _reports("dev-3") if r[0] != topics.state("dev-3")]
    publisher.send(reports)
    assert _wait(lambda: sink.total() == 9)
    publisher.send(reports)  # the agent's outbox sends again: no PUBACK seen, say
    assert _wait(lambda: worker.stats().duplicates == 9)
    assert sink.total() == 9
    assert worker.stats().stored == 9


def test_a_gzipped_decision_upload_is_stored_and_a_gzip_bomb_is_quarantined(
    publisher: Publisher, worker_factory: Callable[..., IngestWorker]
) -> None:
    sink = MemorySink()
    worker = worker_factory(sink, max_payload_bytes=64 * 1024)
    upload = encode(DecisionUpload(device_id="dev-z", rows=[_row("dev-z", n) for n in range(50)]))
    packed = compress(upload)
    assert len(packed) * 4 < len(upload)  # rows of one line compress well
    bomb = compress(b'{"pad": "' + b" " * (1024 * 1024) + b'"}')  # 1 MiB inflated, ~1 KiB sent
    publisher.send([
        (topics.decisions("dev-z"), packed),
        (topics.decisions("dev-z"), bomb),
        (topics.decisions("dev-z"), packed[:-8]),  # truncated
    ])  # fmt: skip
    assert _wait(lambda: len(sink.decisions) == 50 and worker.stats().quarantined == 2)
    reasons = sorted(q.reason for q in sink.quarantined)
    assert "inflates to more than the limit of 65536 bytes" in reasons[0] + reasons[1]
    assert "truncated gzip" in reasons[0] + reasons[1]


class FailingSink(MemorySink):
    """A sink whose storage is down: the fault a real database can't be made to show
    on cue."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    def store_heartbeats(self, rows: Sequence[Heartbeat]) -> int:
        self.attempts += 1
        raise OSError("database is down")


def test_messages_not_stored_are_delivered_again_to_the_restarted_worker(
    own_mosquitto: Broker, publisher: Publisher
) -> None:
    client_id = f"ingest-{uuid.uuid4().hex[:8]}"
    failing = FailingSink()
    first = IngestWorker(own_mosquitto.host, own_mosquitto.port, sink=failing, client_id=client_id)
    first.start()
    beats = [
        (topics.heartbeat("dev-4"), encode(Heartbeat(device_id="dev-4", seq=n, ts=TS)))
        for n in range(5)
    ]
    publisher.send(beats)
    assert _wait(lambda: failing.attempts >= 2)
    first.stop(timeout_s=0.5)
    assert first.stats().sink_errors >= 2
    assert first.stats().stored == 0

    sink = MemorySink()
    second = IngestWorker(own_mosquitto.host, own_mosquitto.port, sink=sink, client_id=client_id)
    second.start()
    try:
        assert _wait(lambda: len(sink.heartbeats) == 5)
        assert sorted(b.seq for b in sink.heartbeats.values()) == [0, 1, 2, 3, 4]
    finally:
        second.stop()


class GatedSink(MemorySink):
    """A sink whose heartbeat store waits until the test opens it: a slow database."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def store_heartbeats(self, rows: Sequence[Heartbeat]) -> int:
        assert self.gate.wait(30)
        return super().store_heartbeats(rows)


def test_a_full_queue_holds_the_network_thread_back_and_drops_nothing(
    own_mosquitto: Broker, worker_factory: Callable[..., IngestWorker]
) -> None:
    sink = GatedSink()
    worker = worker_factory(sink, receive_maximum=2, batch_size=1)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect(own_mosquitto.host, own_mosquitto.port)
    client.loop_start()
    try:
        # QoS 0 is outside Receive Maximum: the broker sends all of it at once.
        for n in range(8):
            beat = encode(Heartbeat(device_id="dev-q", seq=n, ts=TS))
            client.publish(topics.heartbeat("dev-q"), beat, qos=0).wait_for_publish(5)
        assert _wait(lambda: worker.stats().overflow >= 1)
        time.sleep(6.0)  # longer than any give-up a network thread could have had
        sink.gate.set()
        assert _wait(lambda: len(sink.heartbeats) == 8), sorted(sink.heartbeats)
    finally:
        client.disconnect()
        client.loop_stop()
    assert sorted(b.seq for b in sink.heartbeats.values()) == list(range(8))
    assert worker.stats().not_queued == 0
    assert worker.ready


def test_two_workers_of_one_shared_group_store_every_record_once(
    own_mosquitto: Broker, worker_factory: Callable[..., IngestWorker]
) -> None:
    sink = MemorySink()
    workers = [worker_factory(sink, group="ingest") for _ in range(2)]
    devices, rounds = 200, 10
    with SimFleet(own_mosquitto.host, own_mosquitto.port, devices=devices, clients=4) as fleet:
        for n in range(rounds):
            fleet.heartbeats()
            # Stay within the broker's per-client queue (1,000 by default).
            assert _wait(lambda n=n: sink.total() >= (n + 1) * devices - 400)
        assert fleet.wait_acked(devices * rounds, 10)
        assert _wait(lambda: sink.total() >= devices * rounds)
        time.sleep(0.2)  # a late duplicate would show here
        sent, refused = fleet.sent()
    stats = [w.stats() for w in workers]
    assert (sent, refused) == (2000, 0)
    assert sink.total() == len(sink.heartbeats) == 2000
    assert all(s.received > 0 for s in stats), stats
    assert sum(s.stored for s in stats) == 2000
    assert sum(s.received for s in stats) == 2000
    assert sum(s.duplicates for s in stats) == 0


def test_a_device_going_away_is_marked_offline_by_its_last_will(
    own_mosquitto: Broker, publisher: Publisher, worker_factory: Callable[..., IngestWorker]
) -> None:
    sink = MemorySink()
    worker_factory(sink)
    state = ReportedState(device_id="dev-5", ts=TS, agent_version="0.1.0")
    publisher.send([(topics.state("dev-5"), encode(state))], retain=True)
    assert _wait(lambda: "dev-5" in sink.states and sink.states["dev-5"].online)
    publisher.send([(topics.state("dev-5"), encode(state.model_copy(update={"ts": TS - 5})))])
    agent = subprocess.Popen(
        [
            "mosquitto_sub", "-h", own_mosquitto.host, "-p", str(own_mosquitto.port),
            "-V", "mqttv5", "-t", topics.directive("dev-5"), "-q", "1",
            "--will-topic", topics.state("dev-5"), "--will-qos", "1", "--will-retain",
            "--will-payload", encode(ReportedState.offline("dev-5")).decode(),
        ],
    )  # fmt: skip
    try:
        time.sleep(0.5)
        agent.send_signal(signal.SIGKILL)  # no DISCONNECT: the broker sends the will
    finally:
        agent.wait(5)
    assert _wait(lambda: not sink.states["dev-5"].online)
    kept = sink.states["dev-5"]
    assert (kept.ts, kept.agent_version) == (TS, "0.1.0")


def test_a_retained_install_report_seen_again_is_not_a_second_event(
    publisher: Publisher, worker_factory: Callable[..., IngestWorker]
) -> None:
    sink = MemorySink()
    report = {"outcome": "failed", "step": "verify", "reason": "hash mismatch"}
    publisher.send([(topics.install_state("dev-6"), json.dumps(report).encode())], retain=True)
    first = worker_factory(sink)
    assert _wait(lambda: len(sink.events) == 1)
    second = worker_factory(sink)  # subscribes anew: gets the retained copy
    assert _wait(lambda: second.stats().duplicates == 1)
    (event,) = sink.events.values()
    assert (event.kind, event.payload) == ("install", report)
    assert first.stats().stored == 1


def test_a_worker_that_cannot_reach_its_broker_fails_to_start_naming_it() -> None:
    port = free_port()
    worker = IngestWorker("127.0.0.1", port, sink=MemorySink())
    with pytest.raises(IngestError, match=f"127.0.0.1:{port}"):
        worker.start(timeout_s=1.0)


def test_tls_files_that_are_missing_or_unpaired_are_refused(tmp_path: Path) -> None:
    with pytest.raises(IngestError, match=r"no-ca\.pem"):
        IngestWorker("127.0.0.1", 1, sink=MemorySink(), tls_ca=tmp_path / "no-ca.pem")
    with pytest.raises(IngestError, match="go together"):
        IngestWorker("127.0.0.1", 1, sink=MemorySink(), tls_cert=tmp_path / "c.pem")


def test_a_simulated_fleet_sends_one_heartbeat_per_device_per_tick(
    own_mosquitto: Broker, worker_factory: Callable[..., IngestWorker]
) -> None:
    sink = MemorySink()
    worker_factory(sink, group="sim")
    with SimFleet(own_mosquitto.host, own_mosquitto.port, devices=50, clients=3) as fleet:
        report = fleet.run(duration_s=1.0, rate_hz=4.0)
    assert report.refused == 0
    assert report.sent == 50 * 4
    assert report.msgs_per_s > 0
    assert _wait(lambda: len(sink.heartbeats) == report.sent)
    per_device = dict.fromkeys(fleet.device_ids, 0)
    for beat in sink.heartbeats.values():
        per_device[beat.device_id] += 1
    assert set(per_device.values()) == {4}
