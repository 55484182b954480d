"""A corrupt decision log is moved aside; a killed writer never loses committed rows."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from agent.decisionlog import ALARM_CORRUPT, DecisionLog, DecisionLogConfig, integrity, query
from tests.agent.decisionlog.decisionlog_driver import make_record

DRIVER = Path(__file__).with_name("decisionlog_driver.py")
KILLS = 20


def open_and_log_one(state_dir: Path, alarms: list[tuple[str, str]]) -> str:
    config = DecisionLogConfig()
    with DecisionLog(state_dir, config, device_id="d", on_alarm=lambda *a: alarms.append(a)) as log:
        return log.append(make_record(1, time.time()))


def test_a_file_that_is_no_database_is_moved_aside_with_an_alarm(tmp_path: Path) -> None:
    db = tmp_path / "decisions.db"
    garbage = os.urandom(8192)
    db.write_bytes(garbage)
    alarms: list[tuple[str, str]] = []
    decision_id = open_and_log_one(tmp_path, alarms)
    assert [kind for kind, _ in alarms] == [ALARM_CORRUPT]
    moved = list(tmp_path.glob("decisions.db.corrupt-*"))
    assert len(moved) == 1
    assert moved[0].read_bytes() == garbage
    assert moved[0].name in alarms[0][1]
    assert [r["id"] for r in query(db)] == [decision_id]


def test_a_truncated_database_is_moved_aside_and_a_new_one_works(tmp_path: Path) -> None:
    config = DecisionLogConfig()
    with DecisionLog(tmp_path, config, device_id="d") as log:
        t = time.time()
        for i in range(3000):
            log.append(make_record(i, t + i * 0.001, outputs={"pad": "x" * 200}))
    db = tmp_path / "decisions.db"
    size = db.stat().st_size
    with open(db, "r+b") as f:
        f.truncate(size // 2)
    alarms: list[tuple[str, str]] = []
    decision_id = open_and_log_one(tmp_path, alarms)
    assert [kind for kind, _ in alarms] == [ALARM_CORRUPT]
    assert len(list(tmp_path.glob("decisions.db.corrupt-*"))) == 1
    assert [r["id"] for r in query(db)] == [decision_id]
    conn = sqlite3.connect(db)
    names = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY name")]
    assert names == [
        "0001_create_decisions",
        "0002_create_shadow_results",
        "0003_create_drift_hours",
        "0004_add_station_fields",
    ]
    conn.close()


def test_moving_aside_takes_the_wal_and_shm_along(tmp_path: Path) -> None:
    db = tmp_path / "decisions.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").write_bytes(suffix.encode() or b"main")
    first = integrity.move_aside(db)
    db.write_bytes(b"again")
    second = integrity.move_aside(db)  # the same second: a suffix keeps both
    assert first != second
    assert not db.exists()
    for suffix in ("", "-wal", "-shm"):
        assert Path(f"{first}{suffix}").read_bytes() == (suffix.encode() or b"main")
        assert not Path(f"{db}{suffix}").exists()
    assert second.read_bytes() == b"again"


def test_a_wal_without_its_database_is_moved_aside_not_replayed(tmp_path: Path) -> None:
    (tmp_path / "decisions.db-wal").write_bytes(b"w" * 4096)
    alarms: list[tuple[str, str]] = []
    decision_id = open_and_log_one(tmp_path, alarms)
    assert alarms == []
    assert [p.read_bytes() for p in tmp_path.glob("decisions.db.stray-*-wal")] == [b"w" * 4096]
    assert [r["id"] for r in query(tmp_path / "decisions.db")] == [decision_id]


def test_only_the_newest_corrupt_copies_are_kept(tmp_path: Path) -> None:
    alarms: list[tuple[str, str]] = []
    for k in range(5):
        (tmp_path / "decisions.db").write_bytes(b"garbage %d" % k * 100)
        open_and_log_one(tmp_path, alarms)
        time.sleep(0.01)
    assert len(alarms) == 5
    kept = sorted(p.read_bytes()[:9] for p in tmp_path.glob("decisions.db.corrupt-*"))
    assert kept == [b"garbage 2", b"garbage 3", b"garbage 4"]


def committed_rows(db: Path) -> tuple[str, int]:
    """integrity_check result and row count, read-only: the WAL the kill left behind is
    read but not checkpointed, so the next driver's open recovers it itself."""
    conn = sqlite3.connect(db.resolve().as_uri() + "?mode=ro", uri=True, timeout=5)
    try:
        check = conn.execute("PRAGMA integrity_check").fetchone()[0]
        count = conn.execute("SELECT count(*) FROM decisions").fetchone()[0]
    finally:
        conn.close()
    return check, count


def rows_now(db: Path) -> int:
    try:
        conn = sqlite3.connect(db.resolve().as_uri() + "?mode=ro", uri=True, timeout=1)
    except sqlite3.Error:
        return 0
    try:
        return int(conn.execute("SELECT count(*) FROM decisions").fetchone()[0])
    except sqlite3.Error:
        return 0  # not created yet
    finally:
        conn.close()


def test_sigkill_at_random_moments_never_loses_committed_rows(tmp_path: Path) -> None:
    db = tmp_path / "decisions.db"
    rng = random.Random(20261121)
    committed = 0
    for round_no in range(KILLS):
        proc = subprocess.Popen(
            [sys.executable, str(DRIVER), str(tmp_path), "20"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            seen = committed
            end = time.monotonic() + 10
            while seen <= committed and time.monotonic() < end and proc.poll() is None:
                time.sleep(0.005)
                seen = rows_now(db)
            assert seen > committed, f"round {round_no}: the driver logged nothing new"
            time.sleep(rng.uniform(0, 0.08))
            seen = max(seen, rows_now(db))
        finally:
            proc.send_signal(signal.SIGKILL)
            _, stderr = proc.communicate(timeout=10)
        assert proc.returncode == -signal.SIGKILL, stderr.decode()
        check, count = committed_rows(db)
        assert check == "ok", f"round {round_no}: {check}"
        assert count >= seen, f"round {round_no}: {count} rows after the kill, {seen} before"
        committed = count
    assert not list(tmp_path.glob("decisions.db.corrupt-*"))
    # Every committed row's thumbnail is on disk (files are written before their row).
    conn = sqlite3.connect(db)
    thumbs = [
        r[0] for r in conn.execute("SELECT thumbnail FROM decisions WHERE thumbnail IS NOT NULL")
    ]
    conn.close()
    assert thumbs
    assert all((tmp_path / t).is_file() for t in thumbs)
    # The next open deletes files whose rows never committed.
    with DecisionLog(tmp_path, DecisionLogConfig(), device_id="d"):
        pass
    assert len(list((tmp_path / "thumbnails").rglob("*.jpg"))) == len(thumbs)
