"""A decision log path that holds something else (a directory, a FIFO, a symlink to
/dev/zero, another application's database, a log with a column dropped) is moved aside
with a suffix naming why, an alarm is raised, and a fresh log takes decisions; a log with
extra columns is ours and kept."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from agent.decisionlog import ALARM_FOREIGN, DecisionLog, DecisionLogConfig, query
from tests.agent.decisionlog.decisionlog_driver import make_record


def open_and_log_one(state_dir: Path, alarms: list[tuple[str, str]]) -> str:
    config = DecisionLogConfig()
    with DecisionLog(state_dir, config, device_id="d", on_alarm=lambda *a: alarms.append(a)) as log:
        return log.append(make_record(1, time.time()))


def _one_moved(state_dir: Path, why: str) -> Path:
    moved = [
        p
        for p in state_dir.iterdir()
        if p.name.startswith(f"decisions.db.{why}-") and not p.name.endswith(("-wal", "-shm"))
    ]
    assert len(moved) == 1, sorted(p.name for p in state_dir.iterdir())
    return moved[0]


def _fresh_log_holds(db: Path, decision_id: str) -> None:
    assert db.is_file()
    assert not db.is_symlink()
    assert [r["id"] for r in query(db)] == [decision_id]


def test_a_directory_in_place_of_the_log_is_moved_aside_with_its_contents(tmp_path: Path) -> None:
    db = tmp_path / "decisions.db"
    db.mkdir()
    (db / "keep.txt").write_text("someone's file")
    alarms: list[tuple[str, str]] = []
    decision_id = open_and_log_one(tmp_path, alarms)
    assert [kind for kind, _ in alarms] == [ALARM_FOREIGN]
    moved = _one_moved(tmp_path, "not-a-file")
    assert (moved / "keep.txt").read_text() == "someone's file"
    assert "a directory, not a regular file" in alarms[0][1]
    assert moved.name in alarms[0][1]
    _fresh_log_holds(db, decision_id)


def test_a_fifo_in_place_of_the_log_is_moved_aside(tmp_path: Path) -> None:
    db = tmp_path / "decisions.db"
    os.mkfifo(db)
    alarms: list[tuple[str, str]] = []
    decision_id = open_and_log_one(tmp_path, alarms)
    assert [kind for kind, _ in alarms] == [ALARM_FOREIGN]
    assert "a FIFO" in alarms[0][1]
    _one_moved(tmp_path, "not-a-file")
    _fresh_log_holds(db, decision_id)


@pytest.mark.parametrize("target", ["/dev/zero", "nowhere/at/all"])
def test_a_symlink_to_no_regular_file_is_moved_aside_and_its_target_untouched(
    tmp_path: Path, target: str
) -> None:
    db = tmp_path / "decisions.db"
    db.symlink_to(target)
    alarms: list[tuple[str, str]] = []
    decision_id = open_and_log_one(tmp_path, alarms)
    assert [kind for kind, _ in alarms] == [ALARM_FOREIGN]
    moved = _one_moved(tmp_path, "not-a-file")
    assert os.readlink(moved) == target
    assert target in alarms[0][1]
    _fresh_log_holds(db, decision_id)


def test_a_symlink_to_a_good_log_is_followed_not_moved(tmp_path: Path) -> None:
    elsewhere = tmp_path / "disk2"
    elsewhere.mkdir()
    first = open_and_log_one(elsewhere, [])
    (tmp_path / "decisions.db").symlink_to(elsewhere / "decisions.db")
    alarms: list[tuple[str, str]] = []
    second = open_and_log_one(tmp_path, alarms)
    assert alarms == []
    assert sorted(r["id"] for r in query(elsewhere / "decisions.db")) == sorted([first, second])


def test_another_applications_database_is_moved_aside_untouched(tmp_path: Path) -> None:
    db = tmp_path / "decisions.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount REAL)")
    conn.execute("INSERT INTO invoices (amount) VALUES (12.5)")
    conn.commit()
    conn.close()
    alarms: list[tuple[str, str]] = []
    decision_id = open_and_log_one(tmp_path, alarms)
    assert [kind for kind, _ in alarms] == [ALARM_FOREIGN]
    assert "no decisions table (tables: invoices)" in alarms[0][1]
    moved = _one_moved(tmp_path, "foreign")
    conn = sqlite3.connect(moved)
    assert conn.execute("SELECT amount FROM invoices").fetchall() == [(12.5,)]
    conn.close()
    _fresh_log_holds(db, decision_id)


@pytest.mark.parametrize(
    ("column", "index"),
    [
        ("model_version", "idx_decisions_model_version"),
        ("part_id", "idx_decisions_part_id_time"),  # 0004 recorded, its column gone
    ],
)
def test_a_log_with_a_dropped_column_is_moved_aside_with_its_rows(
    tmp_path: Path, column: str, index: str
) -> None:
    old = open_and_log_one(tmp_path, [])
    db = tmp_path / "decisions.db"
    conn = sqlite3.connect(db)
    conn.execute("DROP VIEW decisions_readable")
    conn.execute(f"DROP INDEX {index}")
    conn.execute(f"ALTER TABLE decisions DROP COLUMN {column}")
    conn.commit()
    conn.close()
    alarms: list[tuple[str, str]] = []
    decision_id = open_and_log_one(tmp_path, alarms)
    assert [kind for kind, _ in alarms] == [ALARM_FOREIGN]
    assert f"lacks column(s) {column}" in alarms[0][1]
    moved = _one_moved(tmp_path, "foreign")
    conn = sqlite3.connect(moved)
    assert conn.execute("SELECT id FROM decisions").fetchall() == [(old,)]
    conn.close()
    _fresh_log_holds(db, decision_id)


def test_a_log_with_extra_columns_is_kept_with_its_rows(tmp_path: Path) -> None:
    old = open_and_log_one(tmp_path, [])
    db = tmp_path / "decisions.db"
    conn = sqlite3.connect(db)
    conn.execute("ALTER TABLE decisions ADD COLUMN operator_note TEXT")
    conn.commit()
    conn.close()
    alarms: list[tuple[str, str]] = []
    new = open_and_log_one(tmp_path, alarms)
    assert alarms == []
    assert sorted(r["id"] for r in query(db)) == sorted([old, new])
    assert not [p for p in tmp_path.iterdir() if ".foreign-" in p.name or ".corrupt-" in p.name]
