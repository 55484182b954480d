"""The report: JSON with every figure, and the summary table people read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hil.report import ERROR, FAIL, PASS, UNAVAILABLE, Check, Report, ScenarioReport, render_table


def _report() -> Report:
    good = ScenarioReport("offline", "10 minutes offline", "sim", "short")
    good.checks = [
        Check("every decision arrives exactly once", PASS, {"local": 900, "missing": 0}),
        Check("the backlog drains", PASS, {"drain_s": 4.25, "outbox": {"pending": 61}}),
    ]
    good.faults = [{"fault": "link-down", "method": "ip link", "applied_s": 60.0}]
    bad = ScenarioReport("disk-full", "disk full", "sim", "short")
    bad.checks = [
        Check("the alarm is raised", FAIL, {"alarms": {}}, "no alarm counted on /metrics"),
        Check("the outbox drops by the configured policy", UNAVAILABLE, detail="no tmpfs"),
    ]
    return Report(scenarios=[good, bad], wall_s=123.4)


def test_the_table_has_a_row_per_check_with_result_and_figures() -> None:
    text = render_table(_report())
    lines = text.splitlines()
    assert lines[0].split() == ["scenario", "invariant", "result", "figures"]
    row = next(x for x in lines if x.startswith("offline"))
    assert "PASS" in row
    assert "local=900, missing=0" in row
    assert any("drain_s=4.25, outbox={pending: 61}" in x for x in lines)
    assert any("fault: fault=link-down, method=ip link, applied_s=60" in x for x in lines)
    assert any(x.startswith("disk-full") and "FAIL" in x for x in lines)
    assert any("-> no alarm counted on /metrics" in x for x in lines)
    assert lines[-1] == "FAILED: 2 scenario(s), 1 pass, 1 fail; 123 s"


def test_long_figures_wrap_within_the_width() -> None:
    report = _report()
    report.scenarios[0].checks[0].figures = {f"figure_{i}": i * 1000 for i in range(30)}
    assert all(len(line) <= 120 for line in render_table(report, width=120).splitlines())


def test_json_report_holds_every_check_and_the_verdicts(tmp_path: Path) -> None:
    path = tmp_path / "out" / "report.json"
    _report().write(path)
    data = json.loads(path.read_text())
    assert data["passed"] is False
    assert [s["result"] for s in data["scenarios"]] == [PASS, FAIL]
    assert data["scenarios"][0]["checks"][1]["figures"] == {
        "drain_s": 4.25,
        "outbox": {"pending": 61},
    }
    assert data["scenarios"][1]["checks"][1]["detail"] == "no tmpfs"
    assert data["machine"]["cpus"] >= 1


def test_a_scenario_result_is_its_worst_check() -> None:
    s = ScenarioReport("x", "x", "sim", "short")
    assert s.result == ERROR  # nothing judged
    s.checks = [Check("a", PASS), Check("b", UNAVAILABLE)]
    assert s.result == UNAVAILABLE
    s.checks.append(Check("c", FAIL))
    assert s.result == FAIL
    assert Report(scenarios=[]).passed is False


def test_an_unknown_result_is_refused() -> None:
    with pytest.raises(ValueError, match="'maybe' is not one of"):
        Check("a", "maybe")
