"""Retention of the decision log: by age and by disk budget, uploaded rows first."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import numpy as np

from agent.decisionlog import ALARM_EVICTED_UNUPLOADED, DecisionLog, DecisionLogConfig
from tests.agent.decisionlog.decisionlog_driver import make_record

DAY = 86_400.0
MIB = 1024 * 1024


def rows_of(db: Path) -> list[tuple[str, int, str | None]]:
    """(id, uploaded, thumbnail) of every row, oldest first."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT id, uploaded, thumbnail FROM decisions ORDER BY decision_time"
        ).fetchall()
    finally:
        conn.close()


def usage(state_dir: Path) -> int:
    """Bytes on disk of the database, its WAL and the thumbnails."""
    files = [state_dir / "decisions.db", state_dir / "decisions.db-wal"]
    total = sum(p.stat().st_size for p in files if p.exists())
    return total + sum(p.stat().st_size for p in (state_dir / "thumbnails").rglob("*.jpg"))


def image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (120, 160, 3), dtype=np.uint8)


def fill(state_dir: Path, n: int, start: float, uploaded: slice) -> list[str]:
    """Log n rejects with thumbnails from ``start`` on, one a second; mark the ones in
    ``uploaded`` uploaded. Returns their ids, oldest first."""
    config = DecisionLogConfig(budget_mb=1024, max_age_days=3650, thumbnails="all")
    with DecisionLog(state_dir, config, device_id="d") as log:
        ids = [
            log.append(make_record(i, start + i, outcome="reject", thumbnail=image(i)))
            for i in range(n)
        ]
        log.mark_uploaded(ids[uploaded])
    return ids


def test_age_deletes_old_uploaded_rows_and_their_thumbnails_only(tmp_path: Path) -> None:
    now = time.time()
    old = fill(tmp_path, 6, now - 40 * DAY, uploaded=slice(3, 6))
    recent = fill(tmp_path, 4, now - 1 * DAY, uploaded=slice(0, 2))
    old_thumbs = {tid: thumb for tid, _, thumb in rows_of(tmp_path / "decisions.db")}
    config = DecisionLogConfig(max_age_days=30, thumbnails="all")
    with DecisionLog(tmp_path, config, device_id="d") as log:
        assert log.stats()["aged"] == 3
        assert log.stats()["evicted_unuploaded"] == 0
    left = [r[0] for r in rows_of(tmp_path / "decisions.db")]
    assert left == old[:3] + recent  # old un-uploaded rows stay past their age
    for decision_id in old[3:]:
        assert not (tmp_path / old_thumbs[decision_id]).exists()
    for decision_id in left:
        assert (tmp_path / old_thumbs[decision_id]).exists()


def test_the_budget_deletes_oldest_uploaded_rows_first_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    # The newer half is uploaded: retention must skip the older, un-uploaded half.
    ids = fill(tmp_path, 200, time.time() - 3600, uploaded=slice(100, 200))
    before = usage(tmp_path)
    alarms: list[tuple[str, str]] = []
    budget = int(before * 0.8)  # met by deleting some of the uploaded rows
    config = DecisionLogConfig(budget_mb=budget / MIB, thumbnails="all")
    with DecisionLog(tmp_path, config, device_id="d", on_alarm=lambda *a: alarms.append(a)):
        pass
    rows = rows_of(tmp_path / "decisions.db")
    left = [r[0] for r in rows]
    evicted = 200 - len(left)
    assert 0 < evicted < 100
    assert left == ids[:100] + ids[100 + evicted :]  # the oldest uploaded ones went
    assert [uploaded for _, uploaded, _ in rows] == [0] * 100 + [1] * (100 - evicted)
    assert alarms == []
    assert usage(tmp_path) <= budget
    on_disk = {p.name for p in (tmp_path / "thumbnails").rglob("*.jpg")}
    assert on_disk == {f"{i}.jpg" for i in left}


def test_an_exhausted_budget_evicts_oldest_unuploaded_rows_with_an_alarm(
    tmp_path: Path,
) -> None:
    ids = fill(tmp_path, 200, time.time() - 3600, uploaded=slice(150, 200))
    budget = int(usage(tmp_path) * 0.4)  # less than the un-uploaded rows take
    alarms: list[tuple[str, str]] = []
    config = DecisionLogConfig(budget_mb=budget / MIB, thumbnails="all")
    with DecisionLog(tmp_path, config, device_id="d", on_alarm=lambda *a: alarms.append(a)) as log:
        stats = log.stats()
    left = [r[0] for r in rows_of(tmp_path / "decisions.db")]
    assert 0 < len(left) < 150
    assert left == ids[150 - len(left) : 150]  # every uploaded row, then the oldest others
    assert stats["evicted_unuploaded"] == 150 - len(left)
    assert stats["evicted"] == 200 - len(left)
    assert [kind for kind, _ in alarms] == [ALARM_EVICTED_UNUPLOADED]
    assert f"deleted {150 - len(left)} decisions not yet uploaded" in alarms[0][1]
    assert usage(tmp_path) <= budget
    assert len(list((tmp_path / "thumbnails").rglob("*.jpg"))) == len(left)


def test_retention_runs_periodically_on_the_writer_thread(tmp_path: Path) -> None:
    alarms: list[tuple[str, str]] = []
    config = DecisionLogConfig(
        budget_mb=0.5, retention_interval_s=0.05, thumbnails="all", flush_interval_s=0.01
    )
    with DecisionLog(tmp_path, config, device_id="d", on_alarm=lambda *a: alarms.append(a)) as log:
        t = time.time()
        for i in range(2_000):  # ~6 MB of thumbnails, far past the budget
            log.append(make_record(i, t + i * 0.001, outcome="reject", thumbnail=image(i)))
            if alarms:
                break
            if i % 50 == 0:
                time.sleep(0.01)
        deadline = time.monotonic() + 5
        while not alarms and time.monotonic() < deadline:
            time.sleep(0.01)
        assert log.flush()
        stats = log.stats()
    assert alarms
    assert alarms[0][0] == ALARM_EVICTED_UNUPLOADED
    assert stats["retention_runs"] >= 2
    assert stats["evicted_unuploaded"] > 0
