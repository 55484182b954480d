"""One device can't hurt the fleet (issue 13), on SQLite and on PostgreSQL: a record the
database can't store is isolated and quarantined while the other devices' records are
stored once; a database that can't store anything just now is retried a bounded number
of times and the records are left for redelivery; device clocks are bounded; what a
device reports of its labels and profile is not the fleet's; a worker's health shows
when it can't do its job."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from agent.wire import topics
from agent.wire.messages import (
    BundleRef,
    DecisionRow,
    DecisionUpload,
    Heartbeat,
    ReportedState,
    encode,
)
from fleet_server.db import make_engine, store
from fleet_server.db.engine import SQLITE_IMMEDIATE
from fleet_server.health import HealthRegistry
from fleet_server.ingest import IngestStats, IngestWorker
from fleet_server.ingest.batch import Batch
from fleet_server.ingest.clock import ClockBounds
from fleet_server.ingest.failures import RetryPolicy, classify
from fleet_server.ingest.health import register_health
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.review import DecisionFilter, get_decision, list_decisions
from tests.fleet_server.test_sqlsink import Publisher, _row
from tests.support.broker import Broker

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # the db, db_url and pg_cluster fixtures

NOW = 1_800_000_000.0
FAST = RetryPolicy(attempts=3, first_s=0.01, max_s=0.05)
WAIT_S = 30.0


def _wait(cond: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _deep(depth: int) -> dict[str, object]:
    top: dict[str, object] = {}
    node = top
    for _ in range(depth):
        child: dict[str, object] = {}
        node["a"] = child
        node = child
    return top


def _decision(device_id: str, n: int, **changes: object) -> DecisionRow:
    row = _row(device_id, n)
    update = {"capture_time": NOW + n - 0.01, "decision_time": NOW + n, **changes}
    return row.model_copy(update=update)


POISON: dict[str, Callable[[], DecisionRow]] = {
    "nul": lambda: _decision("dev-b", 1, outcome="pa\x00ss"),
    "lone_surrogate": lambda: _decision("dev-b", 1, outcome="\ud800"),
    "deep_nesting": lambda: _decision("dev-b", 1, outputs=_deep(5000)),
}
"""Decision rows that pass no wire parser (these are built in code) and that a database
can't store; SQLite stores NUL in text, PostgreSQL does not. (An integer beyond 64 bits:
see the state test; in JSON both databases take it.)"""


def _storable_on(kind: str, dialect: str) -> bool:
    return kind == "nul" and dialect == "sqlite"


@pytest.mark.parametrize("kind", sorted(POISON))
def test_a_poison_record_is_quarantined_and_the_other_devices_records_are_stored_once(
    db: Engine, kind: str
) -> None:
    good = [_decision(d, n) for d in ("dev-a", "dev-c") for n in range(5)]
    poison = POISON[kind]()
    batch = Batch()
    for i, row in enumerate(good[:5]):
        batch.add_parsed(topics.decisions("dev-a"), f"a{i}".encode(), [row])
    batch.add_parsed(topics.decisions("dev-b"), b"the poison's payload", [poison])
    for i, row in enumerate(good[5:]):
        batch.add_parsed(topics.decisions("dev-c"), f"c{i}".encode(), [row])
    stats = IngestStats()
    batch.store(SqlSink(db), stats, threading.Event(), FAST)

    assert batch.complete
    assert batch.failed == set()
    stored = {(r.device_id, r.id) for r in store.list_decision_records(db)}
    if _storable_on(kind, db.dialect.name):
        assert stored == {(r.device_id, r.id) for r in [*good, poison]}
        assert (stats.stored, stats.quarantined) == (11, 0)
        return
    assert stored == {(r.device_id, r.id) for r in good}
    assert (stats.stored, stats.poison_isolated, stats.quarantined) == (10, 1, 1)
    assert stats.transient_retries == 0
    (held,) = store.list_quarantine(db)
    assert held.topic == topics.decisions("dev-b")
    assert held.payload == b"the poison's payload"
    assert f"can't store decisions ('dev-b', '{poison.id}')" in held.reason
    again = IngestStats()
    batch.store(SqlSink(db), again, threading.Event(), FAST)  # redelivered: stored once
    assert (again.stored, again.duplicates) == (0, 10)
    assert store.count_records(db, "decisions") == 10


def test_a_state_with_a_release_beyond_64_bits_is_quarantined_and_the_others_stored(
    db: Engine,
) -> None:
    huge = BundleRef(name="cls", version="9.0.0", release=2**70)
    bad = ReportedState(device_id="dev-b", ts=NOW, active=huge)
    fine = ReportedState(
        device_id="dev-a", ts=NOW, active=BundleRef(name="cls", version="2.0.0", release=2)
    )
    batch = Batch()
    batch.add_parsed(topics.state("dev-b"), b"b", [bad])
    batch.add_parsed(topics.state("dev-a"), b"a", [fine])
    stats = IngestStats()
    batch.store(SqlSink(db), stats, threading.Event(), FAST)
    assert (stats.states, stats.poison_isolated, stats.quarantined) == (1, 1, 1)
    device = store.get_device(db, "dev-a")
    assert device is not None
    assert device.active_release == 2
    (held,) = store.list_quarantine(db)
    assert "state of dev-b" in held.reason


def test_a_quarantine_entry_that_cant_be_stored_as_it_came_is_stored_escaped(
    db: Engine,
) -> None:
    batch = Batch()
    batch.reject("fleet/v1/devices/dev-b/events", "bad byte \x00 and \ud800 here", b"\x00\xff")
    stats = IngestStats()
    batch.store(SqlSink(db), stats, threading.Event(), FAST)
    assert stats.quarantined == 1
    (held,) = store.list_quarantine(db)
    assert held.reason == "bad byte \\x00 and \\ud800 here"
    assert held.payload == b"\x00\xff"


@contextmanager
def _database_locked(url: str, table: str) -> Iterator[Callable[[], None]]:
    """Another client holds ``table`` (SQLite: the whole database) locked until the
    function yielded is called or the block ends."""
    holder = make_engine(url)
    conn = holder.connect()
    conn.execution_options(**{SQLITE_IMMEDIATE: True})
    tx = conn.begin()
    if conn.dialect.name == "sqlite":
        conn.execute(sa.text("DELETE FROM quarantine WHERE id < 0"))  # takes the write lock
    else:
        conn.execute(sa.text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
    released = threading.Event()

    def release() -> None:
        if not released.is_set():
            released.set()
            tx.rollback()
            conn.close()

    try:
        yield release
    finally:
        release()
        holder.dispose()


def _impatient_engine(url: str) -> Engine:
    return make_engine(url, busy_timeout_s=0.05, statement_timeout_s=0.2)


def test_a_locked_database_is_retried_a_bounded_number_of_times_then_left_unacknowledged(
    db: Engine, db_url: str
) -> None:
    store.upsert_device(db, "dev-a")
    engine = _impatient_engine(db_url)
    batch = Batch()
    beat = Heartbeat(device_id="dev-a", seq=1, ts=NOW)
    batch.add_parsed(topics.heartbeat("dev-a"), b"hb", [beat])
    batch.add_parsed(topics.decisions("dev-c"), b"dc", [_decision("dev-c", 1)])
    stats = IngestStats()
    try:
        with _database_locked(db_url, "heartbeats"):
            batch.store(SqlSink(engine), stats, threading.Event(), FAST)
    finally:
        engine.dispose()
    assert batch.complete
    assert stats.transient_retries >= FAST.attempts - 1
    assert stats.poison_isolated == 0
    assert store.count_records(db, "quarantine") == 0  # a lock condemns no record
    assert 0 in batch.failed  # the heartbeat's message goes back to the broker
    if db.dialect.name == "postgresql":  # only heartbeats locked: the decision goes on
        assert batch.failed == {0}
        assert (stats.gave_up, stats.stored) == (1, 1)
        assert store.count_records(db, "decisions") == 1
    else:  # SQLite locks the whole database
        assert batch.failed == {0, 1}
        assert stats.gave_up == 2
    assert store.count_records(db, "heartbeats") == 0


def test_a_lock_released_during_the_retries_lets_the_records_in(db: Engine, db_url: str) -> None:
    engine = _impatient_engine(db_url)
    batch = Batch()
    beat = Heartbeat(device_id="dev-a", seq=1, ts=NOW)
    batch.add_parsed(topics.heartbeat("dev-a"), b"hb", [beat])
    stats = IngestStats()
    patient = RetryPolicy(attempts=1000, first_s=0.01, max_s=0.05)
    try:
        with _database_locked(db_url, "heartbeats") as release:
            lifter = threading.Thread(
                target=lambda: _wait(lambda: stats.transient_retries >= 2) and release()
            )
            lifter.start()
            batch.store(SqlSink(engine), stats, threading.Event(), patient)
            lifter.join(WAIT_S)
    finally:
        engine.dispose()
    assert stats.transient_retries >= 2
    assert (stats.stored, stats.gave_up, batch.failed) == (1, 0, set())
    assert store.count_records(db, "heartbeats") == 1


def test_errors_are_told_permanent_or_transient() -> None:
    locked = sa.exc.OperationalError("INSERT", {}, Exception("database is locked"))
    bad = sa.exc.DataError("INSERT", {}, Exception("invalid byte sequence"))
    assert classify(locked) == "transient"
    assert classify(sa.exc.DisconnectionError("gone")) == "transient"
    assert classify(sa.exc.ProgrammingError("SELECT", {}, Exception("no table"))) == "transient"
    assert classify(bad) == "permanent"
    assert classify(sa.exc.IntegrityError("INSERT", {}, Exception("fk"))) == "permanent"
    assert classify(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogate")) == "permanent"
    assert classify(OverflowError("int too big")) == "permanent"
    assert classify(RecursionError()) == "permanent"
    assert classify(KeyError("a bug")) == "transient"


# -- clocks -----------------------------------------------------------------------


def test_device_times_out_of_bounds_are_quarantined_naming_the_field_and_bound(
    db: Engine,
) -> None:
    store.upsert_device(db, "dev-a")
    bounds = ClockBounds(max_future_s=3600, max_past_s=86_400)
    batch = Batch(bounds=bounds, clock=lambda: NOW)
    beats = {
        "fine": Heartbeat(device_id="dev-a", seq=1, ts=NOW - 10),
        "future": Heartbeat(device_id="dev-a", seq=2, ts=1e300),
        "past": Heartbeat(device_id="dev-a", seq=3, ts=NOW - 2 * 86_400),
    }
    for name, beat in beats.items():
        batch.add_parsed(topics.heartbeat("dev-a"), name.encode(), [beat])
    rows = [_decision("dev-a", 1), _decision("dev-a", 2, capture_time=NOW + 7200)]
    upload = DecisionUpload(device_id="dev-a", rows=rows)
    batch.add(topics.decisions("dev-a"), encode(upload), 1 << 20)
    stats = IngestStats()
    batch.store(SqlSink(db, clock=lambda: NOW + 1), stats, threading.Event(), FAST)

    assert [h.payload["seq"] for h in store.list_heartbeats(db, "dev-a")] == [1]
    assert [d.id for d in store.list_decision_records(db)] == [rows[0].id]
    reasons = sorted(q.reason for q in store.list_quarantine(db))
    assert len(reasons) == 3
    assert any("ts 1e+300 is" in r and "max_clock_skew_s 3600" in r for r in reasons)
    assert any("behind the server's clock (max_clock_age_s 86400)" in r for r in reasons)
    assert any(
        f"decisions row {rows[1].id}: capture_time" in r and "max_clock_skew_s" in r
        for r in reasons
    )
    device = store.get_device(db, "dev-a")
    assert device is not None
    assert device.last_seen == NOW + 1  # the receive time
    (decision,) = store.list_decision_records(db)
    assert decision.received_at == NOW + 1


def test_a_far_future_heartbeat_through_the_broker_is_quarantined_and_last_seen_not_pinned(
    db: Engine, own_mosquitto: Broker
) -> None:
    store.upsert_device(db, "dev-a")
    store.upsert_device(db, "dev-b")
    now = time.time()
    messages = [
        (topics.heartbeat("dev-b"), encode(Heartbeat(device_id="dev-b", seq=1, ts=now + 1e9))),
        (topics.heartbeat("dev-a"), encode(Heartbeat(device_id="dev-a", seq=1, ts=now))),
        (topics.heartbeat("dev-b"), encode(Heartbeat(device_id="dev-b", seq=2, ts=now))),
        *(
            (topics.heartbeat("dev-b"), b'{"device_id": "dev-b", "seq": 3, "ts": 1, "x": %s}' % x)
            for x in (b'"\\ud800"', b'"\\u0000"', b"1" + b"0" * 25, b"[" * 5000 + b"]" * 5000)
        ),
    ]
    worker = IngestWorker(own_mosquitto.host, own_mosquitto.port, sink=SqlSink(db))
    publisher = Publisher(own_mosquitto)
    try:
        worker.start()
        publisher.send(messages)
        assert _wait(lambda: worker.stats().stored + worker.stats().quarantined >= 7)
    finally:
        publisher.close()
        worker.stop()
    stats = worker.stats()
    assert (stats.stored, stats.quarantined, stats.internal_errors) == (2, 5, 0)
    assert store.count_records(db, "heartbeats") == 2
    reasons = [q.reason for q in store.list_quarantine(db)]
    assert any("max_clock_skew_s" in r for r in reasons), reasons
    after = time.time()
    for device_id in ("dev-a", "dev-b"):
        device = store.get_device(db, device_id)
        assert device is not None
        assert device.last_seen is not None
        assert now <= device.last_seen <= after


# -- the fleet's facts ------------------------------------------------------------


def test_reported_labels_and_profile_never_change_the_fleets_or_what_selectors_see(
    db: Engine,
) -> None:
    store.upsert_device(db, "dev-a", labels={"site": "north", "line": "3"}, profile="jetson")
    store.upsert_device(db, "dev-b", labels={"site": "south"}, profile="x86")
    claim = ReportedState(
        device_id="dev-b", ts=NOW, profile="jetson", labels={"site": "north", "line": "3"}
    )
    SqlSink(db, clock=lambda: NOW).store_state("dev-b", claim)
    device = store.get_device(db, "dev-b")
    assert device is not None
    assert (device.profile, device.labels) == ("x86", {"site": "south"})
    assert (device.reported_profile, device.reported_labels) == (
        "jetson",
        {"site": "north", "line": "3"},
    )
    chosen = store.list_devices(db, {"site": "north", store.PROFILE_KEY: "jetson"})
    assert [d.device_id for d in chosen] == ["dev-a"]


# -- health -----------------------------------------------------------------------


def test_health_fails_while_a_message_waits_too_long_and_when_the_worker_stopped(
    db: Engine, db_url: str, own_mosquitto: Broker
) -> None:
    store.upsert_device(db, "dev-a")
    engine = make_engine(db_url, busy_timeout_s=0.05, statement_timeout_s=0.2)
    worker = IngestWorker(
        own_mosquitto.host,
        own_mosquitto.port,
        sink=SqlSink(engine),
        max_lag_s=0.2,
        retry=RetryPolicy(attempts=100_000, first_s=0.01, max_s=0.05),
    )
    registry = HealthRegistry()
    register_health(registry, "ingest-0", worker)
    publisher = Publisher(own_mosquitto)
    try:
        worker.start()
        assert _wait(lambda: registry.check()["ingest-0"].ok)
        with _database_locked(db_url, "heartbeats") as release:
            beat = Heartbeat(device_id="dev-a", seq=1, ts=time.time())
            publisher.send([(topics.heartbeat("dev-a"), encode(beat))])
            assert _wait(lambda: not registry.check()["ingest-0"].ok)
            part = registry.check()["ingest-0"]
            # At least max_lag_s: the detail is rounded to the ms, so a check just past
            # 0.2 s shows 0.2.
            assert part.detail["oldest_wait_s"] >= 0.2
            assert any("max_lag_s" in p for p in part.detail["problems"])
            assert part.detail["connected"] is True
            assert _wait(lambda: worker.stats().transient_retries > 0)  # the lock, retried
            release()
            assert _wait(lambda: worker.stats().stored == 1)
        assert _wait(lambda: registry.check()["ingest-0"].ok)
    finally:
        publisher.close()
        worker.stop()
        engine.dispose()
    stopped = registry.check()["ingest-0"]
    assert not stopped.ok
    assert "worker thread not running" in stopped.detail["problems"]


def test_rows_stored_with_absurd_times_before_the_bounds_still_list_and_show(db: Engine) -> None:
    absurd = [
        store.DecisionRecord(f"id-{n}", "dev-a", ts, "cam1", "pass", "cls", "1", {"line": "3"})
        for n, ts in enumerate((1e300, 1e-300, NOW))
    ]
    assert store.insert_decisions(db, absurd) == 3
    page = list_decisions(db, DecisionFilter(), limit=2)
    assert [r.ts for r in page.rows] == [1e300, NOW]
    assert page.next_cursor is not None
    rest = list_decisions(db, DecisionFilter(), after=page.next_cursor, limit=2)
    assert [r.ts for r in rest.rows] == [1e-300]
    assert get_decision(db, "id-0").summary.ts == 1e300
