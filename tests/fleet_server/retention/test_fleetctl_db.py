"""``fleetctl db stats`` and ``fleetctl db prune`` as an operator runs them: the real
command in a subprocess, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from sqlalchemy.engine import Engine

from tests.fleet_server.retention.retention_data import DAY, heartbeats, keys

pytest_plugins = ["tests.fleet_server.db_fixtures"]

TIMEOUT_S = 60


def fleetctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet_server.cli.fleetctl", *args],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip


def _by_table(out: str) -> dict[str, Any]:
    return {row["table"]: row for row in json.loads(out)}


def test_db_stats_shows_rows_times_size_budget_and_rows_past_it(db: Engine, db_url: str) -> None:
    now = time.time()
    heartbeats(db, [(1_800_000_000.0 - now) / DAY + a for a in (1, 2, 10, 20)])  # ages 1..20 d
    done = fleetctl("db", "stats", "--json", "--db-url", db_url)
    assert done.returncode == 0, done.stderr
    rows = _by_table(done.stdout)
    hb = rows["heartbeats"]
    assert hb["rows"] == 4
    assert hb["budget"] == "7d"
    assert hb["past_budget"] == 2
    assert hb["time_column"] == "ts"
    assert abs(hb["newest"] - (now - DAY)) < 60
    assert abs(hb["oldest"] - (now - 20 * DAY)) < 60
    assert hb["size_bytes"] > 0
    assert rows["devices"]["past_budget"] is None
    text = fleetctl("db", "stats", "--db-url", db_url)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["TABLE", "ROWS", "SIZE", "OLDEST", "NEWEST", "BUDGET", "PAST",
                                "BUDGET"]  # fmt: skip
    hb_line = next(line for line in lines if line.startswith("heartbeats "))
    assert hb_line.split()[1] == "4"
    assert hb_line.split()[-1] == "2"


def test_db_prune_dry_run_counts_and_prune_deletes(db: Engine, db_url: str) -> None:
    now = time.time()
    heartbeats(db, [(1_800_000_000.0 - now) / DAY + a for a in (1, 10, 20)])
    dry = fleetctl("db", "prune", "--dry-run", "--json", "--db-url", db_url)
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert {r["table"]: r["past_budget"] for r in report["tables"]}["heartbeats"] == 2
    assert len(keys(db, "heartbeats")) == 3
    done = fleetctl("db", "prune", "--db-url", db_url)
    assert done.returncode == 0, done.stderr
    assert "2 row(s) deleted" in done.stdout
    assert len(keys(db, "heartbeats")) == 1
