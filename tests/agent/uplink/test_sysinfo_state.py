"""The health report's disk budget figures (what the fleet's disk_over_budget alert
reads) and each station's counts (what its station alerts watch rise)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.status import station_counts
from agent.uplink.sysinfo import SysInfo, tree_mb
from agent.wire.reports import Health

MIB = 1024 * 1024


def test_the_state_directory_size_counts_its_files_and_follows_no_link(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "thumbnails" / "2026-11-28").mkdir(parents=True)
    (state / "log.db").write_bytes(b"x" * MIB)
    (state / "thumbnails" / "2026-11-28" / "a.jpg").write_bytes(b"y" * (MIB // 2))
    outside = tmp_path / "big"
    outside.write_bytes(b"z" * 4 * MIB)
    os.symlink(outside, state / "link")  # a link is not the state's
    assert tree_mb(state) == pytest.approx(1.5)
    assert tree_mb(state, max_entries=2) is None  # too many entries: no figure, not a guess
    assert tree_mb(tmp_path / "missing") is None


def test_health_says_the_budget_and_the_state_size_measured_at_most_every_interval(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").write_bytes(b"x" * MIB)
    info = SysInfo(tmp_path, thermal_root=tmp_path / "none", budget_mb=512.0, state_every_s=3600)
    first = info.sample()
    assert first["disk_budget_mb"] == 512.0
    assert first["state_dir_mb"] == pytest.approx(1.0)
    (tmp_path / "b").write_bytes(b"x" * MIB)
    assert info.sample()["state_dir_mb"] == pytest.approx(1.0)  # not measured again yet
    info.state_every_s = 0.0
    assert info.sample()["state_dir_mb"] == pytest.approx(2.0)
    unset = SysInfo(tmp_path, thermal_root=tmp_path / "none").sample()
    assert "disk_budget_mb" not in unset


def test_station_counts_take_the_three_counts_of_each_station() -> None:
    line = {
        "plc": {"plc1": {"connected": True}},
        "stations": {
            "gate": {"state": "ready", "triggers": 40, "deadline_missed": 2, "overruns": 1,
                     "answered": 40, "write_failures": {}},
            "odd": "not a mapping",
        },
    }  # fmt: skip
    counts = station_counts(line)
    assert counts == {"gate": {"triggers": 40, "deadline_missed": 2, "overruns": 1}}
    health = Health(device_id="cam-1", seq=0, ts=1.0, stations=counts, state_dir_mb=3.5)
    assert health.model_dump(mode="json")["stations"]["gate"]["overruns"] == 1
    with pytest.raises(ValidationError):
        Health(device_id="cam-1", seq=0, ts=1.0, stations={"gate": {"overruns": -1}})
