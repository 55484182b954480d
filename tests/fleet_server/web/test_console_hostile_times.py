"""Device clocks are data: rows stored with absurd times (1e300, -1, 0, year 10000, 1e18,
NaN where the database keeps it) never break a view. Every console page, the CSV export
and ``fleetctl devices list`` (and ``--json``) answer normally, on SQLite and
PostgreSQL, with the rows written straight into the database (what ingest of an older
server, or a restore, may have left there)."""

from __future__ import annotations

import csv
import io
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from fleet_server.db import sqlite_url, store
from fleet_server.db.store import DecisionRecord, EventRecord, Record
from fleet_server.db.tables import devices
from tests.fleet_server.fleet_api_support import OPERATOR_TOKEN
from tests.fleet_server.web.console_http_support import SPEC, Console
from tests.fleet_server.web.console_seed import FEATURED, decision_payload, health, seed_fleet

pytest_plugins = ["tests.fleet_server.db_fixtures", "tests.fleet_server.web.console_http_fixtures"]

HOSTILE = (1e300, -1.0, 0.0, 253402300800.0, 1e18, -1e300, -62135596801.0)
"""Far future, just before the epoch, the epoch, year 10000, 1e18 s, far past, year 0."""

FLEETCTL = """
import argparse, sys
from fleet_server.cli.fleet import add_fleet_commands
parser = argparse.ArgumentParser(prog="fleetctl")
add_fleet_commands(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


def _device(n: int) -> str:
    return f"clock-{n}"


def seed_hostile(engine: sa.Engine, now: float) -> list[str]:
    """A device per hostile time (last seen, enrolled, its health report dated then), and
    heartbeats, health samples, events and decisions at each time on the featured device
    and on its own. Answers the ids of the hostile decisions."""
    rng = random.Random(3)
    decision_ids = []
    for n, ts in enumerate(HOSTILE):
        d = _device(n)
        report = health(ts, n)
        report["device_id"] = d
        store.upsert_device(
            engine, d, now=now, labels={"site": "plant-a", "line": "1"}, profile="x86-gateway",
            agent_version="0.1.0", active_bundle="detector", active_release=2, health=report,
        )  # fmt: skip
        with engine.begin() as conn:
            conn.execute(
                sa.update(devices)
                .where(devices.c.device_id == d)
                .values(last_seen=ts, enrolled_at=ts, online=n % 2 == 0)
            )
        for owner in (d, FEATURED):
            rec = Record(owner, f"hostile:{n}", ts, report | {"device_id": owner})
            store.insert_telemetry(engine, [rec])
            store.insert_heartbeats(engine, [Record(owner, f"hb:{n}", ts, {"ts": ts})])
            store.insert_events(
                engine,
                [EventRecord(owner, f"alarm:hostile:{n}", ts, "alarm",
                             {"message": f"clock {ts!r}", "at": ts})],
            )  # fmt: skip
            payload = decision_payload(owner, ts, n, ("pass", "reject", "review")[n % 3], rng)
            payload["capture_time"] = ts
            decision_ids.append(str(payload["id"]))
            store.insert_decisions(
                engine,
                [DecisionRecord(str(payload["id"]), owner, ts, "cam0", str(payload["outcome"]),
                                "detector", "1.4.0", payload)],
            )  # fmt: skip
    return decision_ids


def _ok(page_status: int, text: str, what: str) -> None:
    assert page_status == 200, f"{what}: {page_status} {text[:2000]}"


def test_every_view_shows_rows_with_absurd_device_times(
    start: Callable[[str], Console], db_url: str
) -> None:
    c = start(db_url)
    now = time.time()
    seed_fleet(c.engine, now)
    decision_ids = seed_hostile(c.engine, now)
    c.rollouts.service.create(SPEC)
    olga = c.client("olga")
    overview = olga.get("/ui/")
    _ok(overview.status, overview.text, "overview")
    assert "invalid time" in overview.text or "clock-0" in overview.text
    for query in ("", "?site=plant-a", "?status=bad"):
        page = olga.get(f"/ui/{query}")
        _ok(page.status, page.text, f"overview {query}")
    for n in range(len(HOSTILE)):
        for span in ("1h", "24h", "7d"):
            page = olga.get(f"/ui/devices/{_device(n)}?span={span}")
            _ok(page.status, page.text, f"device {_device(n)} {span}")
    featured = olga.get(f"/ui/devices/{FEATURED}?span=7d")
    _ok(featured.status, featured.text, "featured device")
    assert "invalid time (1e+300)" in featured.text
    listing = olga.get("/ui/decisions")
    _ok(listing.status, listing.text, "decisions")
    for query in ("?range=30d", "?range=7d", f"?device={_device(0)}", "?outcome=reject"):
        page = olga.get(f"/ui/decisions{query}")
        _ok(page.status, page.text, f"decisions {query}")
    for decision in decision_ids:
        page = olga.get(f"/ui/decisions/{decision}")
        _ok(page.status, page.text, f"decision {decision}")
    for path in ("/ui/rollouts", "/ui/rollouts/new", "/ui/bundles"):
        page = olga.get(path)
        _ok(page.status, page.text, path)

    export = olga.get("/api/v1/decisions/export.csv")
    _ok(export.status, export.text, "export")
    rows = list(csv.reader(io.StringIO(export.text)))
    ids = {row[0] for row in rows[1:]}
    missing = [d for d in decision_ids if d not in ids]
    assert not missing, f"the export lacks {len(missing)} hostile rows"
    assert any("invalid time (1e+300)" in cell for row in rows for cell in row)


@pytest.mark.parametrize("as_json", [False, True])
def test_fleetctl_devices_list_shows_devices_with_absurd_last_seen(
    start: Callable[[str], Console], tmp_path: Path, as_json: bool
) -> None:
    c = start(sqlite_url(tmp_path / "fleet.db"))
    seed_hostile(c.engine, time.time())
    environ = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    environ |= {"EDGEFLEET_SERVER": c.url, "EDGEFLEET_API_TOKEN": OPERATOR_TOKEN}
    for args in (["devices", "list"], ["devices", "show", _device(0)]):
        argv = [*args, "--json"] if as_json else args
        done = subprocess.run(
            [sys.executable, "-c", FLEETCTL, *argv], capture_output=True, text=True,
            env=environ, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        if not as_json and args[1] == "list":
            assert re.search(r"clock-0 .*invalid time \(1e\+300\)", done.stdout), done.stdout
            assert f"{len(HOSTILE)} device(s)" in done.stdout
