"""The hot path runs an install's trial for the installer in the companion: a staged
bundle under the state directory is loaded, warmed up and benchmarked in a pool of its
own; anything outside the state directory or out of range is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import parse_config
from agent.control.link import HotPathLink, local_call
from agent.control.protocol import ControlError
from agent.hotpath import HotPath
from agent.installer.errors import InstallError
from tests.agent.installer.installer_helpers import make_bundle


def _hotpath(state: Path) -> HotPath:
    config = parse_config(
        {
            "agent": {"device_id": "dev-1", "state_dir": str(state), "profile": "x86-gateway"},
            "runtime": {"workers": 1, "pin": False},
        }
    )
    return HotPath(config)


def test_a_trial_of_a_staged_bundle_gives_its_figures_over_the_link(tmp_path: Path) -> None:
    state = tmp_path / "state"
    staged_root = state / "bundles" / "cls"
    staged_root.mkdir(parents=True)
    bundle = make_bundle(staged_root, budget_ms=1000.0)
    hot = _hotpath(state)
    link = HotPathLink(local_call(hot.handle), device_id="dev-1", state_dir=state)
    bench = link.trial(bundle, 3, 10.0)
    assert bench.runs == 3
    assert 0 < bench.p50_ms <= bench.p95_ms <= bench.max_ms
    assert bench.budget_ms == 1000.0


def test_a_trial_over_its_budget_is_the_installers_benchmark_failure(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "bundles").mkdir(parents=True)
    bundle = make_bundle(state / "bundles", budget_ms=0.000001)
    link = HotPathLink(local_call(_hotpath(state).handle), device_id="dev-1", state_dir=state)
    with pytest.raises(InstallError) as caught:
        link.trial(bundle, 3, 10.0)
    assert caught.value.step == "benchmark"
    assert "over the bundle's latency budget" in caught.value.reason


def test_a_trial_outside_the_state_directory_or_out_of_range_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    outside = make_bundle(tmp_path)
    hot = _hotpath(state)
    with pytest.raises(ControlError, match="is not under the state directory"):
        hot.handle("trial", {"bundle": str(outside.path), "runs": 3, "timeout_ms": 1000})
    with pytest.raises(ControlError, match="is not under the state directory"):
        hot.handle("trial", {"bundle": str(state / ".." / "x"), "runs": 3, "timeout_ms": 1000})
    with pytest.raises(ControlError, match=r"runs must be 1\.\.1000"):
        hot.handle("trial", {"bundle": str(state), "runs": 0, "timeout_ms": 1000})
    link = HotPathLink(local_call(hot.handle), device_id="dev-1", state_dir=state)
    with pytest.raises(InstallError, match="did not run the trial") as caught:
        link.trial(outside, 3, 1.0)
    assert caught.value.step == "load"
