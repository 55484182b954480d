"""The fleet storage's data access, on SQLite and on PostgreSQL (see db_fixtures)."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from dataclasses import replace

import pytest
from sqlalchemy.engine import Engine

from fleet_server.db import (
    RolloutConflict,
    StorageError,
    TokenRejected,
    make_engine,
    store,
    upgrade,
)
from fleet_server.db.store import (
    DecisionRecord,
    EventRecord,
    Record,
    RolloutDevice,
    RolloutRecord,
)

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # the db, db_url and pg_cluster fixtures

JOIN_TIMEOUT_S = 60.0


def heartbeats(device_id: str, ids: range, ts0: float = 1000.0) -> list[Record]:
    return [Record(device_id, f"r{i:06d}", ts0 + i, {"seq": i}) for i in ids]


# -- idempotent ingest ---------------------------------------------------------------


def test_same_heartbeat_batch_twice_is_stored_once(db: Engine) -> None:
    batch = heartbeats("dev-a", range(50))
    assert store.insert_heartbeats(db, batch) == 50
    assert store.insert_heartbeats(db, batch) == 0
    assert store.count_records(db, "heartbeats") == 50


def test_batch_overlapping_stored_rows_counts_only_new_ones(db: Engine) -> None:
    store.insert_heartbeats(db, heartbeats("dev-a", range(10)))
    assert store.insert_heartbeats(db, heartbeats("dev-a", range(5, 15))) == 5
    assert store.count_records(db, "heartbeats", "dev-a") == 15


def test_duplicate_inside_one_batch_is_stored_once_and_the_first_copy_wins(db: Engine) -> None:
    first = Record("dev-a", "r1", 1.0, {"v": "first"})
    second = Record("dev-a", "r1", 2.0, {"v": "second"})
    assert store.insert_telemetry(db, [first, second]) == 1
    assert store.list_telemetry(db, "dev-a") == [first]


def test_same_record_id_on_two_devices_is_two_records(db: Engine) -> None:
    rows = [Record("dev-a", "r1", 1.0, {}), Record("dev-b", "r1", 1.0, {})]
    assert store.insert_heartbeats(db, rows) == 2


def test_decisions_and_events_are_stored_once_and_read_back(db: Engine) -> None:
    decision = DecisionRecord(
        "0190f1b2-0000-7000-8000-000000000001", "dev-a", 10.0, "cam1", "reject",
        "scratch", "1.2.0", {"scores": [0.1, 0.9], "extra": {"kept": True}},
    )  # fmt: skip
    event = EventRecord("dev-a", "e1", 11.0, "install", {"phase": "verified"})
    assert store.insert_decisions(db, [decision, decision]) == 1
    assert store.insert_decisions(db, [decision]) == 0
    assert store.insert_events(db, [event]) == 1
    assert store.insert_events(db, [event]) == 0
    assert store.list_decision_records(db, "dev-a") == [decision]
    assert store.list_events(db, "dev-a", kind="install") == [event]
    assert store.list_events(db, kind="alarm") == []


def test_empty_batch_inserts_nothing(db: Engine) -> None:
    assert store.insert_heartbeats(db, []) == 0
    assert store.insert_events(db, []) == 0


def test_overlapping_batches_from_two_processes_store_each_record_once(db_url: str) -> None:
    from tests.fleet_server.db_fixtures import ingest_worker  # loaded as a plugin: import it late

    engine = make_engine(db_url)
    upgrade(engine)
    rows = heartbeats("dev-a", range(6000))
    # The same records in the same batches, in opposite order within each batch: without
    # a common lock order, PostgreSQL would see deadlocks here.
    batches_a = [rows[i : i + 1500] for i in range(0, len(rows), 1500)]
    batches_b = [list(reversed(b)) for b in batches_a]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results: multiprocessing.Queue[int] = ctx.Queue(maxsize=2)
    procs = [
        ctx.Process(
            target=ingest_worker,
            args=(db_url, batches, barrier, results),
        )
        for batches in (batches_a, batches_b)
    ]
    for p in procs:
        p.start()
    counts: list[int] = []
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        while len(counts) < 2 and time.monotonic() < deadline:
            try:
                counts.append(results.get(timeout=0.2))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    break  # a worker died: its exit code fails the test below
    finally:
        for p in procs:
            p.join(JOIN_TIMEOUT_S)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    assert sum(counts) == 6000
    assert store.count_records(engine, "heartbeats") == 6000
    engine.dispose()


def test_overlapping_batches_from_two_threads_store_each_record_once(db: Engine) -> None:
    barrier = threading.Barrier(2, timeout=JOIN_TIMEOUT_S)
    counts: list[int] = []
    errors: list[BaseException] = []

    def worker(ids: range) -> None:
        try:
            rows = heartbeats("dev-t", ids)
            barrier.wait()
            counts.append(
                sum(store.insert_heartbeats(db, rows[i : i + 40]) for i in range(0, len(rows), 40))
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(r,)) for r in (range(0, 800), range(400, 1200))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    assert errors == []
    assert sum(counts) == 1200
    assert store.count_records(db, "heartbeats", "dev-t") == 1200


def test_lists_are_newest_first_and_honour_since_and_limit(db: Engine) -> None:
    store.insert_heartbeats(db, heartbeats("dev-a", range(10), ts0=100.0))
    newest = store.list_heartbeats(db, "dev-a", limit=3)
    assert [r.ts for r in newest] == [109.0, 108.0, 107.0]
    assert len(store.list_heartbeats(db, "dev-a", since=105.0)) == 5
    with pytest.raises(StorageError, match="limit 0"):
        store.list_heartbeats(db, "dev-a", limit=0)


def test_count_of_an_unknown_table_is_refused(db: Engine) -> None:
    with pytest.raises(StorageError, match="not a record table"):
        store.count_records(db, "devices")


# -- quarantine ----------------------------------------------------------------------


def test_quarantine_keeps_topic_reason_full_size_and_a_truncated_payload(db: Engine) -> None:
    qid = store.quarantine(db, "fleet/dev-a/telemetry", "not JSON", b"x" * 100, now=5.0, cap=16)
    [row] = store.list_quarantine(db)
    assert (row.id, row.topic, row.reason, row.size, row.payload, row.received_at) == (
        qid, "fleet/dev-a/telemetry", "not JSON", 100, b"x" * 16, 5.0,
    )  # fmt: skip
    assert store.count_records(db, "quarantine") == 1


def test_quarantine_keeps_only_the_newest_rows(db: Engine) -> None:
    for i in range(7):
        store.quarantine(db, "t", f"bad {i}", bytes([i]), keep=3)
    assert [q.reason for q in store.list_quarantine(db)] == ["bad 6", "bad 5", "bad 4"]


# -- tokens --------------------------------------------------------------------------


def test_token_enrolls_once_and_a_second_use_is_rejected(db: Engine) -> None:
    h = store.hash_token("s3cret-token")
    store.create_token(db, h, "dev-a", labels={"line": "3"}, profile="jetson-orin", ttl_s=60, now=0)
    used = store.consume_token(db, h, now=10)
    assert (used.device_id, used.labels, used.profile, used.used_at) == (
        "dev-a", {"line": "3"}, "jetson-orin", 10,
    )  # fmt: skip
    with pytest.raises(TokenRejected, match="already used"):
        store.consume_token(db, h, now=11)


def test_expired_and_unknown_tokens_are_rejected(db: Engine) -> None:
    h = store.hash_token("old")
    store.create_token(db, h, "dev-a", labels={}, profile="x86", ttl_s=60, now=0)
    with pytest.raises(TokenRejected, match="expired"):
        store.consume_token(db, h, now=60)
    with pytest.raises(TokenRejected, match="unknown"):
        store.consume_token(db, store.hash_token("never issued"), now=1)


def test_two_threads_racing_for_one_token_only_one_wins(db: Engine) -> None:
    h = store.hash_token("race")
    store.create_token(db, h, "dev-a", labels={}, profile="x86", ttl_s=60)
    barrier = threading.Barrier(4, timeout=JOIN_TIMEOUT_S)
    outcomes: list[str] = []

    def use() -> None:
        barrier.wait()
        try:
            store.consume_token(db, h)
            outcomes.append("ok")
        except TokenRejected:
            outcomes.append("rejected")

    threads = [threading.Thread(target=use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    assert sorted(outcomes) == ["ok", "rejected", "rejected", "rejected"]


def test_creating_a_token_twice_is_refused(db: Engine) -> None:
    h = store.hash_token("dup")
    store.create_token(db, h, "dev-a", labels={}, profile="x86", ttl_s=60)
    with pytest.raises(StorageError, match="exists"):
        store.create_token(db, h, "dev-b", labels={}, profile="x86", ttl_s=60)


# -- devices -------------------------------------------------------------------------


def _fleet(db: Engine) -> None:
    store.upsert_device(db, "a", labels={"line": "3", "site.zone": "n"}, profile="jetson-orin")
    store.upsert_device(db, "b", labels={"line": "3"}, profile="x86")
    store.upsert_device(db, "c", labels={"line": "4"}, profile="jetson-orin")
    store.upsert_device(db, "d", labels={}, profile="jetson-orin", revoked=True)


def test_selector_matches_labels_and_profile_together(db: Engine) -> None:
    _fleet(db)

    def ids(selector: dict[str, str] | None, **kw: bool) -> list[str]:
        return [d.device_id for d in store.list_devices(db, selector, **kw)]

    assert ids({"line": "3", "profile": "jetson-orin"}) == ["a"]
    assert ids({"line": "3"}) == ["a", "b"]
    assert ids({"profile": "jetson-orin"}) == ["a", "c", "d"]
    assert ids({"profile": "jetson-orin"}, include_revoked=False) == ["a", "c"]
    assert ids({"site.zone": "n"}) == ["a"]
    assert ids({"line": "5"}) == []
    assert ids({}) == ["a", "b", "c", "d"]
    assert ids(None) == ["a", "b", "c", "d"]


def test_upsert_updates_given_fields_and_keeps_the_others(db: Engine) -> None:
    store.upsert_device(db, "a", labels={"line": "3"}, profile="x86", cert_serial="42", now=7.0)
    store.upsert_device(
        db, "a", agent_version="0.2.0", active_bundle="scratch", active_release=3,
        health={"fps": 30.0, "p99_ms": {"scratch": 12.5}}, now=99.0,
    )  # fmt: skip
    dev = store.get_device(db, "a")
    assert dev is not None
    assert (dev.labels, dev.profile, dev.cert_serial, dev.enrolled_at) == (
        {"line": "3"}, "x86", "42", 7.0,
    )  # fmt: skip
    assert (dev.agent_version, dev.active_bundle, dev.active_release) == ("0.2.0", "scratch", 3)
    assert dev.health == {"fps": 30.0, "p99_ms": {"scratch": 12.5}}
    assert (dev.online, dev.revoked, dev.last_seen) == (False, False, None)
    assert store.get_device(db, "nobody") is None


def test_labels_must_be_strings(db: Engine) -> None:
    with pytest.raises(StorageError, match="labels must map str to str"):
        store.upsert_device(db, "a", labels={"line": 3})  # type: ignore[dict-item]


def test_last_seen_only_moves_forward_and_online_follows_the_latest_report(db: Engine) -> None:
    store.upsert_device(db, "a")
    assert store.mark_seen(db, "a", 100.0, online=True)
    assert store.mark_seen(db, "a", 50.0, online=False)  # a late last will
    dev = store.get_device(db, "a")
    assert dev is not None
    assert (dev.last_seen, dev.online) == (100.0, False)
    assert not store.mark_seen(db, "nobody", 1.0, online=True)


def test_touch_devices_marks_a_batch_online_and_counts_known_devices(db: Engine) -> None:
    store.upsert_device(db, "a")
    store.upsert_device(db, "b")
    store.mark_seen(db, "b", 500.0, online=False)
    assert store.touch_devices(db, {"a": 10.0, "b": 20.0, "ghost": 30.0}) == 2
    a, b = store.get_device(db, "a"), store.get_device(db, "b")
    assert a is not None
    assert b is not None
    assert (a.last_seen, a.online, b.last_seen, b.online) == (10.0, True, 500.0, True)


# -- rollouts ------------------------------------------------------------------------


def _rollout(rid: str = "r1") -> RolloutRecord:
    return RolloutRecord(
        rollout_id=rid, bundle="scratch", release=4, version="1.3.0",
        selector={"line": "3", "profile": "jetson-orin"}, waves=[1, "10%", "50%", "100%"],
        soak_s=600.0, policy={"auto_rollback": True, "approve_between_waves": False},
        state="pending", controller_state={"wave": 0, "gates": {"p99_ms": [12.0, None]}},
    )  # fmt: skip


def test_rollout_round_trips_through_save_and_load(db: Engine) -> None:
    saved = store.save_rollout(db, _rollout(), now=1.0)
    assert (saved.revision, saved.created_at, saved.updated_at) == (1, 1.0, 1.0)
    assert store.load_rollout(db, "r1") == saved
    moved = store.save_rollout(
        db, replace(saved, state="wave", controller_state={"wave": 1}), now=2.0
    )
    assert (moved.revision, moved.created_at, moved.updated_at) == (2, 1.0, 2.0)
    assert store.load_rollout(db, "r1") == moved
    assert store.load_rollout(db, "nope") is None


def test_saving_a_stale_rollout_copy_is_refused(db: Engine) -> None:
    first = store.save_rollout(db, _rollout())
    store.save_rollout(db, replace(first, state="paused"))
    with pytest.raises(RolloutConflict, match="stored at revision 2, this copy is revision 1"):
        store.save_rollout(db, replace(first, state="cancelled"))
    with pytest.raises(RolloutConflict, match="exists"):
        store.save_rollout(db, _rollout())
    loaded = store.load_rollout(db, "r1")
    assert loaded is not None
    assert loaded.state == "paused"


def test_rollouts_list_by_state(db: Engine) -> None:
    store.save_rollout(db, _rollout("r1"), now=1.0)
    store.save_rollout(db, replace(_rollout("r2"), state="done"), now=2.0)
    assert [r.rollout_id for r in store.list_rollouts(db)] == ["r1", "r2"]
    assert [r.rollout_id for r in store.list_rollouts(db, ["done"])] == ["r2"]


def test_rollout_device_status_is_set_and_replaced(db: Engine) -> None:
    store.save_rollout(db, _rollout())
    store.set_rollout_devices(
        db, "r1", [RolloutDevice("b", 1, "pending"), RolloutDevice("a", 0, "pending")], now=1.0
    )
    store.set_rollout_device_status(db, "r1", "b", wave=1, status="installed", now=2.0)
    assert store.list_rollout_devices(db, "r1") == [
        RolloutDevice("a", 0, "pending", 1.0),
        RolloutDevice("b", 1, "installed", 2.0),
    ]
    with pytest.raises(StorageError, match=r"rollout 'ghost'.*not stored"):
        store.set_rollout_device_status(db, "ghost", "a", wave=0, status="pending")


def test_rollout_and_device_statuses_commit_together_in_one_transaction(db: Engine) -> None:
    def crash_after_both_writes() -> None:
        with store.write_transaction(db) as conn:
            store.save_rollout(conn, _rollout())
            store.set_rollout_device_status(conn, "r1", "a", wave=0, status="pending")
            raise RuntimeError("controller crashed")

    with pytest.raises(RuntimeError, match="controller crashed"):
        crash_after_both_writes()
    assert store.load_rollout(db, "r1") is None
    with store.write_transaction(db) as conn:
        store.save_rollout(conn, _rollout())
        store.set_rollout_device_status(conn, "r1", "a", wave=0, status="pending")
    assert len(store.list_rollout_devices(db, "r1")) == 1


# -- engines ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("mysql://h/db", "unsupported database"),
        ("sqlite://", "needs a file"),
        ("not a url", "can't parse"),
    ],
)
def test_unusable_database_urls_are_refused_with_the_reason(url: str, reason: str) -> None:
    with pytest.raises(StorageError, match=reason):
        make_engine(url)
