"""The console's accuracy table (``/ui/decisions``) over real HTTP on SQLite: one row per
model version and line, each with its 95 % Wilson interval and precision/recall per
outcome."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from pathlib import Path

from fleet_server.db import sqlite_url
from fleet_server.quality.stats import wilson_interval
from tests.fleet_server.review_data import Fleet
from tests.fleet_server.test_accuracy_intervals import LINE_1_V1, seed
from tests.fleet_server.web.console_http_support import Console

DASH = "\u2013"  # the en dash the table puts between the bounds

pytest_plugins = ["tests.fleet_server.db_fixtures", "tests.fleet_server.web.console_http_fixtures"]


def test_the_accuracy_table_shows_each_version_with_its_interval_and_outcomes(
    start: Callable[[str], Console], tmp_path: Path
) -> None:
    console = start(sqlite_url(tmp_path / "fleet.db"))
    fleet = Fleet()
    fleet.add_device(console.engine, "d1", line="1")
    seed(console.engine, fleet, "d1", LINE_1_V1, line="1", version="1.0.0")
    seed(console.engine, fleet, "d1", {("pass", "pass"): 3, ("pass", "reject"): 3}, line="1",
         version="1.1.0")  # fmt: skip
    page = console.client("vic").get("/ui/decisions")
    assert page.status == 200, page.text
    rows = re.findall(r'<tr data-testid="accuracy-row">(.*?)</tr>', page.text, re.S)
    assert len(rows) == 2
    cells = [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)] for r in rows]
    assert [c[:5] for c in cells] == [
        ["1", "1.0.0", "20", "17", "3"],
        ["1", "1.1.0", "6", "3", "3"],
    ]
    lo, hi = wilson_interval(17, 20)
    assert cells[0][6] == f"{lo * 100:.1f}{DASH}{hi * 100:.1f} %"
    lo, hi = wilson_interval(3, 6)
    assert cells[1][6] == f"{lo * 100:.1f}{DASH}{hi * 100:.1f} %"
    outcomes = re.sub(r"<[^>]+>", " ", cells[0][7])
    p_lo, p_hi = wilson_interval(8, 10)
    r_lo, r_hi = wilson_interval(8, 9)
    assert (
        f"reject: P 0.80 [{p_lo:.2f}{DASH}{p_hi:.2f}] · R 0.89 [{r_lo:.2f}{DASH}{r_hi:.2f}]"
        in outcomes
    )
    # 1.1.0 never called reject: no precision, and the interval says nothing is known
    assert f"reject: P — [0.00{DASH}1.00] · R 0.00" in re.sub(r"<[^>]+>", " ", cells[1][7])
