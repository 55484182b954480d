"""The database figures of /metrics on SQLite and PostgreSQL: devices and devices online
by shard (NULL is main, revoked devices left out), quarantined payloads by reason class
(reasons written by the real validators), and the cache between scrapes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from agent.wire.messages import Heartbeat, MessageError, parse
from fleet_server.db import make_engine, sqlite_url, store
from fleet_server.db.errors import StorageError
from fleet_server.ingest.clock import ClockBounds, ClockSkew, check_record
from fleet_server.metrics.dbfigures import CachedFigures, read_figures

pytest_plugins = ["tests.fleet_server.db_fixtures"]


def _error(call: object) -> str:
    try:
        call()  # type: ignore[operator]
    except (MessageError, ClockSkew) as exc:
        return str(exc)
    raise AssertionError("no error")


def test_devices_and_online_devices_are_counted_by_shard(db: Engine) -> None:
    for device_id, shard, online, revoked in (
        ("d1", None, True, False),  # enrolled before shards: main
        ("d2", "main", False, False),
        ("d3", "east", True, False),
        ("d4", "east", True, True),  # revoked: not counted
        ("d5", "west", False, False),
    ):
        store.upsert_device(db, device_id, labels={}, profile="x86-gateway", shard=shard)
        if online:
            store.mark_seen(db, device_id, 100.0, True)
        if revoked:
            store.upsert_device(db, device_id, revoked=True)
    figures = read_figures(db)
    assert figures.devices == {"main": 2, "east": 1, "west": 1}
    assert figures.online == {"main": 1, "east": 1, "west": 0}


def test_quarantined_payloads_are_counted_by_a_bounded_reason_class(db: Engine) -> None:
    now = time.time()
    reasons = [
        _error(lambda: parse(Heartbeat, b"{not json")),
        _error(lambda: parse(Heartbeat, b'{"kind": "heartbeat"}')),
        _error(lambda: parse(Heartbeat, b"x" * 100, max_bytes=10)),
        _error(
            lambda: check_record(ClockBounds(), Heartbeat(device_id="d1", seq=0, ts=now + 1e6), now)
        ),
        "can't store heartbeat d1/heartbeat:0:1.0: IntegrityError: ...",  # batch.py's form
        "internal error: RuntimeError('boom')",  # worker.py's form
    ]
    for i, reason in enumerate(reasons):
        store.quarantine(db, f"edgefleet/v1/devices/d{i}/heartbeat", reason, b"payload")
    assert read_figures(db).quarantine == {
        "invalid": 2,
        "too_large": 1,
        "clock": 1,
        "unstorable": 1,
        "internal": 1,
    }


def test_figures_are_reused_within_cache_s_and_read_again_after(db: Engine) -> None:
    now = [0.0]
    cached = CachedFigures(db, 5.0, clock=lambda: now[0])
    first = cached.get()
    store.upsert_device(db, "d9", labels={}, profile="x86-gateway")
    now[0] = 4.9
    assert cached.get() is first
    assert cached.reads == 1
    now[0] = 5.0
    assert cached.get().devices == {"main": 1}
    assert cached.reads == 2


def test_a_database_that_does_not_answer_is_a_storage_error(tmp_path: Path) -> None:
    engine = make_engine(sqlite_url(tmp_path / "no" / "such" / "dir" / "fleet.db"))
    try:
        with pytest.raises(StorageError, match="metrics"):
            read_figures(engine)
    finally:
        engine.dispose()
