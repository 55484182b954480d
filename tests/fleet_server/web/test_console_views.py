"""The console's pure parts: health at a glance, SVG charts, health series, gate rows,
the new-rollout form and its preview's wave split, the sign-in redirect target."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

import pytest

from fleet_server.rollout import DeviceInfo, GatePolicy, RolloutError, Tick, parse_spec, plan, step
from fleet_server.web.charts import (
    Segment,
    Series,
    Stack,
    line_chart,
    nice_ticks,
    progress_bar,
    stacked_bars,
    time_ticks,
)
from fleet_server.web.gateview import gate_rows
from fleet_server.web.health import glance
from fleet_server.web.pages import safe_next
from fleet_server.web.rolloutform import RolloutForm
from fleet_server.web.rolloutview import DEVICES_SHOWN, rollout_page
from fleet_server.web.series import MAX_POINTS, bucket, health_charts
from tests.fleet_server.web.console_seed import health

NOW = 1_700_000_000.0
SVG = "{http://www.w3.org/2000/svg}"


def parse(markup: str) -> ET.Element:
    return ET.fromstring(markup)  # noqa: S314 (markup made by the code under test)


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


# -- health at a glance ----------------------------------------------------------------


def test_an_offline_device_is_a_problem_named_with_how_long() -> None:
    g = glance(online=False, last_seen=NOW - 3 * 3600, revoked=False, health=None, now=NOW)
    assert (g.level, g.label, g.text) == ("bad", "Problem", "offline for 3 h")


def test_a_hot_device_is_a_problem_and_the_worst_finding_is_named_first() -> None:
    report = health(NOW, 1, temp=90.0, free_mb=1_000.0)
    g = glance(online=True, last_seen=NOW, revoked=False, health=report, now=NOW, budget_ms=5.0)
    assert g.level == "bad"
    assert g.text.startswith("soc 9")  # the hottest zone, in °C
    assert "more" in g.text
    assert any("disk" in f for f in g.findings)
    assert any("budget 5 ms" in f for f in g.findings)


def test_a_healthy_device_is_ok_and_one_without_a_report_is_unknown() -> None:
    ok = glance(online=True, last_seen=NOW, revoked=False, health=health(NOW, 1), now=NOW)
    assert (ok.level, ok.text) == ("ok", "healthy")
    none = glance(online=True, last_seen=NOW, revoked=False, health=None, now=NOW)
    assert (none.level, none.label) == ("unknown", "No data")
    silent = glance(online=True, last_seen=NOW - 900, revoked=False, health=None, now=NOW)
    assert (silent.level, silent.text) == ("warn", "silent for 15 min")


def test_a_revoked_device_is_a_problem_whatever_it_reports() -> None:
    g = glance(online=True, last_seen=NOW, revoked=True, health=health(NOW, 1), now=NOW)
    assert (g.level, g.text) == ("bad", "revoked")


# -- charts ----------------------------------------------------------------------------


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    ticks = nice_ticks(0, 37)
    assert ticks[0] == 0
    assert ticks[-1] >= 37
    steps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
    assert steps == {10.0}
    assert time_ticks(0, 3600) == [0, 600, 1200, 1800, 2400, 3000, 3600]


def test_a_line_chart_has_axes_units_a_legend_with_last_values_and_breaks_at_gaps() -> None:
    points = [(NOW + i * 60, float(i)) for i in range(10)]
    points += [(NOW + 3600 + i * 60, 5.0) for i in range(5)]  # a 50-minute outage
    chart = line_chart(
        title="Latency", unit="ms", series=[Series("m p99", points)], start=NOW, end=NOW + 4000,
        threshold=("budget 8 ms", 8.0),
    )  # fmt: skip
    root = parse(chart)
    words = texts(root)
    assert "Latency" in words
    assert "ms" in words
    assert "m p99: 5 ms" in words  # the legend gives the last value with its unit
    assert "budget 8 ms" in words
    assert len(root.findall(f"{SVG}polyline")) == 2  # the gap splits the line
    assert "Latency (ms): m p99: 5 ms" in (root.get("aria-label") or "")


def test_a_chart_without_data_says_so() -> None:
    root = parse(line_chart(title="CPU", unit="%", series=[], start=NOW, end=NOW + 60))
    assert "no data in this range" in texts(root)


def test_text_in_charts_is_escaped() -> None:
    chart = line_chart(
        title="<script>", unit="&", series=[Series("a<b", [(NOW, 1.0)])], start=NOW, end=NOW + 1
    )
    assert "<script>" not in chart
    assert "a&lt;b" in chart


def test_stacked_bars_total_each_category_in_the_legend() -> None:
    edges = [NOW, NOW + 60, NOW + 120]
    stacks = [Stack("pass", "o-pass", [3, 4]), Stack("reject", "o-reject", [1, 0])]
    root = parse(stacked_bars(title="Decisions", unit="decisions", edges=edges, stacks=stacks))
    assert {"pass: 7", "reject: 1"} <= set(texts(root))
    assert len(root.findall(f"{SVG}rect")) == 3  # zero counts draw nothing


def test_a_progress_bar_labels_its_segments_and_marker() -> None:
    segments = [Segment("done", 3, "st-done"), Segment("pending", 7, "st-pending")]
    root = parse(progress_bar(segments, 10, label="all", marker=("wave 2 target: 5", 5)))
    words = texts(root)
    assert "done 3, pending 7 (of 10)" in words
    assert "wave 2 target: 5" in words
    assert root.get("aria-label") == "all: done 3, pending 7 of 10"


# -- health series ---------------------------------------------------------------------


def test_health_reports_become_one_series_per_camera_model_and_zone() -> None:
    reports = [(NOW + i * 10, health(NOW + i * 10, i)) for i in range(30)]
    charts = {c.key: c for c in health_charts(reports, NOW, NOW + 300)}
    assert [s.name for s in charts["fps"].series] == ["cam0", "cam1"]
    latency = charts["latency"].series
    assert [(s.name, s.dashed) for s in latency] == [
        ("detector p99", False), ("detector p50", True), ("ocr p99", False), ("ocr p50", True),
    ]  # fmt: skip
    assert latency[0].color == latency[1].color != latency[2].color
    assert {s.name for s in charts["temperature"].series} == {"soc", "board"}
    assert {s.name for s in charts["disk"].series} == {"free", "used"}
    assert len(charts["cpu"].series[0].points) == 30


def test_long_ranges_are_bucketed_keeping_the_peak() -> None:
    points = [(float(i), 1.0) for i in range(10_000)]
    points[5_000] = (5_000.0, 99.0)
    out = bucket(points, 0, 10_000, max)
    assert len(out) <= MAX_POINTS
    assert max(v for _, v in out) == 99.0


# -- gates -----------------------------------------------------------------------------


def test_gate_rows_put_each_value_against_its_threshold() -> None:
    metrics: dict[str, float | int | str | None] = {
        "devices": 3, "install_failures": 1, "install_failures_allowed": 0, "auto_rollbacks": 0,
        "worker_crashes": 0, "p99_ms_max": 12.0, "devices_over_budget": 0, "p99_ratio": 1.4,
        "outcome_samples": 10, "baseline_outcome_samples": 20,
        "outcome_tvd": "skipped: too few decisions",
    }  # fmt: skip
    rows = {r.check: r for r in gate_rows(metrics, GatePolicy(), 40.0)}
    assert (rows["Install failures"].value, rows["Install failures"].verdict) == ("1", "over")
    assert rows["Worker crashes"].verdict == "within"
    ratio = rows["p99 / previous version's p99"]
    assert (ratio.value, ratio.threshold, ratio.verdict) == ("1.4 x", "≤ 1.25 x", "over")
    assert rows["Outcome shift (TVD)"].verdict == "skipped"
    assert "highest p99 12 ms" in rows["Devices over latency budget"].note
    off = {r.check: r for r in gate_rows({}, GatePolicy(max_p99_ratio=None), None)}
    assert off["p99 / previous version's p99"].verdict == "off"
    assert off["Devices over latency budget"].verdict == "skipped"


# -- the new-rollout form --------------------------------------------------------------


def form(**changes: str) -> RolloutForm:
    data = {"rollout_id": "ro-0123456789ab", "bundle": "detector@1.5.0", "selector": "line=4",
            "waves": "1,50%,100%", "soak": "2m", "approval": "on"} | changes  # fmt: skip
    return RolloutForm.from_fields(data)


def test_the_form_becomes_a_spec_with_policy_shifts_and_gates() -> None:
    spec = form(shifts="4: 06:00-14:00, 14:00-22:00\n*: 22:00-06:00", max_p99_ratio="").spec()
    assert (spec.bundle, spec.version, spec.selector) == ("detector", "1.5.0", {"line": "4"})
    assert (spec.waves, spec.soak_s) == (["1", "50%", "100%"], 120)
    assert spec.policy.approval_between_waves is True
    assert spec.policy.rollback_done_waves_on_failure is False  # the box was not sent
    assert spec.policy.shifts == {"4": ["06:00-14:00", "14:00-22:00"], "*": ["22:00-06:00"]}
    assert spec.policy.gates.max_p99_ratio is None


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"waves": "50%,10%"}, "waves"),
        ({"soak": "ten minutes"}, "soak_s"),
        ({"selector": "line"}, "selector"),
        ({"bundle": ""}, "bundle"),
        ({"rollout_id": "x"}, "rollout_id"),
        ({"shifts": "06:00-14:00"}, "policy.shifts"),
        ({"shifts": "4: 6 to 14"}, "policy.shifts"),
        ({"timezone": "Mars/Olympus"}, "policy.timezone"),
        ({"max_outcome_tvd": "lots"}, "policy.gates.max_outcome_tvd"),
    ],
)
def test_a_bad_field_is_named(changes: dict[str, str], field: str) -> None:
    with pytest.raises(RolloutError) as err:
        form(**changes).spec()
    assert err.value.field == field


def test_after_sign_in_only_console_paths_are_followed() -> None:
    assert safe_next("/ui/devices/a1?span=1h") == "/ui/devices/a1?span=1h"
    for evil in ("https://evil.example/ui/", "//evil.example/ui/", "/api/v1/me", "/ui\\x", None):
        assert safe_next(evil) == "/ui/"


def test_a_big_rollouts_page_lists_devices_needing_attention_first_and_its_actions() -> None:
    spec = parse_spec({"bundle": "detector@1.5.0", "selector": "*", "waves": "1,100%",
                       "soak_s": "1m"})  # fmt: skip
    devices = [DeviceInfo(f"d{i:03d}", {"line": "1"}) for i in range(300)]
    planned = plan("ro-0123456789ab", spec, 3, devices, NOW)
    page = rollout_page(planned)
    assert (page.devices_total, len(page.devices)) == (300, DEVICES_SHOWN)
    assert page.actions == ["pause", "cancel", "rollback"]
    started, _ = step(planned, Tick(NOW + 1))  # wave 1: one device assigned
    page = rollout_page(started)
    assert page.devices[0].status == "assigned"
    assert page.actions == ["pause", "cancel", "rollback"]
    assert [w.adds for w in page.waves] == [1, 299]
    assert "assigned 1" in page.overall
