"""Model-quality uploads against real parts: a real decision log (drift counted on its
writer thread, shadow rows by the shadow store), the uplink through a managed Mosquitto
with TLS and per-device ACLs, the fleet's identity reading the quality topic. A bucket is
sent once it is over, once; a changed one again with its totals; offline buckets arrive
after the link is back; shadow comparisons are sent and marked."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.decisionlog import DecisionLog, DecisionLogConfig
from agent.decisionlog.schema import DRIFT_TABLE, NOT_UPLOADED, QUEUED, SHADOW_TABLE, UPLOADED
from agent.drift import DriftConfig
from agent.enrollment.identity import Identity
from agent.shadow.store import ShadowRow, ShadowStore
from agent.uplink import Uplink
from agent.uplink.outbox import KIND_QUALITY, Outbox, full_drop_order
from agent.uplink.quality import QualitySender
from agent.uplink.quality_rows import GRACE_S, closed_drift, drift_hour
from agent.wire import topics
from agent.wire.codec import parse_quality
from agent.wire.quality import DriftBatch, DriftHour, ShadowBatch
from fleet_server.broker import ManagedBroker
from hil.linkproxy import LinkProxy
from tests.agent.decisionlog.decisionlog_driver import make_record
from tests.agent.uplink.uplink_fixtures import FAST, wait_until
from tests.support.tls_peers import Peer

PERIOD = 60
CONFIG = FAST.model_copy(update={"quality_interval_s": 0.1})
SETTLE_S = 30.0


@pytest.fixture
def link(broker: ManagedBroker) -> Iterator[LinkProxy]:
    proxy = LinkProxy("127.0.0.1", broker.config.port).start()
    yield proxy
    proxy.close()


def open_log(state: Path, device_id: str) -> DecisionLog:
    dlog = DecisionLog(
        state,
        DecisionLogConfig(thumbnails="none"),
        device_id=device_id,
        drift=DriftConfig(period_s=PERIOD),
    )
    dlog.open()
    return dlog


def decide(dlog: DecisionLog, t: float, count: int, **fields: Any) -> None:
    for i in range(count):
        dlog.append(make_record(i, t, source="cam-1", **fields))
    assert dlog.flush()


def start_of(t: float) -> int:
    return int(t // PERIOD) * PERIOD


def drift_states(path: Path) -> dict[int, tuple[int, int]]:
    """(n, uploaded) by bucket start."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(f"SELECT hour, n, uploaded FROM {DRIFT_TABLE}").fetchall()  # noqa: S608
    finally:
        conn.close()
    return {int(h): (int(n), int(u)) for h, n, u in rows}


def shadow_states(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(f"SELECT decision_id, uploaded FROM {SHADOW_TABLE}").fetchall()  # noqa: S608
    finally:
        conn.close()
    return {str(i): int(u) for i, u in rows}


class Received:
    """What the fleet's subscriber got on a device's quality topic, parsed."""

    def __init__(self, peer: Peer, device_id: str) -> None:
        self.peer = peer
        self.topic = topics.quality(device_id)
        self.hours: list[DriftHour] = []
        self.shadow: list[ShadowBatch] = []
        peer.subscribe(self.topic)

    def pump(self) -> None:
        for topic, payload in self.peer.flush():
            if topic != self.topic:
                continue
            message = parse_quality(payload)  # gzip, validated like the fleet does
            if isinstance(message, DriftBatch):
                self.hours.extend(message.hours)
            else:
                self.shadow.append(message)

    def until(self, done: Callable[[], bool], timeout_s: float = SETTLE_S) -> None:
        def check() -> bool:
            self.pump()
            return done()

        wait_until(check, timeout_s)

    def of(self, hour: int) -> list[DriftHour]:
        self.pump()
        return [h for h in self.hours if h.hour == hour]


def test_a_closed_bucket_is_uploaded_once_and_an_open_one_waits(
    enrolled: Callable[[str], Identity],
    fleet: Callable[..., Peer],
    uplinks: list[Uplink],
    tmp_path: Path,
) -> None:
    identity = enrolled("dev-q")
    got = Received(fleet(), "dev-q")
    dlog = open_log(tmp_path / "log", "dev-q")
    now = time.time()
    closed, current = now - 5 * PERIOD, now
    decide(dlog, closed, 12)
    decide(dlog, closed, 3, outcome="reject")
    decide(dlog, current, 4)
    uplink = Uplink("dev-q", identity, CONFIG, state=dict, health=dict, decision_log=dlog)
    uplinks.append(uplink)
    uplink.start()
    got.until(lambda: bool(got.of(start_of(closed))))
    wait_until(lambda: drift_states(dlog.path)[start_of(closed)] == (15, UPLOADED))
    (hour,) = got.of(start_of(closed))
    assert hour.n == 15
    assert hour.period_s == PERIOD
    assert hour.outcomes == {"pass": 12, "reject": 3}
    assert hour.top_class == {"ok": 15}
    assert sum(hour.hist["score"]) == 15
    assert (hour.model_name, hour.model_version, hour.line, hour.source) == (
        "defects", "1.2.0", "line-1", "cam-1",
    )  # fmt: skip
    time.sleep(1.0)  # ten more looks of the sender
    assert got.of(start_of(closed)) == [hour]  # once
    if time.time() < start_of(current) + PERIOD + GRACE_S:
        assert got.of(start_of(current)) == []
        assert drift_states(dlog.path)[start_of(current)] == (4, NOT_UPLOADED)
    assert uplink.stats()["drift_uploaded"] == 1
    uplink.stop()
    dlog.close()


def test_a_bucket_that_changes_after_its_upload_is_sent_again_with_its_totals(
    enrolled: Callable[[str], Identity],
    fleet: Callable[..., Peer],
    uplinks: list[Uplink],
    tmp_path: Path,
) -> None:
    identity = enrolled("dev-r")
    got = Received(fleet(), "dev-r")
    dlog = open_log(tmp_path / "log", "dev-r")
    closed = start_of(time.time() - 5 * PERIOD) + 1.0
    decide(dlog, closed, 5)
    uplink = Uplink("dev-r", identity, CONFIG, state=dict, health=dict, decision_log=dlog)
    uplinks.append(uplink)
    uplink.start()
    wait_until(lambda: drift_states(dlog.path)[start_of(closed)] == (5, UPLOADED), SETTLE_S)
    decide(dlog, closed + 1, 2, outcome="reject")  # late decisions of the same bucket
    wait_until(lambda: drift_states(dlog.path)[start_of(closed)] == (7, UPLOADED), SETTLE_S)
    got.until(lambda: len(got.of(start_of(closed))) == 2)
    first, second = got.of(start_of(closed))
    assert (first.n, first.outcomes) == (5, {"pass": 5})
    assert (second.n, second.outcomes) == (7, {"pass": 5, "reject": 2})  # totals, not deltas
    uplink.stop()
    dlog.close()


def test_buckets_closed_while_offline_arrive_once_the_link_is_back(
    enrolled: Callable[[str], Identity],
    fleet: Callable[..., Peer],
    link: LinkProxy,
    uplinks: list[Uplink],
    tmp_path: Path,
) -> None:
    identity = enrolled("dev-o2")
    got = Received(fleet(), "dev-o2")
    dlog = open_log(tmp_path / "log", "dev-o2")
    config = CONFIG.model_copy(update={"broker_port": link.port, "reconnect_max_s": 1})
    uplink = Uplink("dev-o2", identity, config, state=dict, health=dict, decision_log=dlog)
    uplinks.append(uplink)
    uplink.start()
    assert uplink.wait_connected(10)
    link.cut()
    wait_until(lambda: not uplink.connected)
    # A look at the log that began just before the cut may still be running on a loaded
    # machine; the buckets are written once the sender has looked while offline.
    time.sleep(0.5)
    assert uplink.stats()["outbox"]["pending_by_kind"][KIND_QUALITY] == 0
    now = time.time()
    starts = [start_of(now - k * PERIOD) for k in (9, 7, 5)]  # three buckets, all over
    for start in starts:
        decide(dlog, start + 1, 4)
    time.sleep(1.0)  # the sender looks ten times meanwhile
    assert uplink.stats()["outbox"]["pending_by_kind"][KIND_QUALITY] == 0  # the log holds them
    assert {h: drift_states(dlog.path)[h][1] for h in starts} == dict.fromkeys(starts, 0)
    link.restore()
    wait_until(lambda: uplink.connected, SETTLE_S)
    wait_until(lambda: all(drift_states(dlog.path)[h] == (4, UPLOADED) for h in starts), SETTLE_S)
    time.sleep(0.5)
    for start in starts:
        assert [h.n for h in got.of(start)] == [4]  # each once
    uplink.stop()
    dlog.close()


def _shadow_row(decision_id: str, ts: float, agree: bool) -> ShadowRow:
    return ShadowRow(
        decision_id=decision_id, ts=ts, source="cam-1", line="line-1",
        live_model="defects", live_version="1.2.0", live_outcome="pass", live_ms=4.0,
        live_outputs={"label": "ok", "score": 0.9},
        shadow_model="defects", shadow_version="1.3.0", shadow_release=7,
        shadow_digest="sha256:" + "cd" * 32,
        shadow_outcome="pass" if agree else "reject", shadow_ms=5.5,
        shadow_outputs={"label": "ok" if agree else "scratch", "score": 0.8},
        agree=agree, iou_threshold=0.5, matched=0, unmatched_live=0, unmatched_shadow=0,
    )  # fmt: skip


def test_shadow_comparisons_are_uploaded_and_marked(
    enrolled: Callable[[str], Identity],
    fleet: Callable[..., Peer],
    uplinks: list[Uplink],
    tmp_path: Path,
) -> None:
    identity = enrolled("dev-sh")
    got = Received(fleet(), "dev-sh")
    dlog = open_log(tmp_path / "log", "dev-sh")
    store = ShadowStore(tmp_path / "log", dlog.config)
    now = time.time()
    ids = [f"0190d3a8-0000-7000-8000-{i:012x}" for i in range(30)]
    for i, decision_id in enumerate(ids):
        store.write(_shadow_row(decision_id, now - 30 + i, agree=i % 3 != 0))
    assert store.flush() == 30
    store.close()
    config = CONFIG.model_copy(update={"quality_batch": 12})  # three batches
    uplink = Uplink("dev-sh", identity, config, state=dict, health=dict, decision_log=dlog)
    uplinks.append(uplink)
    uplink.start()
    wait_until(lambda: set(shadow_states(dlog.path).values()) == {UPLOADED}, SETTLE_S)
    got.until(lambda: sum(len(b.records) for b in got.shadow) >= 30)
    records = [r for b in got.shadow for r in b.records]
    assert sorted(r.decision_id for r in records) == ids
    assert [len(b.records) for b in got.shadow] == [12, 12, 6]
    first = records[0]
    assert first.agree is False
    assert (first.live.outcome, first.shadow.outcome) == ("pass", "reject")
    assert first.shadow.release == 7
    assert first.shadow.outputs == {"label": "scratch", "score": 0.8}
    assert sum(r.agree for r in records) == 20
    assert uplink.stats()["shadow_uploaded"] == 30
    uplink.stop()
    dlog.close()


# -- without a broker -------------------------------------------------------------------


def test_a_bucket_is_closed_only_after_its_end_and_the_grace(tmp_path: Path) -> None:
    dlog = open_log(tmp_path, "dev-c")
    t = time.time() - 3600
    decide(dlog, t, 3)
    dlog.close()
    start = start_of(t)
    end = start + PERIOD + min(GRACE_S, PERIOD / 2)  # a minute's bucket waits 30 s
    assert closed_drift(dlog.path, end - 0.5, 10) == []
    (row,) = closed_drift(dlog.path, end, 10)
    hour = drift_hour(row)
    assert (hour.hour, hour.period_s, hour.n) == (start, PERIOD, 3)
    assert "_period_s" not in hour.hist


class _Counter:
    def count(self, _key: str, _n: int = 1) -> None:
        pass


def test_rows_left_queued_without_an_outbox_batch_are_queued_again(tmp_path: Path) -> None:
    dlog = open_log(tmp_path / "log", "dev-z")
    decide(dlog, time.time() - 3600, 2)
    dlog.close()
    conn = sqlite3.connect(dlog.path, isolation_level=None)
    conn.execute(f"UPDATE {DRIFT_TABLE} SET uploaded = {QUEUED}")  # noqa: S608
    conn.close()
    with Outbox(tmp_path / "outbox.db", 1 << 20) as box:
        sender = QualitySender(dlog.path, "dev-z", box, _Counter(), batch=10)  # type: ignore[arg-type]
        assert sender.reconcile() == 1
        assert {s for _, s in drift_states(dlog.path).values()} == {NOT_UPLOADED}
        assert sender.fill_once() == 1  # queued: in the outbox and marked
        assert {s for _, s in drift_states(dlog.path).values()} == {QUEUED}
        assert sender.reconcile() == 0  # its batch is there
        (entry,) = box.oldest()
        assert entry.kind == KIND_QUALITY
        message = parse_quality(entry.payload)
        assert isinstance(message, DriftBatch)
        sender.delivered([entry])
        assert {s for _, s in drift_states(dlog.path).values()} == {UPLOADED}
        sender.close()


def test_quality_goes_right_after_thumbnails_also_in_an_order_written_without_it() -> None:
    assert full_drop_order(["thumbnail", "health", "event", "decisions"]) == (
        "thumbnail", "quality", "health", "event", "decisions",
    )  # fmt: skip
    assert full_drop_order(["decisions", "event", "health"])[:2] == ("thumbnail", "quality")
    assert full_drop_order(["health", "quality", "thumbnail", "event", "decisions"])[1] == (
        "quality"
    )
    with pytest.raises(ValueError, match="quality"):
        full_drop_order(["quality", "quality", "health", "event", "decisions"])


def test_key_of_a_drift_batch_entry_names_its_totals(tmp_path: Path) -> None:
    dlog = open_log(tmp_path / "log", "dev-k")
    decide(dlog, time.time() - 3600, 6)
    dlog.close()
    with Outbox(tmp_path / "outbox.db", 1 << 20) as box:
        sender = QualitySender(dlog.path, "dev-k", box, _Counter(), batch=10)  # type: ignore[arg-type]
        sender.fill_once()
        (entry,) = box.oldest()
        (ident,) = entry.ids
        assert json.loads(ident[2:])[-1] == 6
        sender.close()


def test_the_frame_of_a_disagreement_is_queued_as_its_decisions_thumbnail(
    tmp_path: Path,
) -> None:
    """The fleet draws both models on the frame the shadow kept: it goes up as the
    decision's own thumbnail (the same frame), and only for disagreements."""
    import numpy as np

    from agent.uplink.outbox import KIND_THUMBNAIL
    from agent.wire.codec import parse
    from agent.wire.decisions import ThumbnailUpload

    dlog = open_log(tmp_path / "log", "dev-t")
    dlog.close()
    store = ShadowStore(tmp_path / "log", dlog.config)
    now = time.time()
    frame = np.full((48, 64, 3), 90, np.uint8)
    agreeing, disagreeing = (
        "0190d3a8-0000-7000-8000-000000000001",
        "0190d3a8-0000-7000-8000-000000000002",
    )
    store.write(_shadow_row(agreeing, now - 2, agree=True))  # the runner keeps no frame
    store.write(_shadow_row(disagreeing, now - 1, agree=False), frame)
    assert store.flush() == 2
    store.close()
    with Outbox(tmp_path / "outbox.db", 1 << 20) as box:
        sender = QualitySender(
            dlog.path,
            "dev-t",
            box,
            _Counter(),
            batch=10,
            thumbnails_dir=tmp_path / "log",  # type: ignore[arg-type]
        )
        assert sender.fill_once() == 2
        thumbs = [e for e in box.oldest() if e.kind == KIND_THUMBNAIL]
        assert [e.ids for e in thumbs] == [(disagreeing,)]
        upload = parse(ThumbnailUpload, thumbs[0].payload)
        assert upload.decision_id == disagreeing
        assert thumbs[0].topic == topics.thumbnails("dev-t")
        sender.close()
