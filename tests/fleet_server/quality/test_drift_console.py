"""The console's drift views on a seeded fleet (real server, real HTTP, signed-in users):
the drift page with its per-model-version SVG chart and per-line verdicts, and the drift
badge on the flagged line's group in the overview and on its devices' pages only."""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET

from fleet_server.config import DriftSection
from fleet_server.quality.drift import DriftSettings
from fleet_server.quality.drift_job import run_drift
from tests.fleet_server.quality.drift_data import PERIOD, fill
from tests.fleet_server.web.console_http_support import Console

pytest_plugins = ["tests.fleet_server.db_fixtures", "tests.fleet_server.web.console_http_fixtures"]

SECTION = DriftSection(reference_hours=10 * PERIOD / 3600, window_hours=6 * PERIOD / 3600)
SETTINGS = DriftSettings.of(SECTION)


def _drifting_line_1(console: Console) -> None:
    t0 = int(time.time()) // PERIOD * PERIOD - 14 * PERIOD
    engine = console.engine
    ctx = console.server.context  # the server's [drift]: these windows
    ctx.config = ctx.config.model_copy(update={"drift": SECTION})
    fill(engine, "a1-01", "1", t0, range(10), 120)
    fill(engine, "a1-01", "1", t0, range(10, 15), 120, brightness=45.0)
    fill(engine, "a2-01", "2", t0, range(15), 120)
    run_drift(engine, SETTINGS)


def _group_header(page: str, line: str) -> str:
    m = re.search(rf"<h2>plant-a · line {line}(.*?)</h2>", page, re.S)
    assert m is not None, f"no group of line {line}"
    return m.group(1)


def test_the_drift_page_charts_each_model_version_and_judges_each_line(console: Console) -> None:
    _drifting_line_1(console)
    page = console.client("vic").get("/ui/drift")
    assert page.status == 200, page.text
    assert page.text.count('data-testid="drift-version"') == 1
    rows = dict(
        re.findall(r'data-testid="drift-row" data-line="(\w+)">(.*?)</tr>', page.text, re.S)
    )
    assert set(rows) == {"1", "2"}
    assert ">drifted<" in rows["1"]
    assert ">ok<" in rows["2"]
    assert 'class="txt-bad"' in rows["1"]  # the brightness cell
    assert 'class="txt-bad"' not in rows["2"]
    svg = re.search(r'<figure class="chart-box" data-chart="drift">(.*?)</figure>', page.text, re.S)
    assert svg is not None
    root = ET.fromstring(svg.group(1))  # noqa: S314 (markup made by the code under test)
    label = root.get("aria-label") or ""
    assert label.startswith("cls 1.0.0: largest PSI against the reference (PSI)")
    (line1,) = re.findall(r"line 1: ([\d.]+) PSI", label)
    (line2,) = re.findall(r"line 2: ([\d.]+) PSI", label)
    assert float(line1) > SETTINGS.psi_threshold
    assert float(line2) < SETTINGS.psi_threshold
    filtered = console.client("vic").get("/ui/drift?line=2")
    assert 'data-line="1"' not in filtered.text
    assert 'data-line="2"' in filtered.text
    assert "Drift</a>" in page.text  # in the navigation


def test_the_flagged_line_and_its_devices_carry_the_drift_badge(console: Console) -> None:
    _drifting_line_1(console)
    vic = console.client("vic")
    overview = vic.get("/ui/").text
    assert 'data-testid="drift-badge"' in _group_header(overview, "1")
    assert "drift: cls 1.0.0" in _group_header(overview, "1")
    assert 'data-testid="drift-badge"' not in _group_header(overview, "2")
    on_line_1 = vic.get("/ui/devices/a1-02").text
    assert 'data-testid="drift-badge"' in on_line_1
    assert "drift: cls 1.0.0 on line 1" in on_line_1
    assert 'data-testid="drift-badge"' not in vic.get("/ui/devices/a2-01").text


def test_without_drift_buckets_the_page_says_so(console: Console) -> None:
    page = console.client("lena").get("/ui/drift?model=cls")
    assert page.status == 200
    assert "No drift buckets stored for these filters." in page.text
    assert 'data-testid="drift-badge"' not in console.client("lena").get("/ui/").text


def test_a_line_with_too_few_decisions_shows_how_far_it_is_from_being_judged(
    console: Console,
) -> None:
    t0 = int(time.time()) // PERIOD * PERIOD - 14 * PERIOD
    ctx = console.server.context
    ctx.config = ctx.config.model_copy(update={"drift": SECTION})
    fill(console.engine, "a3-01", "3", t0, range(15), 12)  # 12 a period: too few
    page = console.client("vic").get("/ui/drift?line=3")
    row = re.search(r'data-testid="drift-row" data-line="3">(.*?)</tr>', page.text, re.S)
    assert row is not None, page.text
    assert "not judged" in row.group(1)
    progress = re.search(r'data-testid="drift-progress">([^<]+)<', row.group(1))
    assert progress is not None
    m = SETTINGS.min_count
    # the reference's 10 periods, and the window's periods so far (5 or 6 by the clock)
    assert re.fullmatch(rf"120 of {m} in the reference, (60|72) of {m} now", progress.group(1))
