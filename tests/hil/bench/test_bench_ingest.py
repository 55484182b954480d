"""The ingest benches at small sizes: storage inserts (each row once, then all of them
again as duplicates), and ingest workers against a simulated fleet into memory and into
the fleet database (nothing lost or doubled); the rates are the benches' to report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sqlalchemy.engine import Engine

from fleet_server.db import store
from hil.bench.ingest import bench_ingest, bench_inserts
from hil.bench.ingest_sql import bench_sql_ingest
from tests.support.broker import Broker

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # the db, db_url and pg_cluster fixtures


def test_bench_inserts_stores_every_row_once_and_reports_a_rate(db: Engine) -> None:
    result = bench_inserts(db, 600, batch_size=200, devices=30)
    assert (result.rows, result.inserted, result.backend) == (600, 600, db.dialect.name)
    assert result.rows_per_s > 0
    assert result.redelivered_per_s > 0
    assert store.count_records(db, "heartbeats") == 600


def test_bench_reports_ingest_throughput_per_worker(own_mosquitto: Broker) -> None:
    result = bench_ingest(own_mosquitto.host, own_mosquitto.port, workers=1, devices=500, rounds=4)
    print(
        f"\ningest: {result.msgs_per_s_per_worker:.0f} msgs/s per worker "
        f"({result.stored} records, {result.elapsed_s:.2f} s)"
    )
    assert (result.sent, result.stored, result.lost, result.duplicates) == (2000, 2000, 0, 0)
    assert result.per_worker == (2000,)


def test_bench_reports_sql_ingest_throughput_per_worker(db: Engine, own_mosquitto: Broker) -> None:
    mosquitto = own_mosquitto  # no retained messages from other tests
    result = bench_sql_ingest(mosquitto.host, mosquitto.port, db, devices=200, rounds=10)
    print(
        f"\nSQL ingest ({result.backend}): {result.msgs_per_s_per_worker:.0f} msgs/s per worker "
        f"({result.stored} records, {result.elapsed_s:.2f} s)"
    )
    assert (result.sent, result.stored, result.in_database) == (2000, 2000, 2000)
    assert (result.lost, result.duplicates) == (0, 0)
    assert result.per_worker == (2000,)
    assert result.msgs_per_s_per_worker > 0


def test_hil_bench_ingest_writes_the_figures_of_the_inserts(tmp_path: Path) -> None:
    out = tmp_path / "inserts.json"
    done = subprocess.run(
        [sys.executable, "-m", "hil.cli", "bench", "ingest", "--rows", "600",
         "--batch-size", "200", "--devices", "30", "--json", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert (figures["bench"], figures["rows"], figures["inserted"]) == ("inserts", 600, 600)
    assert figures["backend"] == "sqlite"
    assert "rows_per_s" in done.stdout
