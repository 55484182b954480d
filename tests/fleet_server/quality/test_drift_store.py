"""The quality store on SQLite and PostgreSQL: shadow records stored once, drift buckets
upserted with the larger totals (a late older copy never undoes a newer one)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.engine import Engine

from agent.wire.quality import DRIFT_BINS, DriftHour, ShadowRecord, ShadowSide
from fleet_server.db.errors import StorageError
from fleet_server.quality.store import (
    drift_keys,
    insert_shadow_records,
    list_drift_hours,
    list_shadow_records,
    upsert_drift_hours,
)

pytest_plugins = ["tests.fleet_server.db_fixtures"]


def shadow(decision_id: str, *, agree: bool = True, ts: float = 100.0) -> ShadowRecord:
    side: dict[str, Any] = {"model_name": "cls", "outcome": "pass", "latency_ms": 3.0}
    return ShadowRecord(
        decision_id=decision_id,
        ts=ts,
        source="cam0",
        line="1",
        live=ShadowSide(model_version="1.0.0", **side),
        shadow=ShadowSide(
            model_name="cls",
            model_version="1.1.0",
            release=7,
            outcome="pass" if agree else "reject",
            latency_ms=4.0,
        ),
        agree=agree,
    )


def bucket(hour: int, n: int, *, line: str = "1", version: str = "1.0.0") -> DriftHour:
    bins = len(DRIFT_BINS["brightness"]) - 1
    return DriftHour(
        model_name="cls",
        model_version=version,
        line=line,
        source="cam0",
        hour=hour,
        period_s=60,
        n=n,
        outcomes={"pass": n},
        top_class={"ok": n},
        hist={"brightness": [n if i == 8 else 0 for i in range(bins)]},
    )


def test_a_second_copy_of_a_shadow_record_is_a_no_op(db: Engine) -> None:
    assert insert_shadow_records(db, "gw-1", [shadow("d1"), shadow("d2", agree=False)]) == 2
    assert insert_shadow_records(db, "gw-1", [shadow("d1"), shadow("d2")]) == 0
    assert insert_shadow_records(db, "gw-2", [shadow("d1")]) == 1  # another device's id space
    rows = list_shadow_records(db, device_id="gw-1")
    assert {r.decision_id for r in rows} == {"d1", "d2"}
    (disagreeing,) = list_shadow_records(db, agree=False)
    assert disagreeing.shadow_outcome == "reject"
    assert disagreeing.shadow_release == 7
    assert disagreeing.live_version == "1.0.0"
    assert disagreeing.payload["decision_id"] == "d2"


def test_drift_buckets_keep_the_larger_totals(db: Engine) -> None:
    assert upsert_drift_hours(db, "gw-1", [bucket(60, 10), bucket(120, 5)]) == 2
    assert upsert_drift_hours(db, "gw-1", [bucket(60, 10)]) == 0  # the same copy again
    assert upsert_drift_hours(db, "gw-1", [bucket(60, 25)]) == 1  # the bucket grew
    assert upsert_drift_hours(db, "gw-1", [bucket(60, 12)]) == 0  # a late older copy
    rows = list_drift_hours(db, model_name="cls", line="1")
    assert [(r.hour, r.n, r.period_s) for r in rows] == [(60, 25, 60), (120, 5, 60)]
    assert rows[0].hist["brightness"][8] == 25
    assert rows[0].outcomes == {"pass": 25}
    assert [r.hour for r in list_drift_hours(db, since=61, until=200)] == [120]


def test_drift_keys_name_each_model_version_and_line(db: Engine) -> None:
    upsert_drift_hours(db, "gw-1", [bucket(60, 1), bucket(60, 1, line="2")])
    upsert_drift_hours(db, "gw-2", [bucket(60, 1, version="1.1.0")])
    assert drift_keys(db) == [("cls", "1.0.0", "1"), ("cls", "1.0.0", "2"), ("cls", "1.1.0", "1")]


def test_a_limit_out_of_range_is_refused(db: Engine) -> None:
    with pytest.raises(StorageError, match="limit 0"):
        list_shadow_records(db, limit=0)
