"""The cluster fleet bench at a small size: 60 light agents on two broker shards, two
``fleet-server serve`` replicas on PostgreSQL, and the leader SIGKILLed mid-rollout.
Every acknowledged heartbeat is stored once, the rollout completes under the next
leader, and no device is told two different things."""

from __future__ import annotations

from pathlib import Path

import pytest

from hil.bench.cluster import bench_cluster
from tests.support.pg import PgCluster

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # pg_cluster
pytestmark = pytest.mark.timeout(240)

DEVICES = 60


def test_cluster_bench_survives_a_leader_kill_with_no_loss_and_one_directive_per_device(
    pg_cluster: PgCluster, tmp_path: Path
) -> None:
    url = pg_cluster.create_database("cluster_bench")
    try:
        result = bench_cluster(
            DEVICES,
            replicas=2,
            shards=2,
            db_url=url,
            interval_s=1.0,
            kill_at=0.3,
            restart_after_s=2.0,
            cache=tmp_path / "cache",
            work_dir=tmp_path,
        )
    finally:
        pg_cluster.drop_database(url)
    assert result["shard_devices"].keys() == {"main", "shard1"}, result
    assert result["heartbeats_sent"] >= DEVICES, result
    assert result["lost"] == 0, result
    assert result["duplicated"] == 0, result
    assert result["rollout_phase"] == "completed", result
    assert result["rollout_counts"] == {"done": DEVICES}, result
    assert result["rollout_completed_s"] is not None
    assert result["leader_killed"] is not None, result
    assert result["leader_after"] not in (None, result["leader_killed"]), result
    assert result["failover_s"] is not None, result
    assert result["two_directives"] == 0, result
    assert result["installs_reported"] >= DEVICES, result
    assert result["agent_failures"] == [], result
    assert result["dead_processes"] == [], result
