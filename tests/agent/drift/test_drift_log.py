"""Drift counts through a real decision log: counted on the writer thread, stored as
totals in ``drift_hours``, kept off the decision rows' way; review sampling of passes;
retention of the quality tables."""

from __future__ import annotations

import json
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.decisionlog import DecisionLog, DecisionLogConfig
from agent.decisionlog import thumbnails as thumbs
from agent.decisionlog.schema import DRIFT_TABLE, SHADOW_COLUMNS, SHADOW_TABLE
from agent.drift import DriftConfig
from agent.drift.store import PERIOD_KEY
from tests.agent.decisionlog.decisionlog_driver import make_record

DEVICE = "dev-drift"


def drift_rows(path: Path) -> dict[str, dict[str, Any]]:
    """drift_hours by source."""
    conn = sqlite3.connect(path)
    try:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(f"SELECT * FROM {DRIFT_TABLE}").fetchall()  # noqa: S608
    finally:
        conn.close()
    out = {}
    for r in rows:
        row = dict(r)
        for col in ("outcomes", "top_class", "hist"):
            row[col] = json.loads(row[col])
        out[row["source"]] = row
    return out


def execute(path: Path, sql: str, params: tuple[Any, ...] = ()) -> int:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return conn.execute(sql, params).rowcount
    finally:
        conn.close()


def test_decisions_are_counted_into_drift_rows_with_their_frames(tmp_path: Path) -> None:
    config = DecisionLogConfig(thumbnails="non-pass")
    dark = np.full((120, 160, 3), 10, np.uint8)
    with DecisionLog(tmp_path, config, device_id=DEVICE) as dlog:
        now = time.time()
        for i in range(30):  # passes keep no thumbnail: their frame is counted all the same
            dlog.append(make_record(i, now, source="cam-a", thumbnail=dark.copy()))
        dlog.append(make_record(99, now, source="cam-a", outcome="reject", thumbnail=dark.copy()))
        dlog.append(make_record(100, now, source="sensor", outputs={"score": 0.95}))
        assert dlog.flush()
        stats = dlog.stats()
        rows = drift_rows(dlog.path)
    cam = rows["cam-a"]
    assert cam["n"] == 31
    assert cam["outcomes"] == {"pass": 30, "reject": 1}
    assert cam["top_class"] == {"ok": 31}
    assert cam["hist"]["brightness"][0] == 31
    assert cam["hist"][PERIOD_KEY] == 3600
    assert cam["hour"] == int(now // 3600) * 3600
    assert cam["uploaded"] == 0
    assert rows["sensor"]["n"] == 1
    assert "brightness" not in rows["sensor"]["hist"]
    assert stats["drift_decisions"] == 32
    assert stats["drift_frames"] == 31
    assert stats["thumbnails"] == 1  # the reject only
    assert stats["drift_errors"] == 0


def test_rows_hold_totals_and_a_change_marks_an_uploaded_row_for_upload_again(
    tmp_path: Path,
) -> None:
    config = DecisionLogConfig(thumbnails="none")
    drift = DriftConfig(period_s=60)
    with DecisionLog(tmp_path, config, device_id=DEVICE, drift=drift) as dlog:
        t = (int(time.time()) // 60) * 60 + 1.0
        for i in range(5):
            dlog.append(make_record(i, t, source="cam-1"))
        assert dlog.flush()
        assert execute(dlog.path, f"UPDATE {DRIFT_TABLE} SET uploaded = 1") == 1  # noqa: S608
        for i in range(3):
            dlog.append(make_record(i, t + 2, source="cam-1", outcome="reject"))
        assert dlog.flush()
        row = drift_rows(dlog.path)["cam-1"]
    assert row["n"] == 8
    assert row["outcomes"] == {"pass": 5, "reject": 3}
    assert row["uploaded"] == 0
    assert row["hour"] % 60 == 0
    assert row["hist"][PERIOD_KEY] == 60


def test_a_decision_drift_cannot_count_is_still_logged_and_the_error_counted(
    tmp_path: Path,
) -> None:
    config = DecisionLogConfig(thumbnails="none")
    with DecisionLog(tmp_path, config, device_id=DEVICE) as dlog:
        bad = make_record(1, time.time(), thumbnail=np.zeros((4, 4, 5), np.uint8))
        good = make_record(2, time.time())
        ids = [dlog.append(bad), dlog.append(good)]
        assert dlog.flush()
        stats = dlog.stats()
        conn = sqlite3.connect(dlog.path)
        logged = {r[0] for r in conn.execute("SELECT id FROM decisions")}
        conn.close()
    assert logged == set(ids)
    assert stats["drift_errors"] == 1
    assert stats["drift_decisions"] == 1


def test_drift_off_writes_no_rows(tmp_path: Path) -> None:
    drift = DriftConfig(enabled=False)
    with DecisionLog(tmp_path, DecisionLogConfig(), device_id=DEVICE, drift=drift) as dlog:
        dlog.append(make_record(1, time.time(), thumbnail=np.zeros((8, 8, 3), np.uint8)))
        assert dlog.flush()
        assert drift_rows(dlog.path) == {}
        assert dlog.stats()["drift_decisions"] == 0


def test_the_period_must_be_one_the_fleet_knows() -> None:
    with pytest.raises(ValueError, match="period_s"):
        DriftConfig(period_s=45)


# -- review sampling of passes -----------------------------------------------------------


def test_keep_draws_about_the_configured_share_of_passes_only() -> None:
    rng = random.Random(17)
    kept = sum(thumbs.keep("non-pass", "pass", 0.1, rng) for _ in range(10_000))
    assert 850 <= kept <= 1150  # 10 % of 10,000, about 3.5 standard deviations either side
    assert all(thumbs.keep("non-pass", "reject", 0.0, rng) for _ in range(10))
    assert not any(thumbs.keep("non-pass", "pass", 0.0, rng) for _ in range(1000))
    assert not any(thumbs.keep("none", "pass", 1.0, rng) for _ in range(10))
    assert all(thumbs.keep("all", "pass", 0.0, rng) for _ in range(10))


def test_the_log_keeps_the_thumbnails_of_a_sample_of_passes(tmp_path: Path) -> None:
    config = DecisionLogConfig(thumbnails="non-pass", pass_sample=0.25)
    image = np.full((24, 32, 3), 90, np.uint8)
    rng = random.Random(3)
    with DecisionLog(tmp_path, config, device_id=DEVICE, rng=rng) as dlog:
        now = time.time()
        for i in range(400):
            dlog.append(make_record(i, now, thumbnail=image.copy()))
        for i in range(20):
            dlog.append(make_record(i, now, outcome="reject", thumbnail=image.copy()))
        assert dlog.flush()
        conn = sqlite3.connect(dlog.path)
        kept = dict(
            conn.execute(
                "SELECT outcome, count(*) FROM decisions WHERE thumbnail IS NOT NULL "
                "GROUP BY outcome"
            ).fetchall()
        )
        conn.close()
        files = list((tmp_path / thumbs.DIR).rglob("*.jpg"))
    assert kept["reject"] == 20
    assert 65 <= kept["pass"] <= 135  # 25 % of 400 = 100, sd 8.7
    assert len(files) == kept["pass"] + 20


def test_pass_sample_is_a_share() -> None:
    with pytest.raises(ValueError, match="pass_sample"):
        DecisionLogConfig(pass_sample=1.5)


# -- retention --------------------------------------------------------------------------


def _shadow_row(decision_id: str, ts: float, uploaded: int, thumbnail: str | None) -> tuple:
    values: dict[str, Any] = dict.fromkeys(SHADOW_COLUMNS, "x")
    values.update(
        decision_id=decision_id, ts=ts, live_ms=1.0, shadow_ms=1.0, shadow_release=None,
        agree=1, iou_threshold=0.5, matched=0, unmatched_live=0, unmatched_shadow=0,
        live_outputs="{}", shadow_outputs="{}", thumbnail=thumbnail, uploaded=uploaded,
    )  # fmt: skip
    return tuple(values[c] for c in SHADOW_COLUMNS)


def test_old_quality_rows_go_with_the_log_once_uploaded(tmp_path: Path) -> None:
    config = DecisionLogConfig(max_age_days=1)
    dlog = DecisionLog(tmp_path, config, device_id=DEVICE)
    dlog.open()
    dlog.close()
    old = time.time() - 3 * 86_400
    new = time.time()
    frame = tmp_path / "shadow-thumbnails" / "old-up.jpg"
    frame.parent.mkdir()
    frame.write_bytes(b"jpeg")
    marks = ", ".join("?" for _ in SHADOW_COLUMNS)
    conn = sqlite3.connect(dlog.path)
    with conn:
        for row in (
            _shadow_row("old-up", old, 1, "shadow-thumbnails/old-up.jpg"),
            _shadow_row("old-not", old, 0, None),
            _shadow_row("new-up", new, 1, None),
        ):
            conn.execute(f"INSERT INTO {SHADOW_TABLE} VALUES ({marks})", row)  # noqa: S608
        for source, hour, uploaded in (("old-up", old, 1), ("old-not", old, 0), ("new-up", new, 1)):
            conn.execute(
                f"INSERT INTO {DRIFT_TABLE} VALUES ('m', '1', 'l', ?, ?, 1, '{{}}', '{{}}', "  # noqa: S608
                "'{}', 0, ?)",
                (source, int(hour // 3600) * 3600, uploaded),
            )
    conn.close()
    with DecisionLog(tmp_path, config, device_id=DEVICE):  # retention runs at open
        pass
    conn = sqlite3.connect(dlog.path)
    shadow = {r[0] for r in conn.execute(f"SELECT decision_id FROM {SHADOW_TABLE}")}  # noqa: S608
    drift = {r[0] for r in conn.execute(f"SELECT source FROM {DRIFT_TABLE}")}  # noqa: S608
    conn.close()
    assert shadow == {"old-not", "new-up"}
    assert drift == {"old-not", "new-up"}
    assert not frame.exists()
