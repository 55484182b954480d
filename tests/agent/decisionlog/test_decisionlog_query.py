"""Reading the decision log: filters, formats, times, the documented sqlite3 queries."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agent import cli
from agent.decisionlog import (
    DecisionLog,
    DecisionLogConfig,
    format_rows,
    get,
    parse_time,
    query,
)
from agent.decisionlog.bench import bench_writer
from agent.errors import DecisionLogError
from tests.agent.decisionlog.decisionlog_driver import make_record

DOC = Path(__file__).resolve().parents[3] / "docs" / "decision-log.md"
T0 = 1_795_000_000.0


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A log of 30 decisions, one a minute from T0: sources cam-0..2, every third a
    reject, versions 1.0 (first 15) and 2.0; the even ones answer station st-1's
    triggers, on parts P-0000, P-0001, ... (two decisions a part: i // 4, every fourth
    late), the odd ones are free-running. Returns the db path and ids, oldest first."""
    state_dir = tmp_path_factory.mktemp("qstate")
    with DecisionLog(state_dir, DecisionLogConfig(), device_id="d") as log:
        ids = [
            log.append(
                make_record(
                    i,
                    T0 + 60 * i,
                    outcome="reject" if i % 3 == 0 else "pass",
                    model_version="1.0" if i < 15 else "2.0",
                    outputs={"label": "scratch", "score": i / 100, "n": i},
                    **(
                        {"station": "st-1", "part_id": f"P-{i // 4:04d}"}
                        | {"deadline_missed": i % 4 == 2}
                        if i % 2 == 0
                        else {}
                    ),
                )
            )
            for i in range(30)
        ]
    return state_dir / "decisions.db", ids


def test_query_returns_newest_first_up_to_the_limit(logged: tuple[Path, list[str]]) -> None:
    db, ids = logged
    assert [r["id"] for r in query(db, limit=5)] == ids[::-1][:5]
    assert len(query(db)) == 30


def test_query_filters_by_time_source_outcome_and_version(
    logged: tuple[Path, list[str]],
) -> None:
    db, ids = logged
    window = query(db, since=T0 + 60 * 10, until=T0 + 60 * 20)
    assert [r["id"] for r in window] == ids[19:9:-1]  # since inclusive, until exclusive
    assert {r["source"] for r in query(db, source="cam-1")} == {"cam-1"}
    assert len(query(db, source="cam-1")) == 10
    rejects = query(db, outcome="reject", model_version="2.0")
    assert [r["id"] for r in rejects] == [ids[i] for i in (27, 24, 21, 18, 15)]
    assert query(db, source="nobody") == []


def test_query_filters_by_part_id_and_station(logged: tuple[Path, list[str]]) -> None:
    db, ids = logged
    part = query(db, part_id="P-0003")
    assert [r["id"] for r in part] == [ids[14], ids[12]]
    assert [(r["station"], r["deadline_missed"]) for r in part] == [("st-1", True), ("st-1", False)]
    assert len(query(db, station="st-1")) == 15
    assert [r["id"] for r in query(db, station="st-1", part_id="P-0000", outcome="reject")] == [
        ids[0]
    ]
    assert query(db, part_id="P-9999") == []
    assert query(db, station="st-2") == []
    free = [r for r in query(db) if r["station"] == ""]
    assert len(free) == 15
    assert {(r["part_id"], r["deadline_missed"]) for r in free} == {("", False)}


def test_edge_agent_decisions_lists_the_decisions_on_one_part(
    logged: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    db, ids = logged
    assert cli.main(["decisions", "--db", str(db), "--part-id", "P-0001", "--format", "jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == [ids[6], ids[4]]
    assert {r["part_id"] for r in rows} == {"P-0001"}
    # --json: the same lines as --format jsonl
    assert cli.main(["decisions", "--db", str(db), "--part-id", "P-0001", "--json"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [
        ids[6], ids[4]
    ]  # fmt: skip
    assert cli.main(["decisions", "--db", str(db), "--station", "st-1", "--limit", "2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:6] == [
        "id",
        "decision_time_utc",
        "source",
        "line",
        "station",
        "part_id",
    ]
    assert "P-0007" in table[2]  # the newest station decision, i = 28


def test_get_returns_one_decision_or_none(logged: tuple[Path, list[str]]) -> None:
    db, ids = logged
    row = get(db, ids[7])
    assert row is not None
    assert row["outputs"] == {"label": "scratch", "score": 0.07, "n": 7}
    assert get(db, "no-such-id") is None


def test_query_of_a_missing_log_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DecisionLogError, match=r"nowhere\.db"):
        query(tmp_path / "nowhere.db")
    with pytest.raises(DecisionLogError, match="limit"):
        query(tmp_path / "nowhere.db", limit=0)


def test_reading_works_while_the_log_is_open_for_writing(tmp_path: Path) -> None:
    with DecisionLog(tmp_path, DecisionLogConfig(), device_id="d") as log:
        first = log.append(make_record(1, time.time()))
        assert log.flush()
        assert [r["id"] for r in query(log.path)] == [first]
        second = log.append(make_record(2, time.time() + 1))
        assert log.flush()
        assert [r["id"] for r in query(log.path)] == [second, first]


def test_csv_parses_back_with_json_columns_as_json_text(logged: tuple[Path, list[str]]) -> None:
    db, _ = logged
    rows = query(db, limit=4)
    parsed = list(csv.DictReader(io.StringIO(format_rows(rows, "csv"))))
    assert [p["id"] for p in parsed] == [r["id"] for r in rows]
    assert [json.loads(p["outputs"]) for p in parsed] == [r["outputs"] for r in rows]
    assert [float(p["decision_time"]) for p in parsed] == [r["decision_time"] for r in rows]
    assert parsed[0]["thumbnail"] == ""  # NULL


def test_jsonl_parses_back_to_the_same_rows(logged: tuple[Path, list[str]]) -> None:
    db, _ = logged
    rows = query(db, limit=4)
    lines = format_rows(rows, "jsonl").splitlines()
    assert [json.loads(line) for line in lines] == rows


def test_table_shows_a_header_and_one_line_per_row(logged: tuple[Path, list[str]]) -> None:
    db, ids = logged
    text = format_rows(query(db, limit=3), "table")
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["id", "decision_time_utc", "source"]
    assert len(lines) == 5
    assert lines[2].startswith(ids[-1])
    assert "(no decisions)" in format_rows([], "table")
    with pytest.raises(ValueError, match="xml"):
        format_rows([], "xml")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-21T10:00:00", 1_795_255_200.0),
        ("2026-11-21T10:00:00Z", 1_795_255_200.0),
        ("2026-11-21T10:00:00.5z", 1_795_255_200.5),
        ("2026-11-21T12:00:00+02:00", 1_795_255_200.0),
        ("2026-11-21", 1_795_219_200.0),
        ("1795255200.25", 1_795_255_200.25),
        ("15m", 1_795_255_200.0 - 900),
        ("2h", 1_795_255_200.0 - 7200),
        ("1d", 1_795_255_200.0 - 86_400),
        ("90s ago", 1_795_255_200.0 - 90),
        ("1.5h", 1_795_255_200.0 - 5400),
    ],
)
def test_parse_time_reads_iso_dates_and_ages(text: str, expected: float) -> None:
    assert parse_time(text, now=1_795_255_200.0) == expected


@pytest.mark.parametrize("text", ["yesterday", "15 minutes", "2026-13-01", "", "-5m"])
def test_parse_time_names_the_text_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        parse_time(text)


def doc_sql_blocks() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def test_the_documented_queries_run_in_the_sqlite3_shell(tmp_path: Path) -> None:
    sqlite3_cli = shutil.which("sqlite3")
    assert sqlite3_cli, "the sqlite3 shell is not installed (apt install sqlite3)"
    blocks = doc_sql_blocks()
    assert len(blocks) >= 3
    now = time.time()
    with DecisionLog(tmp_path, DecisionLogConfig(), device_id="d") as log:
        ids = [
            log.append(
                make_record(
                    i,
                    now - 60 + i,
                    outcome="reject" if i % 2 else "pass",
                    thumbnail=None,
                    outputs={"score": 0.5 + i / 100},
                    station="st-1",
                    part_id=f"P-{i:04d}",
                    deadline_missed=i == 3,
                )
            )
            for i in range(6)
        ]
        # Run while the agent has the log open: the shell reads the WAL.
        assert log.flush()
        outputs = []
        for sql in blocks:
            done = subprocess.run(
                [sqlite3_cli, "-bail", "-readonly", str(log.path), sql],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert done.returncode == 0, f"{sql}\n{done.stderr}"
            assert done.stderr == ""
            outputs.append(done.stdout)
    assert ids[-1] in outputs[0]  # the latest decisions
    assert "cam-1|" in outputs[1] or "cam-0|" in outputs[1]  # rejects per camera
    assert f"{ids[5]}|reject|0.55|4.5" in outputs[2]
    assert outputs[3].startswith("1.2.0|6|15.0|15.0|6")
    assert outputs[4].startswith(f"{ids[3]}|")
    assert outputs[4].rstrip().endswith("|st-1|reject|1")
    assert len(outputs[4].splitlines()) == 1


def test_bench_writer_reports_both_rates(tmp_path: Path) -> None:
    figures = bench_writer(tmp_path, rows=2_000)
    assert figures["rows"] == 2_000
    assert figures["writer_rows_per_s"] > 0
    assert figures["raw_executemany_rows_per_s"] > 0
    assert figures["ratio"] == pytest.approx(
        figures["writer_rows_per_s"] / figures["raw_executemany_rows_per_s"]
    )
