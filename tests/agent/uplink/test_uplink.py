"""The uplink against real parts: identities enrolled through a real HTTP endpoint and
fleet CA, a managed Mosquitto with TLS and per-device ACLs, the fleet's own identity as
the subscriber, a real decision log, the agent as a subprocess for the last will."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from agent.decisionlog import QUEUED, UPLOADED, DecisionLog, DecisionLogConfig
from agent.enrollment.identity import Identity
from agent.uplink import SysInfo, Uplink, UplinkError
from agent.uplink.acks import AckTracker
from agent.uplink.decisions import make_batch, pending_rows, rows_in_state, to_wire
from agent.uplink.sysinfo import process_cpu_s, rss_kb, temperatures
from agent.wire import topics
from agent.wire.jpeg import jpeg_size
from agent.wire.messages import (
    DecisionUpload,
    Event,
    Heartbeat,
    MessageError,
    ReportedState,
    ThumbnailUpload,
    parse,
    parse_telemetry,
)
from fleet_server.broker import ManagedBroker
from tests.agent.decisionlog.decisionlog_driver import make_record
from tests.agent.uplink.uplink_fixtures import (
    FAST,
    _broker_config,
    collect,
    on,
    open_log,
    thermal_tree,
    wait_until,
)
from tests.support.tls_peers import WAIT_S, Peer, Pki

DRIVER = Path(__file__).with_name("uplink_driver.py")


def test_uplink_reports_state_heartbeats_health_an_event_and_uploads_decisions(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer], uplinks: list[Uplink],
    tmp_path: Path,
) -> None:  # fmt: skip
    identity = enrolled("dev-a")
    peer = fleet()
    peer.subscribe(f"{topics.PREFIX}/devices/dev-a/#")
    dlog, ids = open_log(tmp_path / "log", "dev-a", 5)
    app_health = {
        "fps": {"cam-0": 12.5},
        "latency_ms": {"defects": {"p50": 4.0, "p95": 6.0, "p99": 9.5, "count": 100}},
        "queue_depth": {"cam-0": 1},
        "drops": {"deadline": 2},
    }
    active = {"name": "defects", "version": "1.2.0", "release": 7}
    uplink = Uplink(
        "dev-a",
        identity,
        FAST,
        state=lambda: {"agent_version": "0.9.1", "active": active},
        health=lambda: app_health,
        decision_log=dlog,
        sysinfo=SysInfo(tmp_path, thermal_root=thermal_tree(tmp_path / "thermal")),
    )
    uplinks.append(uplink)
    uplink.start()
    assert uplink.wait_connected(WAIT_S)
    event_id = uplink.event("install", {"bundle": "defects", "outcome": "committed"})

    def complete(got: list[tuple[str, bytes]]) -> bool:
        return (
            len(on(topics.heartbeat("dev-a"))(got)) >= 3
            and all(on(t("dev-a"))(got) for t in (topics.state, topics.telemetry, topics.events,
                                                   topics.decisions))
        )  # fmt: skip

    got = collect(peer, complete)
    state = parse(ReportedState, on(topics.state("dev-a"))(got)[0])
    assert state.online
    assert state.ts is not None
    assert state.agent_version == "0.9.1"
    assert state.active is not None
    assert state.active.release == 7
    assert state.labels == {"line": "3"}  # from enrollment
    assert state.profile == "jetson-orin"
    beats = [parse(Heartbeat, p) for p in on(topics.heartbeat("dev-a"))(got)]
    assert [b.seq for b in beats] == list(range(len(beats)))
    health = parse_telemetry(on(topics.telemetry("dev-a"))(got)[0])
    assert health.kind == "health"
    assert health.fps == {"cam-0": 12.5}
    assert health.latency_ms["defects"].p99 == 9.5
    assert health.queue_depth == {"cam-0": 1}
    assert health.drops == {"deadline": 2}
    assert health.memory_mb is not None
    assert health.memory_mb > 1
    assert health.disk_free_mb is not None
    assert health.disk_used_mb is not None
    assert health.temperature_c == {"cpu-thermal": 45.5, "cpu-thermal-thermal_zone2": -2.0}
    event = parse(Event, on(topics.events("dev-a"))(got)[0])
    assert (event.event_id, event.kind, event.payload["outcome"]) == (
        event_id, "install", "committed",
    )  # fmt: skip
    upload = parse(DecisionUpload, on(topics.decisions("dev-a"))(got)[0])
    assert [r.id for r in upload.rows] == ids
    assert upload.rows[0].outputs == {"label": "ok", "score": 0.25, "n": 0}

    wait_until(lambda: pending_rows(dlog.path, 100) == [])
    stats = uplink.stats()
    assert stats["decisions_uploaded"] == 5
    assert stats["refused"] == {}
    assert stats["acked"]["decisions"] == 1
    assert stats["acked"]["event"] == 1
    dlog.close()


def test_the_thumbnails_the_log_keeps_are_uploaded_before_their_decisions(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer], uplinks: list[Uplink],
    tmp_path: Path,
) -> None:  # fmt: skip
    identity = enrolled("dev-t")
    peer = fleet()
    peer.subscribe(f"{topics.PREFIX}/devices/dev-t/#")
    dlog = DecisionLog(
        tmp_path / "log", DecisionLogConfig(thumbnails="non-pass", thumbnail_max_side=64),
        device_id="dev-t",
    )  # fmt: skip
    dlog.open()
    frame = np.zeros((120, 160, 3), np.uint8)
    frame[40:80, 60:100] = (30, 30, 200)
    now = time.time()
    outcomes = ["reject", "pass", "review", "reject"]
    ids = [
        dlog.append(make_record(i, now - 5 + i * 0.01, outcome=o, thumbnail=frame))
        for i, o in enumerate(outcomes)
    ]
    assert dlog.flush()
    kept = {r["id"]: r["thumbnail"] for r in pending_rows(dlog.path, 10)}
    assert [i for i in ids if kept[i]] == [ids[0], ids[2], ids[3]]  # "non-pass" keeps three
    (tmp_path / "log" / kept[ids[3]]).unlink()  # as retention would have
    uplink = Uplink("dev-t", identity, FAST, state=dict, health=dict, decision_log=dlog)
    uplinks.append(uplink)
    uplink.start()
    assert uplink.wait_connected(WAIT_S)

    def done(got: list[tuple[str, bytes]]) -> bool:
        return bool(on(topics.decisions("dev-t"))(got))

    got = [(t, p) for t, p in collect(peer, done) if t.endswith(("/thumbnails", "/decisions"))]
    assert [t for t, _ in got] == [topics.thumbnails("dev-t")] * 2 + [topics.decisions("dev-t")]
    thumbs = [parse(ThumbnailUpload, p) for _, p in got[:2]]
    assert [t.decision_id for t in thumbs] == [ids[0], ids[2]]
    for thumb in thumbs:
        assert thumb.jpeg() == (tmp_path / "log" / kept[thumb.decision_id]).read_bytes()
        assert jpeg_size(thumb.jpeg()) == (64, 48)
    upload = parse(DecisionUpload, got[2][1])
    assert [r.id for r in upload.rows] == ids  # the one without its file is uploaded too
    wait_until(lambda: uplink.stats().get("thumbnails_uploaded") == 2)
    stats = uplink.stats()
    assert stats["thumbnails_queued"] == 2
    assert stats["thumbnails_missing"] == 1
    assert stats["acked"]["thumbnail"] == 2
    dlog.close()


def test_the_batcher_keeps_no_more_thumbnails_ahead_than_the_sender_can_take(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer], uplinks: list[Uplink],
    tmp_path: Path,
) -> None:  # fmt: skip
    identity = enrolled("dev-w")
    fleet()
    dlog = DecisionLog(tmp_path / "log", DecisionLogConfig(thumbnails="all"), device_id="dev-w")
    dlog.open()
    frame = np.full((32, 32, 3), 90, np.uint8)
    for i in range(40):
        dlog.append(make_record(i, time.time(), outcome="reject", thumbnail=frame))
    assert dlog.flush()
    # One record a second, one in flight: two windows ahead is two records.
    slow = FAST.model_copy(
        update={"drain_rate_per_s": 1.0, "drain_window": 1, "decisions_batch": 10}
    )
    uplink = Uplink("dev-w", identity, slow, state=dict, health=dict, decision_log=dlog)
    uplinks.append(uplink)
    uplink.start()
    assert uplink.wait_connected(WAIT_S)
    wait_until(lambda: uplink.stats().get("decision_batches", 0) >= 1)
    most = 0
    end = time.monotonic() + 2.0  # at one record a second, ~2 of the 11 leave meanwhile
    while time.monotonic() < end:
        most = max(most, uplink.stats()["outbox"]["pending_by_kind"]["thumbnail"])
        time.sleep(0.05)
    stats = uplink.stats()
    # Without the wait a second batch and its ten thumbnails would be queued at once.
    assert stats["decision_batches"] == 1
    assert stats["thumbnails_queued"] == 10
    assert most <= 10
    dlog.close()


def test_with_upload_thumbnails_off_only_the_decisions_go(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer], uplinks: list[Uplink],
    tmp_path: Path,
) -> None:  # fmt: skip
    identity = enrolled("dev-u")
    peer = fleet()
    peer.subscribe(f"{topics.PREFIX}/devices/dev-u/#")
    dlog = DecisionLog(tmp_path / "log", DecisionLogConfig(thumbnails="all"), device_id="dev-u")
    dlog.open()
    frame = np.full((32, 32, 3), 90, np.uint8)
    ids = [dlog.append(make_record(i, time.time(), thumbnail=frame)) for i in range(3)]
    assert dlog.flush()
    config = FAST.model_copy(update={"upload_thumbnails": False})
    uplink = Uplink("dev-u", identity, config, state=dict, health=dict, decision_log=dlog)
    uplinks.append(uplink)
    uplink.start()
    got = collect(peer, lambda g: bool(on(topics.decisions("dev-u"))(g)))
    assert on(topics.thumbnails("dev-u"))(got) == []
    assert [r.id for r in parse(DecisionUpload, on(topics.decisions("dev-u"))(got)[0]).rows] == ids
    assert "thumbnails_queued" not in uplink.stats()
    dlog.close()


def test_decision_upload_the_acl_refuses_is_counted_failed_and_never_marked_uploaded(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer], uplinks: list[Uplink],
    tmp_path: Path,
) -> None:  # fmt: skip
    identity = enrolled("dev-n")  # the certificate says dev-n; the uplink claims dev-x
    peer = fleet()
    peer.subscribe(f"{topics.PREFIX}/devices/dev-x/#")
    dlog, ids = open_log(tmp_path / "log", "dev-x", 3)
    uplink = Uplink("dev-x", identity, FAST, state=dict, health=dict, decision_log=dlog)
    uplinks.append(uplink)
    uplink.start()
    assert uplink.wait_connected(WAIT_S)
    wait_until(lambda: uplink.stats().get("outbox_refused_decisions", 0) >= 2)

    stats = uplink.stats()
    assert stats["refused"]["decisions"] >= 2
    assert stats.get("decisions_uploaded", 0) == 0
    assert rows_in_state(dlog.path, UPLOADED) == []
    assert sorted(rows_in_state(dlog.path, QUEUED)) == sorted(ids)  # still in the outbox
    assert stats["outbox"]["pending_by_kind"]["decisions"] == 1
    assert dlog.stats()["marked_uploaded"] == 0
    assert peer.flush() == []  # nothing reached the fleet as dev-x
    dlog.close()


def _retained_state(peer: Peer, device_id: str) -> ReportedState:
    peer.subscribe(topics.state(device_id))
    got = collect(peer, lambda g: bool(on(topics.state(device_id))(g)))
    return parse(ReportedState, on(topics.state(device_id))(got)[-1])


def test_killed_agent_leaves_its_retained_offline_will(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer]
) -> None:
    identity = enrolled("dev-k")
    peer = fleet()
    peer.subscribe(topics.state("dev-k"))
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), str(identity.directory.parent), "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "connected"
        got = collect(peer, lambda g: bool(on(topics.state("dev-k"))(g)))
        assert parse(ReportedState, got[-1][1]).online
        proc.kill()
        assert proc.wait(WAIT_S) == -9
        got = collect(peer, lambda g: bool(on(topics.state("dev-k"))(g)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT_S)
    will = parse(ReportedState, got[-1][1])
    assert (will.online, will.ts) == (False, None)
    assert _retained_state(fleet(), "dev-k").online is False


def test_stop_disconnects_with_the_will_so_the_fleet_sees_the_device_offline(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer]
) -> None:
    identity = enrolled("dev-s")
    uplink = Uplink("dev-s", identity, FAST, state=dict, health=dict)
    uplink.start()
    try:
        assert uplink.wait_connected(WAIT_S)
        assert _retained_state(fleet(), "dev-s").online
    finally:
        uplink.stop()
    assert not uplink.connected
    assert _retained_state(fleet(), "dev-s").online is False
    with pytest.raises(UplinkError, match="not running"):
        uplink.event("alarm", {})


def test_uplink_reconnects_after_a_broker_restart_and_reports_online_again(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer], uplinks: list[Uplink],
    pki: Pki, tmp_path: Path,
) -> None:  # fmt: skip
    identity = enrolled("dev-r")
    with ManagedBroker(_broker_config(pki, tmp_path / "own-broker")) as own:
        config = FAST.model_copy(update={"broker_port": own.config.port})
        uplink = Uplink("dev-r", identity, config, state=dict, health=dict)
        uplinks.append(uplink)
        uplink.start()
        assert uplink.wait_connected(WAIT_S)
        first = _retained_state(fleet(own.config.port), "dev-r")
        own.restart()
        wait_until(lambda: uplink.stats().get("connects", 0) >= 2, timeout_s=20)
        wait_until(lambda: uplink.stats()["acked"].get("state", 0) >= 2)
        again = _retained_state(fleet(own.config.port), "dev-r")
        uplink.stop()
    assert again.online
    assert again.ts is not None
    assert first.ts is not None
    assert again.ts > first.ts
    assert uplink.stats()["disconnects"] >= 1


def test_a_row_that_cannot_be_sent_is_set_aside_and_the_others_are_uploaded(
    enrolled: Callable[[str], Identity], uplinks: list[Uplink], tmp_path: Path
) -> None:
    identity = enrolled("dev-v")
    dlog, ids = open_log(tmp_path / "log", "dev-v", 4)
    conn = sqlite3.connect(dlog.path)
    conn.execute("UPDATE decisions SET outputs = 'not json', uploaded = 0 WHERE id = ?", (ids[1],))
    conn.commit()
    conn.close()
    uplink = Uplink("dev-v", identity, FAST, state=dict, health=dict, decision_log=dlog)
    uplinks.append(uplink)
    uplink.start()
    wait_until(lambda: uplink.stats().get("decisions_uploaded", 0) == 3)
    assert uplink.stats()["decisions_invalid"] == 1
    assert [r["id"] for r in pending_rows(dlog.path, 100)] == [ids[1]]
    dlog.close()


def test_an_event_queued_before_start_is_sent_after_and_a_bad_kind_is_refused(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer]
) -> None:
    identity = enrolled("dev-e")
    peer = fleet()
    peer.subscribe(topics.events("dev-e"))
    uplink = Uplink("dev-e", identity, FAST, state=dict, health=dict)
    early = uplink.event("install", {"outcome": "committed"})  # into the outbox
    with pytest.raises(MessageError, match="event kind"):
        uplink.event("Not A Kind", {})
    uplink.start()
    try:
        got = collect(peer, lambda g: bool(on(topics.events("dev-e"))(g)))
        wait_until(lambda: uplink.stats()["outbox"]["pending_by_kind"]["event"] == 0)
    finally:
        uplink.stop()
    assert parse(Event, got[0][1]).event_id == early
    assert uplink.stats()["delivered_event"] == 1


# --- pure parts ----------------------------------------------------------------------


def test_an_answer_that_arrives_before_the_publisher_tracks_it_is_matched() -> None:
    acks = AckTracker(bound=8)
    acks.on_ack(5, ReasonCode(PacketTypes.PUBACK, "Not authorized"))
    early = acks.track(5, "decisions")
    assert early.done.is_set()
    assert not early.ok
    late = acks.track(6, "event")
    assert not late.done.is_set()
    acks.on_ack(6, ReasonCode(PacketTypes.PUBACK, "Success"))
    assert late.ok
    assert (acks.refused["decisions"], acks.acked["event"], acks.outstanding()) == (1, 1, 0)
    forgotten = acks.track(7, "decisions")
    acks.forget(forgotten)
    assert acks.abandoned["decisions"] == 1


def test_an_upload_over_the_size_cap_is_cut_to_the_rows_that_fit(tmp_path: Path) -> None:
    dlog, _ = open_log(tmp_path, "dev-b", 0)
    for i in range(8):
        dlog.append(make_record(i, time.time(), outputs={"blob": "x" * 2000, "n": i}))
    assert dlog.flush()
    rows, bad = to_wire(pending_rows(dlog.path, 100), "dev-b")
    dlog.close()
    assert bad == {}
    batch, unsendable = make_batch("dev-b", rows, max_bytes=9000)
    assert batch is not None
    assert unsendable == {}
    assert batch.ids == tuple(r.id for r in rows[:2])
    assert len(batch.payload) <= 9000
    alone, too_big = make_batch("dev-b", rows[:1], max_bytes=500)
    assert alone is None
    assert rows[0].id in too_big
    foreign, why = to_wire(pending_rows(dlog.path, 1), "dev-c")
    assert foreign == []
    assert "dev-b" in next(iter(why.values()))


def test_a_station_decisions_fields_go_in_its_upload_and_a_bad_part_id_is_set_aside(
    tmp_path: Path,
) -> None:
    dlog, _ = open_log(tmp_path, "dev-s", 0)
    t = time.time()
    late = dlog.append(make_record(0, t, station="st-1", part_id="P-0042", deadline_missed=True))
    free = dlog.append(make_record(1, t + 0.01))
    bad = dlog.append(make_record(2, t + 0.02, station="st-1", part_id="P-\x1b[2J"))
    assert dlog.flush()
    rows, unsendable = to_wire(pending_rows(dlog.path, 100), "dev-s")
    dlog.close()
    assert list(unsendable) == [bad]
    assert "part_id" in unsendable[bad]
    assert "U+001B" in unsendable[bad]
    batch, too_big = make_batch("dev-s", rows)
    assert batch is not None
    assert too_big == {}
    upload = parse(DecisionUpload, batch.payload)
    got = {r.id: (r.station, r.part_id, r.deadline_missed) for r in upload.rows}
    assert got == {late: ("st-1", "P-0042", True), free: ("", "", False)}
    sent = json.loads(batch.payload)["rows"]
    assert [(r["station"], r["part_id"], r["deadline_missed"]) for r in sent] == [
        ("st-1", "P-0042", True),
        ("", "", False),
    ]


def test_sysinfo_reads_temperatures_memory_cpu_and_disk(tmp_path: Path) -> None:
    assert temperatures(thermal_tree(tmp_path / "thermal")) == {
        "cpu-thermal": 45.5, "cpu-thermal-thermal_zone2": -2.0,
    }  # fmt: skip
    assert temperatures(tmp_path / "no-such-dir") == {}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        proc = Path("/proc") / str(child.pid)
        wait_until(lambda: (rss_kb(proc / "status") or 0) > 0)
        assert process_cpu_s(proc / "stat") is not None
        info = SysInfo(tmp_path, pids=lambda: [child.pid], thermal_root=tmp_path / "none")
        own = rss_kb(Path("/proc/self/status")) or 0
        total = info.memory_mb()
        assert total is not None
        assert total * 1024 > own  # the worker's memory is added to the agent's
        end = time.monotonic() + 0.3
        spins = 0
        while time.monotonic() < end:  # use some CPU: bounded by time
            spins += sum(range(1000))
        sample: dict[str, Any] = info.sample()
    finally:
        child.kill()
        child.wait(WAIT_S)
    assert sample["cpu_percent"] > 0
    assert 0 <= sample["system_cpu_percent"] <= 100
    assert sample["disk_free_mb"] > 0
    assert sample["temperature_c"] == {}
    assert rss_kb(tmp_path / "missing") is None
