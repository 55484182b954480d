"""The fleet scale bench at a small size: every heartbeat the broker acknowledged is
stored once, and the rollout reaches every light agent."""

from __future__ import annotations

from pathlib import Path

from hil.bench.fleet import bench_fleet


def test_bench_fleet_stores_every_heartbeat_once_and_completes_the_rollout(
    tmp_path: Path,
) -> None:
    result = bench_fleet(20, 4, processes=1, work_dir=tmp_path)
    assert result["heartbeats_sent"] == 20 * 4
    assert result["lost"] == 0
    assert result["duplicated"] == 0
    assert result["heartbeats_stored"] == result["heartbeats_sent"]
    assert result["rollout_phase"] == "completed", result
    assert result["rollout_counts"] == {"done": 20}
    assert result["installs_reported"] == 20
    assert result["agent_failures"] == []
