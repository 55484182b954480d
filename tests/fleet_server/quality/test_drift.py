"""Drift per (model version, line) on synthetic buckets stored in the fleet database
(SQLite and PostgreSQL): the same distribution is not drifted, darker frames are drifted
on their line only, too few decisions are not judged, and the job writes one event per
crossing into drift."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine

from agent.wire.quality import DriftHour
from fleet_server.db import store
from fleet_server.db.errors import StorageError
from fleet_server.quality.drift import DriftSettings, evaluate, merge
from fleet_server.quality.drift_job import (
    DRIFT_EVENT,
    compute,
    line_source,
    list_status,
    pin_reference,
    run_drift,
    unpin_reference,
)
from fleet_server.quality.store import DriftRow, list_drift_hours
from tests.fleet_server.quality import drift_data

pytest_plugins = ["tests.fleet_server.db_fixtures"]

PERIOD = drift_data.PERIOD
T0 = 1_750_000_020 // PERIOD * PERIOD
SETTINGS = DriftSettings(reference_hours=10 * PERIOD / 3600, window_hours=5 * PERIOD / 3600,
                         min_count=500)  # fmt: skip


def bucket(minute: int, n: int, *, line: str = "1", brightness: float = 120.0) -> DriftHour:
    return drift_data.bucket(T0 + minute * PERIOD, n, line=line, brightness=brightness)


def fill(
    db: Engine, device: str, line: str, minutes: range, n: int, brightness: float = 120.0
) -> None:
    drift_data.fill(db, device, line, T0, minutes, n, brightness)


def now_after(minute: int) -> float:
    return float(T0 + minute * PERIOD)


def test_the_same_distribution_is_not_drifted(db: Engine) -> None:
    fill(db, "gw-1", "1", range(15), 120)
    (report,) = compute(db, SETTINGS, now_after(15))
    assert report.judged
    assert not report.drifted, report.reason
    assert report.reference.start == T0
    assert report.reference.end == T0 + 10 * PERIOD
    assert report.reference.n == 1200
    assert (report.current.start, report.current.end) == (T0 + 10 * PERIOD, now_after(15))
    assert report.current.n == 600
    assert report.histograms["brightness"].psi is not None
    assert report.histograms["brightness"].psi < 0.1
    assert "within thresholds" in report.reason


def test_darker_frames_drift_on_their_line_only(db: Engine) -> None:
    for device, line in (("gw-1", "1"), ("gw-2", "2")):
        fill(db, device, line, range(10), 120)
    fill(db, "gw-1", "1", range(10, 15), 120, brightness=45.0)  # the lights went down
    fill(db, "gw-2", "2", range(10, 15), 120)
    reports = {r.line: r for r in compute(db, SETTINGS, now_after(15))}
    assert reports["1"].drifted
    assert reports["1"].histograms["brightness"].psi > 0.25  # type: ignore[operator]
    assert reports["1"].histograms["brightness"].over
    assert not reports["1"].histograms["score"].over
    assert "brightness: PSI" in reports["1"].reason
    assert reports["2"].judged
    assert not reports["2"].drifted
    assert [r.line for r in compute(db, SETTINGS, now_after(15), line="2")] == ["2"]


def test_too_few_decisions_are_not_judged(db: Engine) -> None:
    fill(db, "gw-1", "1", range(10), 120)
    fill(db, "gw-1", "1", range(10, 15), 40, brightness=45.0)  # 200 < min_count
    (report,) = compute(db, SETTINGS, now_after(15))
    assert not report.judged
    assert not report.drifted
    assert report.histograms == {}
    assert "not judged: 1200 decisions in the reference window and 200" in report.reason


def test_the_reference_is_still_filling_so_nothing_is_judged() -> None:
    rows = [bucket(m, 120) for m in range(5)]
    stored = [
        DriftRow(
            "gw-1",
            h.model_name,
            h.model_version,
            h.line,
            h.source,
            h.hour,
            h.period_s,
            h.n,
            h.outcomes,
            h.top_class,
            h.hist,
            0.0,
        )
        for h in rows
    ]
    key = ("cls", "1.0.0", "1")
    report = evaluate(key, merge(stored)[key], SETTINGS, now_after(5))
    assert report.current.n == 0
    assert report.current.start == report.current.end
    assert not report.judged


def test_the_job_writes_one_event_per_crossing_into_drift(db: Engine) -> None:
    fill(db, "gw-1", "1", range(10), 120)
    fill(db, "gw-1", "1", range(10, 15), 120, brightness=45.0)
    first = run_drift(db, SETTINGS, now_after(15))
    assert [r.line for r in first.raised] == ["1"]
    again = run_drift(db, SETTINGS, now_after(15) + 1)
    assert again.raised == []
    (status,) = list_status(db)
    assert status.drifted
    assert status.changed_at == now_after(15)
    (event,) = store.list_events(db, kind=DRIFT_EVENT)
    assert event.device_id == line_source("1")
    assert event.payload["line"] == "1"
    assert event.payload["model_version"] == "1.0.0"
    assert event.payload["histograms"]["brightness"]["psi"] > 0.25
    # the line stops: its last data keep the verdict (the window ends at the newest bucket)
    (stale,) = run_drift(db, SETTINGS, now_after(40)).reports
    assert stale.drifted
    assert (stale.current.start, stale.current.end) == (now_after(10), now_after(15))
    assert list_status(db)[0].drifted
    # back to normal: cleared; dark again: a new event
    fill(db, "gw-1", "1", range(40, 45), 120)
    cleared = run_drift(db, SETTINGS, now_after(45))
    assert cleared.raised == []
    assert not list_status(db)[0].drifted
    fill(db, "gw-1", "1", range(45, 50), 120, brightness=45.0)
    assert [r.line for r in run_drift(db, SETTINGS, now_after(50)).raised] == ["1"]
    assert len(store.list_events(db, kind=DRIFT_EVENT)) == 2


def test_a_pinned_reference_replaces_the_first_hours(db: Engine) -> None:
    fill(db, "gw-1", "1", range(10), 120, brightness=45.0)  # dark from the start
    fill(db, "gw-1", "1", range(10, 20), 120)
    fill(db, "gw-1", "1", range(20, 25), 120)
    (default,) = compute(db, SETTINGS, now_after(25))
    assert default.drifted  # the dark first minutes make a poor reference
    pin_reference(db, "cls", "1.0.0", "1", now_after(10), now_after(20), by="alice")
    (pinned,) = compute(db, SETTINGS, now_after(25))
    assert pinned.reference.pinned
    assert (pinned.reference.start, pinned.reference.end) == (now_after(10), now_after(20))
    assert pinned.judged
    assert not pinned.drifted
    assert list_status(db)[0].pinned_by == "alice"
    assert unpin_reference(db, "cls", "1.0.0", "1")
    assert not unpin_reference(db, "cls", "1.0.0", "1")
    assert compute(db, SETTINGS, now_after(25))[0].drifted
    with pytest.raises(StorageError, match="not a finite window"):
        pin_reference(db, "cls", "1.0.0", "1", 5.0, 5.0, by="alice")


def test_only_the_windows_buckets_are_read(db: Engine) -> None:
    fill(db, "gw-1", "1", range(60), 120)
    assert len(list_drift_hours(db)) == 60
    (report,) = compute(db, SETTINGS, now_after(60))
    assert report.reference.n == 1200
    assert report.current.n == 600
