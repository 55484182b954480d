"""``GET /api/v1/cluster`` and ``fleet-server status``: two fleet servers on one real
PostgreSQL report themselves; both list the two replicas, the one that leads, the epoch
and each one's ingest rate (from its ingest workers' health probes)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_server.config import ClusterSection
from fleet_server.health import PartHealth
from fleet_server.serve import FleetServer
from tests.fleet_server.cluster.cluster_support import wait_for
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    RunningApi,
    api_config,
    http,
    make_repository,
)
from tests.support.pg import PgCluster

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # pg_cluster

REPO_ROOT = Path(__file__).resolve().parents[3]
CLUSTER = {"lease_s": 1.0, "renew_s": 0.2, "poll_s": 0.2, "report_s": 0.3}


class Ingest:
    """An ingest worker's probe whose stored count grows 100 a second."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> PartHealth:
        return PartHealth(True, {"stored": int(100 * (time.monotonic() - self.t0))})


@pytest.fixture
def replicas(
    tmp_path: Path, pg_cluster: PgCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[list[RunningApi], Path]]:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    repo, keys = make_repository(tmp_path / "fleet")
    url = pg_cluster.create_database()
    state = tmp_path / "state"
    servers: list[FleetServer] = []
    try:
        for name in ("api-a", "api-b"):
            cfg = api_config(state, repo, keys, db_url=url)
            cfg = cfg.model_copy(update={"cluster": ClusterSection(replica_id=name, **CLUSTER)})
            server = FleetServer(cfg)
            server.start()
            servers.append(server)
        config_file = tmp_path / "fleet.toml"
        config_file.write_text(
            f'[server]\nstate_dir = "{state}"\n[database]\nurl = "{url}"\n'
            f"[cluster]\nreport_s = {CLUSTER['report_s']}\n"
        )
        yield [RunningApi(s) for s in servers], config_file
    finally:
        for server in servers:
            server.stop()
        pg_cluster.drop_database(url)


def test_the_api_and_fleet_server_status_list_the_replicas_the_leader_and_ingest_rates(
    replicas: tuple[list[RunningApi], Path],
) -> None:
    apis, config_file = replicas
    apis[0].ctx.health.register("ingest-0", Ingest())

    seen: dict[str, Any] = {}

    def listed() -> bool:
        answer = apis[1].call("GET", "/api/v1/cluster")
        body = answer.body
        alive = [r for r in body["replicas"] if r["alive"]]
        busy = [r for r in alive if r["ingest_rate_per_s"] > 0]
        seen.update(status=answer.status, body=body)
        return len(alive) == 2 and body["leader"] is not None and len(busy) == 1

    # the answer that showed them is the one checked: on a loaded machine the leader's
    # lease can lapse for a moment between two calls (the next answer has no leader)
    wait_for("both replicas, a leader and a rate", listed)
    assert seen["status"] == 200
    body = seen["body"]
    assert [r["replica_id"] for r in body["replicas"]] == ["api-a", "api-b"]
    (leader,) = [r for r in body["replicas"] if r["leader"]]
    assert body["leader"] == leader["replica_id"]
    assert body["epoch"] == leader["epoch"] >= 1
    rates = {r["replica_id"]: r["ingest_rate_per_s"] for r in body["replicas"]}
    assert rates["api-a"] > 0
    assert rates["api-b"] == 0
    assert http("GET", apis[0].url + "/api/v1/cluster").status == 401  # operators only

    done = subprocess.run(
        [sys.executable, "-m", "fleet_server.cli.server", "status", "--config", config_file,
         "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["leader"] in ("api-a", "api-b")  # a live one (see the table below)
    assert sorted(r["replica_id"] for r in status["replicas"] if r["alive"]) == ["api-a", "api-b"]
    table = subprocess.run(
        [sys.executable, "-m", "fleet_server.cli.server", "status", "--config", config_file],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    # the leader the table names is a live replica (the lease may have moved between the
    # calls: a loaded machine's database can drop an idle leader's connection)
    assert re.search(r"^leader: api-[ab] \(epoch \d+\)$", table.stdout, re.M), table.stdout
    assert "api-a" in table.stdout
    assert "api-b" in table.stdout

    # the leader stops: the other one takes over, and the stopped one leaves the list
    first = next(a for a in apis if a.ctx.leader.replica_id == body["leader"])
    other = next(a for a in apis if a is not first)
    first.server.stop()

    def moved() -> bool:
        now = other.call("GET", "/api/v1/cluster").body
        return now["leader"] == other.ctx.leader.replica_id and len(now["replicas"]) == 1

    wait_for("the other replica to lead, alone", moved)
    assert other.call("GET", "/api/v1/cluster").body["epoch"] > body["epoch"]
