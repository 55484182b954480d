"""DecisionLog against real SQLite files: fields, ids, batching, thumbnails, migrations."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pydantic
import pytest
import sqlite_utils

from agent.decisionlog import (
    DecisionLog,
    DecisionLogConfig,
    get,
    new_id,
    query,
    schema,
)
from agent.decisionlog.connection import connect_writer
from agent.decisionlog.thumbnails import encode_jpeg
from agent.errors import DecisionLogError
from tests.agent.decisionlog.decisionlog_driver import make_record


def count_rows(db: Path) -> int:
    """Committed rows, seen through a separate read-only connection."""
    conn = sqlite3.connect(db.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM decisions").fetchone()[0])
    finally:
        conn.close()


def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def dlog(state_dir: Path) -> Iterator[DecisionLog]:
    log = DecisionLog(state_dir, DecisionLogConfig(), device_id="dev-7")
    log.open()
    yield log
    log.close()


def test_a_record_round_trips_with_every_field(dlog: DecisionLog) -> None:
    t = 1_795_000_000.25
    record = make_record(
        1,
        t,
        outputs={"label": "scratch", "score": np.float32(0.75), "boxes": np.array([[1, 2]])},
        outcome="reject",
        latencies_ms={"infer": 4.5, "e2e": 17.25},
    )
    decision_id = dlog.append(record)
    assert decision_id == record.id
    assert dlog.flush()
    row = get(dlog.path, decision_id)
    assert row is not None
    assert row["id"] == decision_id
    assert row["capture_time"] == pytest.approx(t - 0.015)
    assert row["decision_time"] == t
    assert row["decision_time_utc"] == "2026-11-18T11:06:40.250Z"
    assert row["capture_time_utc"] == "2026-11-18T11:06:40.235Z"
    assert row["device_id"] == "dev-7"
    for field in ("source", "line", "model_name", "model_version", "bundle_digest"):
        assert row[field] == getattr(record, field)
    for field in ("backend", "config_hash", "input_digest", "outcome"):
        assert row[field] == getattr(record, field)
    assert row["outputs"] == {"label": "scratch", "score": 0.75, "boxes": [[1, 2]]}
    assert row["thresholds"] == {"reject": 0.8, "review": 0.5}
    assert row["latencies_ms"] == {"infer": 4.5, "e2e": 17.25}
    assert row["e2e_ms"] == 17.25
    assert row["thumbnail"] is None
    assert row["uploaded"] == 0
    assert (row["station"], row["part_id"], row["deadline_missed"]) == ("", "", False)


def test_a_station_decision_round_trips_with_its_station_fields(dlog: DecisionLog) -> None:
    t = 1_795_000_000.5
    late = dlog.append(
        make_record(1, t, station="st-2.a", part_id="P-0042 Ä/7", deadline_missed=True)
    )
    on_time = dlog.append(make_record(2, t + 1, station="st-2.a", part_id="P-0043"))
    assert dlog.flush()
    row = get(dlog.path, late)
    assert row is not None
    assert (row["station"], row["part_id"], row["deadline_missed"]) == (
        "st-2.a",
        "P-0042 Ä/7",
        True,
    )
    other = get(dlog.path, on_time)
    assert other is not None
    assert (other["station"], other["part_id"], other["deadline_missed"]) == (
        "st-2.a",
        "P-0043",
        False,
    )
    conn = sqlite3.connect(dlog.path)
    stored = conn.execute(
        "SELECT deadline_missed, typeof(deadline_missed) FROM decisions WHERE id = ?", (late,)
    ).fetchone()
    plan = " ".join(
        str(r[-1])
        for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM decisions WHERE part_id = ? ORDER BY decision_time",
            ("P-0042 Ä/7",),
        )
    )
    conn.close()
    assert stored == (1, "integer")
    assert "idx_decisions_part_id_time" in plan


def test_a_log_from_before_the_station_columns_is_migrated_in_place(state_dir: Path) -> None:
    """A log an older agent wrote (migrations 0001-0003, rows in every upload state) opens
    as a decision log, not a foreign database: its rows stay, read as free-running
    decisions, and new decisions carry their station fields."""
    state_dir.mkdir(parents=True)
    db_path = state_dir / "decisions.db"
    conn = connect_writer(db_path)
    db = sqlite_utils.Database(conn)
    schema.MIGRATIONS.apply(db, stop_before=schema.STATION_MIGRATION)
    old_columns = [str(r[1]) for r in conn.execute("PRAGMA table_info(decisions)")]
    assert old_columns == list(schema.BASE_COLUMNS)
    t = 1_795_000_000.0
    old_ids = [new_id(t + i) for i in range(3)]
    insert = (
        f"INSERT INTO decisions ({', '.join(schema.BASE_COLUMNS)}) "  # noqa: S608
        f"VALUES ({', '.join('?' for _ in schema.BASE_COLUMNS)})"
    )
    with conn:
        for i, decision_id in enumerate(old_ids):
            conn.execute(
                insert,
                (decision_id, t + i - 0.01, t + i, "dev-7", "cam-0", "line-1", "defects",
                 "1.0.0", "sha256:ab", "onnxruntime", "cfg", f"in-{i}", '{"score":0.5}',
                 "pass", "{}", '{"infer":2.0}', 10.0, None, i),
            )  # fmt: skip
    conn.close()

    alarms: list[tuple[str, str]] = []
    log = DecisionLog(
        state_dir, DecisionLogConfig(), device_id="dev-7", on_alarm=lambda *a: alarms.append(a)
    )
    log.open()
    try:
        new = log.append(make_record(9, t + 10, station="st-1", part_id="P-9"))
        assert log.flush()
    finally:
        log.close()
    assert alarms == []
    assert not list(state_dir.glob("decisions.db.*-*"))  # nothing moved aside
    rows = {r["id"]: r for r in query(db_path)}
    assert set(rows) == {*old_ids, new}
    for i, decision_id in enumerate(old_ids):
        row = rows[decision_id]
        assert (row["station"], row["part_id"], row["deadline_missed"]) == ("", "", False)
        assert (row["uploaded"], row["outputs"]) == (i, {"score": 0.5})
    assert (rows[new]["station"], rows[new]["part_id"]) == ("st-1", "P-9")
    assert [r["id"] for r in query(db_path, part_id="P-9")] == [new]
    conn = sqlite3.connect(db_path)
    names = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY rowid")]
    notnull = {str(r[1]): (r[3], r[4]) for r in conn.execute("PRAGMA table_info(decisions)")}
    conn.close()
    assert names[-1] == schema.STATION_MIGRATION
    assert notnull["station"] == (1, "''")
    assert notnull["part_id"] == (1, "''")
    assert notnull["deadline_missed"] == (1, "0")


def test_plain_sqlite_utils_reads_the_table_with_json_as_text(dlog: DecisionLog) -> None:
    dlog.append(make_record(1, time.time(), latencies_ms={"infer": 3.0}))
    assert dlog.flush()
    db = sqlite_utils.Database(dlog.path)
    rows = list(db["decisions"].rows)
    assert len(rows) == 1
    assert rows[0]["latencies_ms"] == '{"infer":3.0}'
    assert rows[0]["e2e_ms"] == 15.0  # no "e2e" stage: decision - capture time
    assert db["decisions"].pks == ["id"]
    assert {
        "idx_decisions_time",
        "idx_decisions_source_time",
        "idx_decisions_part_id_time",
    } <= {i.name for i in db["decisions"].indexes}
    assert "decisions_readable" in db.view_names()
    db.close()


def test_ids_are_uuid7_and_sort_by_time() -> None:
    base = 1_795_000_000.0
    timed = [new_id(base + k * 0.5) for k in range(20)]
    assert timed == sorted(timed)
    same_ms = [new_id(base) for _ in range(3000)]  # past the 12-bit counter's room
    assert same_ms == sorted(same_ms)
    assert len(set(same_ms) | set(timed)) == 3020
    parsed = uuid.UUID(timed[0])
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert int(parsed.hex[:12], 16) == int(base * 1000)
    with pytest.raises(ValueError, match="-1"):
        new_id(-1)


def test_append_assigns_ids_that_sort_like_decision_times(dlog: DecisionLog) -> None:
    t = time.time()
    ids = [dlog.append(make_record(i, t + i * 0.001)) for i in range(50)]
    assert ids == sorted(ids)
    assert dlog.flush()
    rows = query(dlog.path, limit=100)
    assert [r["id"] for r in rows] == sorted(ids, reverse=True)


def test_flush_makes_queued_rows_visible_and_close_commits_the_rest(state_dir: Path) -> None:
    config = DecisionLogConfig(batch_size=10_000, flush_interval_s=60)
    log = DecisionLog(state_dir, config, device_id="d")
    log.open()
    try:
        for i in range(10):
            log.append(make_record(i, time.time()))
        assert count_rows(log.path) == 0  # neither a full batch nor the interval yet
        assert log.flush()
        assert count_rows(log.path) == 10
        for i in range(5):
            log.append(make_record(i, time.time()))
    finally:
        log.close()
    assert count_rows(log.path) == 15
    assert log.stats()["written"] == 15


def test_a_full_batch_is_committed_without_waiting_for_the_interval(state_dir: Path) -> None:
    config = DecisionLogConfig(batch_size=50, flush_interval_s=60)
    with DecisionLog(state_dir, config, device_id="d") as log:
        for i in range(120):
            log.append(make_record(i, time.time()))
        assert wait_for(lambda: count_rows(log.path) >= 100)
        time.sleep(0.1)
        assert count_rows(log.path) == 100  # the last 20 wait for the interval
        assert log.stats()["batches"] == 2
        assert log.stats()["queued"] == 20


def test_the_flush_interval_commits_a_partial_batch(state_dir: Path) -> None:
    config = DecisionLogConfig(batch_size=1000, flush_interval_s=0.05)
    with DecisionLog(state_dir, config, device_id="d") as log:
        for i in range(3):
            log.append(make_record(i, time.time()))
        assert wait_for(lambda: count_rows(log.path) == 3)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("non-pass", {"pass": False, "reject": True, "review": True}),
        ("all", {"pass": True, "reject": True, "review": True}),
        ("none", {"pass": False, "reject": False, "review": False}),
    ],
)
def test_thumbnails_are_kept_for_the_configured_outcomes(
    state_dir: Path, mode: str, expected: dict[str, bool]
) -> None:
    config = DecisionLogConfig(thumbnails=mode)
    image = noise(600, 800)
    with DecisionLog(state_dir, config, device_id="d") as log:
        t = 1_795_000_000.0
        ids = {
            outcome: log.append(make_record(i, t + i, outcome=outcome, thumbnail=image))
            for i, outcome in enumerate(expected)
        }
        assert log.flush()
        assert log.stats()["thumbnails"] == sum(expected.values())
    for outcome, kept in expected.items():
        row = get(log.path, ids[outcome])
        assert row is not None
        if not kept:
            assert row["thumbnail"] is None
            continue
        assert row["thumbnail"] == f"thumbnails/2026-11-18/{ids[outcome]}.jpg"
        path = state_dir / row["thumbnail"]
        assert path.stat().st_size <= config.thumbnail_max_bytes
        decoded = cv2.imread(str(path))
        assert decoded is not None
        assert decoded.shape == (240, 320, 3)
    jpgs = list((state_dir / "thumbnails").rglob("*.jpg")) if any(expected.values()) else []
    assert len(jpgs) == sum(expected.values())


def test_a_thumbnail_is_capped_by_stepping_quality_down() -> None:
    image = noise(480, 640, seed=3)
    first = encode_jpeg(image, max_side=320, max_bytes=1_000_000, quality=95)
    capped = encode_jpeg(image, max_side=320, max_bytes=20_000, quality=95)
    assert len(first) > 20_000
    assert len(capped) <= 20_000
    assert cv2.imdecode(np.frombuffer(capped, np.uint8), cv2.IMREAD_COLOR).shape == (240, 320, 3)
    tiny = encode_jpeg(image, max_side=320, max_bytes=1_500, quality=95)  # also shrinks it
    assert len(tiny) <= 1_500
    with pytest.raises(ValueError, match="uint8"):
        encode_jpeg(image.astype(np.float32), 320, 20_000, 85)


@pytest.mark.parametrize(
    "bad",
    [np.zeros((10, 10, 4), np.uint8), np.zeros((10, 10, 3), np.float32), [[0, 0, 0]]],
    ids=["four-channels", "float", "not-an-array"],
)
def test_an_unusable_thumbnail_is_counted_and_the_decision_still_logged(
    dlog: DecisionLog, bad: object
) -> None:
    decision_id = dlog.append(make_record(1, time.time(), outcome="reject", thumbnail=bad))
    assert dlog.flush()
    row = get(dlog.path, decision_id)
    assert row is not None
    assert row["thumbnail"] is None
    assert dlog.stats()["thumbnail_errors"] == 1
    assert not (dlog.state_dir / "thumbnails").exists()


def test_a_record_with_an_unusable_field_is_counted_lost_and_the_batch_kept(
    dlog: DecisionLog, caplog: pytest.LogCaptureFixture
) -> None:
    t = time.time()
    good = dlog.append(make_record(1, t))
    bad = dlog.append(make_record(2, t, capture_time="yesterday"))
    assert dlog.flush()
    assert [r["id"] for r in query(dlog.path)] == [good]
    assert dlog.stats()["lost"] == 1
    assert any(bad in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


def test_migrations_are_recorded_once_and_not_reapplied(state_dir: Path) -> None:
    config = DecisionLogConfig()
    for _ in range(3):
        with DecisionLog(state_dir, config, device_id="d") as log:
            log.append(make_record(1, time.time()))
    conn = sqlite3.connect(state_dir / "decisions.db")
    rows = conn.execute("SELECT name, applied_at FROM _migrations").fetchall()
    conn.close()
    assert [r[0] for r in rows] == [
        "0001_create_decisions",
        "0002_create_shadow_results",
        "0003_create_drift_hours",
        "0004_add_station_fields",
    ]
    assert count_rows(state_dir / "decisions.db") == 3


def test_the_database_is_in_wal_mode_with_incremental_vacuum(dlog: DecisionLog) -> None:
    conn = sqlite3.connect(dlog.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    conn.close()


def test_mark_uploaded_sets_the_flag_of_those_ids_only(dlog: DecisionLog) -> None:
    t = time.time()
    ids = [dlog.append(make_record(i, t + i * 0.01)) for i in range(5)]
    dlog.mark_uploaded(ids[:3])  # the rows are still queued: marking comes after them
    uploaded = {r["id"]: r["uploaded"] for r in query(dlog.path)}
    assert uploaded == {i: int(i in ids[:3]) for i in ids}
    assert dlog.stats()["marked_uploaded"] == 3


def test_a_full_queue_drops_counts_and_logs_at_error_level(
    state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = DecisionLogConfig(queue_bound=50, batch_size=10, flush_interval_s=0.01)
    with DecisionLog(state_dir, config, device_id="d") as log:
        blocker = sqlite3.connect(log.path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the writer now waits for the write lock
        try:
            for i in range(10):
                log.append(make_record(i, time.time()))
            assert wait_for(lambda: log.stats()["queued"] == 0)  # taken, stuck writing
            with caplog.at_level(logging.ERROR, logger="agent.decisionlog"):
                for i in range(200):
                    log.append(make_record(i, time.time()))
            assert log.stats()["dropped"] == 150
            assert log.stats()["queued"] == 50
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert log.flush()
        assert log.stats()["written"] == 60
    assert any(r.levelno == logging.ERROR and "dropped" in r.getMessage() for r in caplog.records)


def test_a_repeated_id_loses_only_that_decision(dlog: DecisionLog) -> None:
    t = time.time()
    dlog.append(make_record(1, t, id="fixed-id"))
    dlog.append(make_record(2, t, id="fixed-id", source="other"))
    dlog.append(make_record(3, t))
    assert dlog.flush()
    assert count_rows(dlog.path) == 2
    assert dlog.stats()["duplicates"] == 1
    row = get(dlog.path, "fixed-id")
    assert row is not None
    assert row["source"] == "cam-1"


def test_nan_and_numpy_values_become_valid_json(dlog: DecisionLog) -> None:
    outputs = {"score": float("nan"), "v": np.int64(3), "arr": np.arange(2, dtype=np.float32)}
    decision_id = dlog.append(make_record(1, time.time(), outputs=outputs))
    assert dlog.flush()
    conn = sqlite3.connect(dlog.path)
    text = conn.execute("SELECT outputs FROM decisions WHERE id = ?", (decision_id,)).fetchone()
    valid = conn.execute("SELECT json_valid(?)", text).fetchone()[0]
    conn.close()
    assert text[0] == '{"score":null,"v":3,"arr":[0.0,1.0]}'
    assert valid == 1


def test_append_refuses_before_open_and_after_close(state_dir: Path) -> None:
    log = DecisionLog(state_dir, DecisionLogConfig(), device_id="d")
    with pytest.raises(DecisionLogError, match="not open"):
        log.append(make_record(1, time.time()))
    log.open()
    assert log.stats()["writer_alive"] == 1
    with pytest.raises(DecisionLogError, match="already open"):
        log.open()
    log.close()
    assert log.stats()["writer_alive"] == 0
    with pytest.raises(DecisionLogError, match="not open"):
        log.append(make_record(1, time.time()))
    assert log.flush(timeout_s=0.1) is False


def test_the_config_refuses_unknown_keys_and_bad_modes() -> None:
    with pytest.raises(pydantic.ValidationError, match="batchsize"):
        DecisionLogConfig(batchsize=3)
    with pytest.raises(pydantic.ValidationError, match="thumbnails"):
        DecisionLogConfig(thumbnails="some")
    assert all(f.description for f in DecisionLogConfig.model_fields.values())


def test_open_deletes_thumbnail_files_no_row_refers_to(state_dir: Path) -> None:
    config = DecisionLogConfig()
    t = 1_795_000_000.0
    with DecisionLog(state_dir, config, device_id="d") as log:
        kept = log.append(make_record(1, t, outcome="reject", thumbnail=noise(40, 60)))
    day = state_dir / "thumbnails" / "2026-11-18"
    (day / f"{new_id(t)}.jpg").write_bytes(b"a row that never committed")
    (day / "x.jpg.tmp").write_bytes(b"half written")
    other = state_dir / "thumbnails" / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("not ours")
    with DecisionLog(state_dir, config, device_id="d") as log:
        assert log.stats()["thumbnail_bytes"] == (day / f"{kept}.jpg").stat().st_size
    assert sorted(p.name for p in day.iterdir()) == [f"{kept}.jpg"]
    assert (other / "keep.txt").exists()


def test_appends_from_several_threads_are_all_written_once(dlog: DecisionLog) -> None:
    ids: list[list[str]] = [[] for _ in range(4)]

    def produce(k: int) -> None:
        t = time.time()
        ids[k].extend(dlog.append(make_record(i, t + i * 1e-4, source=f"t{k}")) for i in range(500))

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert not any(th.is_alive() for th in threads)
    assert dlog.flush(timeout_s=30)
    everything = [i for chunk in ids for i in chunk]
    assert len(set(everything)) == 2000
    assert len(query(dlog.path, limit=5000)) == 2000
    assert dlog.stats()["written"] == 2000
    assert dlog.stats()["dropped"] == 0
