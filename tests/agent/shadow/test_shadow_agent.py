"""The shadow in a running agent: the candidate in an installed bundle's shadow slot is
loaded beside the live model, a reload notices it appear, change and go, a candidate
that does not load is a problem while the live pipeline keeps deciding, and the health
report carries the comparison."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from agent.app import Agent
from agent.config import parse_config
from agent.installer.shadow import shadow_dir
from agent.wire.quality import ShadowSummary
from agent.wire.reports import Health
from tests.agent.shadow.shadow_helpers import bright_bundle


def wait(cond: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def config(tmp_path: Path, live: Path, **shadow: object) -> object:
    return parse_config(
        {
            "agent": {"device_id": "dev1", "state_dir": str(tmp_path / "state")},
            "runtime": {"workers": 1, "pin": False},
            "cameras": [{"name": "c1", "kind": "synthetic", "fps": 40}],
            "pipelines": [
                {"name": "p", "source": "c1", "installed": "bright", "bundle": str(live)}
            ],
            "shadow": {"sample": 1.0, "max_fps": 100.0, **shadow},
        }
    )


def corrupt_model(bundle_dir: Path) -> None:
    """Replace the model with bytes no backend loads, keeping the manifest's hash right
    (so the bundle loads and the pool is what refuses it)."""
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    entry = manifest["models"]["onnx"]
    junk = b"not a model" * 100
    (bundle_dir / entry["file"]).write_bytes(junk)
    entry["sha256"] = hashlib.sha256(junk).hexdigest()
    entry["size"] = len(junk)
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest))


def test_a_candidate_in_the_shadow_slot_runs_beside_the_live_model_and_reloads_follow_it(
    tmp_path: Path,
) -> None:
    live = bright_bundle(tmp_path / "b" / "live", 0.5, version="1.0.0")
    decisions: list[tuple[str, str]] = []
    agent = Agent(
        config(tmp_path, live.path),  # type: ignore[arg-type]
        http=False,
        on_decision=lambda d, _id: decisions.append((d.record.model_version, d.record.outcome)),
    )
    agent.start()
    try:
        assert wait(lambda: len(decisions) >= 3)
        assert agent.pipelines.shadows == {}
        assert agent.hotpath.fleet_health()["shadow"] is None
        assert not agent.hotpath.reload_if_changed()

        slot = shadow_dir(agent.state_dir, "bright")
        bright_bundle(slot, 0.3, version="2.0.0")
        assert agent.hotpath.reload_if_changed()
        assert set(agent.pipelines.shadows) == {"p"}
        assert "p#shadow" in {m.name for m in agent.pool.models}  # type: ignore[union-attr]
        assert not agent.hotpath.reload_if_changed()
        shadow = agent.pipelines.shadows["p"]
        assert wait(lambda: shadow.counts.compared >= 5)

        health = agent.hotpath.fleet_health()
        summary = ShadowSummary.model_validate(health["shadow"])
        assert (summary.bundle, summary.version) == ("bright", "2.0.0")
        assert summary.n >= 5
        assert summary.agreement is not None
        report = Health.model_validate({**health, "device_id": "dev1", "seq": 0, "ts": time.time()})
        assert report.shadow is not None
        assert report.shadow.n >= 5
        assert "edgefleet_shadow_frames_total" in _metrics_after_update(agent)

        # a new candidate in the same slot: a reload, and the new one's totals from zero
        shutil.rmtree(slot)
        bright_bundle(slot, 0.4, version="3.0.0")
        assert agent.hotpath.reload_if_changed()
        assert wait(lambda: "p" in agent.pipelines.shadows)
        new = agent.pipelines.shadows["p"]
        assert new.key.version == "3.0.0"
        assert wait(lambda: new.counts.compared >= 1)
        assert agent.pipelines.shadow_summary().version == "3.0.0"  # type: ignore[union-attr]

        # the slot emptied (a switch or a revert): no shadow after the reload
        shutil.rmtree(slot)
        assert agent.hotpath.reload_if_changed()
        assert agent.pipelines.shadows == {}
        assert agent.hotpath.fleet_health()["shadow"] is None
        n = len(decisions)
        assert wait(lambda: len(decisions) > n + 3)
    finally:
        agent.stop()
    assert {v for v, _ in decisions} == {"1.0.0"}  # the candidates never decided
    db = agent.log.path
    conn = sqlite3.connect(db)
    try:
        versions = {r[0] for r in conn.execute("SELECT shadow_version FROM shadow_results")}
        live_versions = {r[0] for r in conn.execute("SELECT model_version FROM decisions")}
    finally:
        conn.close()
    assert versions == {"2.0.0", "3.0.0"}
    assert live_versions == {"1.0.0"}


def _metrics_after_update(agent: Agent) -> str:
    agent.hotpath.update_gauges()
    return agent.metrics.render().decode()


def test_a_candidate_that_does_not_load_is_a_problem_and_the_live_pipeline_keeps_deciding(
    tmp_path: Path,
) -> None:
    live = bright_bundle(tmp_path / "b" / "live", 0.5, version="1.0.0")
    slot = shadow_dir(tmp_path / "state", "bright")
    bright_bundle(slot, 0.3, version="2.0.0")
    corrupt_model(slot)
    decisions: list[str] = []
    agent = Agent(
        config(tmp_path, live.path),  # type: ignore[arg-type]
        http=False,
        on_decision=lambda d, _id: decisions.append(d.record.model_version),
    )
    agent.start()
    try:
        assert wait(lambda: len(decisions) >= 5)
        problems = {p.part: p.reason for p in agent.problems}
        assert set(problems) == {"shadow p"}
        assert "cannot load model" in problems["shadow p"]
        assert agent.pipelines.shadows == {}
        assert [r.name for r in agent.runners] == ["p"]
        ok, _ = agent.hotpath.ready()
        assert ok
        # the same broken candidate is not reloaded over and over
        assert not agent.hotpath.reload_if_changed()
    finally:
        agent.stop()
    assert set(decisions) == {"1.0.0"}


def test_a_candidate_whose_manifest_does_not_load_is_a_problem_naming_it(tmp_path: Path) -> None:
    live = bright_bundle(tmp_path / "b" / "live", 0.5, version="1.0.0")
    bad = tmp_path / "elsewhere"
    bright_bundle(bad, 0.3, version="2.0.0")
    (bad / "manifest.json").write_text("{not json")
    agent = Agent(config(tmp_path, live.path), http=False)  # type: ignore[arg-type]
    # not the installer's slot (its recovery empties a slot like this at start)
    agent.pipelines.shadow_resolve = lambda _p: bad
    agent.start()
    try:
        assert wait(lambda: agent.sink.first_decision_at is not None)
        problems = {p.part: p.reason for p in agent.problems}
        assert set(problems) == {"shadow p"}
        assert "manifest.json" in problems["shadow p"]
        assert agent.pipelines.shadows == {}
    finally:
        agent.stop()


def test_shadow_disabled_ignores_the_slot(tmp_path: Path) -> None:
    live = bright_bundle(tmp_path / "b" / "live", 0.5, version="1.0.0")
    bright_bundle(shadow_dir(tmp_path / "state", "bright"), 0.3, version="2.0.0")
    agent = Agent(config(tmp_path, live.path, enabled=False), http=False)  # type: ignore[arg-type]
    agent.start()
    try:
        assert wait(lambda: agent.sink.first_decision_at is not None)
        assert agent.pipelines.shadows == {}
        assert "p#shadow" not in {m.name for m in agent.pool.models}  # type: ignore[union-attr]
        assert not agent.hotpath.reload_if_changed()
    finally:
        agent.stop()
