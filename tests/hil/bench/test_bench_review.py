"""The review bench as ``make bench`` runs it, at a small size, on SQLite and on
PostgreSQL: it seeds (the newest decisions with images), answers every request of the
list endpoint, the list page, decision pages and images, and writes its report and table
(no timing is asserted; the figures are the bench's to report); a database that holds
decisions it refuses to seed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from agent.wire.jpeg import jpeg_size
from fleet_server.db import open_database
from fleet_server.db.tables import decision_images, decision_reviews, decisions, devices
from hil.bench.review_timing import DETAIL_PAGE, IMAGE, LIST_API, LIST_PAGE, scenarios

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db_url (SQLite and PostgreSQL), pg_cluster

REPO = Path(__file__).resolve().parents[3]
RUN_TIMEOUT_S = 300


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hil.cli", "bench", "review", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def test_the_bench_seeds_times_every_scenario_writes_its_report_and_will_not_seed_again(
    db_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "report.json"
    done = bench(
        "--decisions", "3000", "--devices", "40", "--requests", "60", "--images", "500",
        "--db-url", db_url, "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report == json.loads(done.stdout)
    assert report["backend"] == db_url.split(":", maxsplit=1)[0].split("+", maxsplit=1)[0]
    assert (report["decisions"], report["devices"], report["reviews"]) == (3000, 40, 30)
    assert report["images"] == 500
    assert set(report["scenarios"]) == set(scenarios(40, 0.0, 1.0))
    assert set(report["list_page_scenarios"]) == set(scenarios(40, 0.0, 1.0))
    assert report["requests"] == report["overall"]["n"] == 60
    assert report["scenarios"]["none"]["rows"] > 0
    assert report["list_page_scenarios"]["none"]["rows"] > 0
    assert report["overall"]["p95_ms"] <= report["overall"]["max_ms"]
    pages = report["pages"]
    assert list(pages) == [LIST_API, LIST_PAGE, DETAIL_PAGE, IMAGE]
    for name, figures in pages.items():
        assert figures["n"] == 60, name
        assert figures["p50_ms"] <= figures["p95_ms"] <= figures["p99_ms"] <= figures["max_ms"]
        assert figures["meets_target"] == (figures["p95_ms"] < report["target_p95_ms"])
        assert f"| {name} (`{figures['path']}`) | 60 |" in done.stderr  # the table
    assert pages[DETAIL_PAGE]["with_image"] == 30  # half the decisions opened had one
    assert report["meets_target"] == all(p["meets_target"] for p in pages.values())
    engine = open_database(db_url)
    with engine.connect() as conn:
        counts = [
            conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in (devices, decisions, decision_reviews, decision_images)
        ]
        newest = conn.execute(sa.select(decisions.c.id).order_by(decisions.c.ts.desc()).limit(1))
        image = conn.execute(
            sa.select(decision_images.c.data).where(
                decision_images.c.decision_id == newest.scalar_one()
            )
        ).scalar_one()
    engine.dispose()
    assert counts == [40, 3000, 30, 500]
    assert jpeg_size(bytes(image)) == (320, 240)
    # the database it seeded holds decisions now: another run refuses it
    again = bench("--decisions", "200", "--devices", "5", "--db-url", db_url)
    assert again.returncode == 2
    assert "holds decisions already" in again.stderr
