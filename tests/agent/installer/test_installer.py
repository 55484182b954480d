"""The installer on real files and a real worker pool: install, commit, no-op, refusals,
self-benchmark, health window with automatic rollback, rollback by hand, damaged state,
and the CLI functions."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.installer import Installer, InstallerConfig, InstallError
from agent.installer import cli as installer_cli
from agent.installer.store import JOURNAL_FILE, POINTER_FILE, NameLock
from agent.kernel.bundle import Bundle, load_bundle
from runtime import PoolConfig, WorkerPool
from runtime.errors import EdgeRuntimeError
from tests.agent.installer.installer_helpers import (
    PROFILE,
    make_bright_fails_bundle,
    make_bundle,
    slot_files,
    temp_files,
)

CONFIG = InstallerConfig(benchmark_runs=10, health_window_s=0.2, health_poll_s=0.1)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Bundle]:
    root = tmp_path_factory.mktemp("bundles")
    return {
        "v1": make_bundle(root, version="1.0.0", release=1),
        "v2": make_bundle(root, version="2.0.0", release=2),
        "v2-other": make_bundle(root, version="2.0.1", release=2, pad=10),
        "v3": make_bundle(root, version="3.0.0", release=3),
        "slow": make_bundle(root, version="2.5.0", release=2, budget_ms=0.001),
        "bright-fails": make_bright_fails_bundle(root, release=2),
        "jetson": make_bundle(root, version="2.0.0", release=2, pad=3, profiles=["jetson-orin"]),
    }


@pytest.fixture(scope="module")
def v1_state(tmp_path_factory: pytest.TempPathFactory, bundles: dict[str, Bundle]) -> Path:
    """A state directory with v1 committed in slot-a (copied by each test that uses it)."""
    state = tmp_path_factory.mktemp("v1-state")
    Installer(state, profile_name=PROFILE, config=CONFIG).install(bundles["v1"].path, source="test")
    return state


class Recorder:
    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def __call__(self, report: dict[str, Any]) -> None:
        self.reports.append(report)


@pytest.fixture
def state(tmp_path: Path, v1_state: Path) -> Path:
    dst = tmp_path / "state"
    shutil.copytree(v1_state, dst)
    return dst


def installer(state: Path, rec: Recorder | None = None) -> Installer:
    return Installer(state, profile_name=PROFILE, on_report=rec, config=CONFIG)


def active_digest(inst: Installer) -> str | None:
    path = inst.active_bundle("cls")
    return load_bundle(path).digest if path is not None else None


def journal(state: Path) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((state / "bundles" / "cls" / JOURNAL_FILE).read_text())
    return raw


def test_first_install_commits_into_slot_a(tmp_path: Path, bundles: dict[str, Bundle]) -> None:
    rec = Recorder()
    inst = installer(tmp_path, rec)
    assert inst.active_bundle("cls") is None
    result = inst.install(bundles["v1"].path, source="usb")
    assert (result.outcome, result.slot) == ("committed", "a")
    assert result.benchmark is not None
    assert result.benchmark.runs == 10
    assert inst.active_bundle("cls") == tmp_path / "bundles" / "cls" / "slot-a"
    assert active_digest(inst) == bundles["v1"].digest
    assert [r["status"] for r in rec.reports] == ["committed"]
    assert rec.reports[0]["source"] == "usb"
    assert rec.reports[0]["health"]["inferences"] > 0  # the default probe ran the model
    assert journal(tmp_path)["status"] == "committed"


def test_next_release_goes_to_the_other_slot(state: Path, bundles: dict[str, Bundle]) -> None:
    inst = installer(state)
    result = inst.install(bundles["v2"].path, source="test")
    assert (result.outcome, result.slot) == ("committed", "b")
    assert active_digest(inst) == bundles["v2"].digest
    states = {s.slot: (s.state, s.active) for s in inst.status()}
    assert states == {"a": ("previous", False), "b": ("committed", True)}


def test_installing_the_committed_version_again_is_a_noop(
    state: Path, bundles: dict[str, Bundle]
) -> None:
    rec = Recorder()
    result = installer(state, rec).install(bundles["v1"].path, source="test")
    assert (result.outcome, result.slot) == ("noop", "a")
    assert [r["status"] for r in rec.reports] == ["noop"]
    assert slot_files(state, "cls", "b") == []


def test_lower_release_is_refused_and_current_kept(state: Path, bundles: dict[str, Bundle]) -> None:
    inst = installer(state)
    inst.install(bundles["v2"].path, source="test")
    rec = Recorder()
    inst.on_report = rec
    with pytest.raises(InstallError) as err:
        inst.install(bundles["v1"].path, source="test")
    assert err.value.step == "plan"
    assert "rollback protection" in err.value.reason
    assert active_digest(inst) == bundles["v2"].digest
    assert rec.reports[-1]["status"] == "refused"
    assert journal(state)["status"] == "refused"


def test_same_release_with_other_content_is_refused(
    state: Path, bundles: dict[str, Bundle]
) -> None:
    inst = installer(state)
    inst.install(bundles["v2"].path, source="test")
    with pytest.raises(InstallError, match="other content"):
        inst.install(bundles["v2-other"].path, source="test")
    assert active_digest(inst) == bundles["v2"].digest


def test_bundle_for_another_profile_is_refused(state: Path, bundles: dict[str, Bundle]) -> None:
    with pytest.raises(InstallError, match="jetson-orin") as err:
        installer(state).install(bundles["jetson"].path, source="test")
    assert err.value.step == "plan"


def test_benchmark_over_the_latency_budget_is_refused_and_reported(
    state: Path, bundles: dict[str, Bundle]
) -> None:
    rec = Recorder()
    inst = installer(state, rec)
    with pytest.raises(InstallError) as err:
        inst.install(bundles["slow"].path, source="test")
    assert err.value.step == "benchmark"
    assert "latency budget of 0.001 ms" in err.value.reason
    assert active_digest(inst) == bundles["v1"].digest
    assert slot_files(state, "cls", "b") == []
    assert (rec.reports[-1]["status"], rec.reports[-1]["step"]) == ("failed", "benchmark")
    assert journal(state)["step"] == "benchmark"


def test_model_that_does_not_load_fails_at_load(
    state: Path, tmp_path: Path, bundles: dict[str, Bundle]
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(bundles["v2"].path, broken)
    model = broken / "cls.onnx"
    model.write_bytes(b"this is not an onnx model" * 10)
    manifest = json.loads((broken / "manifest.json").read_text())
    digest = __import__("hashlib").sha256(model.read_bytes()).hexdigest()
    manifest["models"]["onnx"].update(sha256=digest, size=model.stat().st_size)
    (broken / "manifest.json").write_text(json.dumps(manifest))
    inst = installer(state)
    with pytest.raises(InstallError) as err:
        inst.install(broken, source="test")
    assert err.value.step == "load"
    assert active_digest(inst) == bundles["v1"].digest


def test_inference_errors_in_the_health_window_roll_back_automatically(
    state: Path, bundles: dict[str, Bundle]
) -> None:
    """The new model runs the benchmark's dark frame but fails on the bright frames the
    probe feeds it, in a real pool loaded from the slot the agent is told to run."""
    rec = Recorder()
    inst = installer(state, rec)
    seen: list[Path | None] = []
    counters = {"worker_crashes": 0, "inference_errors": 0, "p95_ms": 0.0}

    def probe() -> dict[str, float]:
        path = inst.active_bundle("cls")
        seen.append(path)
        assert path is not None
        cfg = load_bundle(path).model_config("probe")
        with WorkerPool([cfg], PoolConfig(workers=1, pin=False)) as pool:
            try:
                pool.infer("probe", frame=np.full((8, 8, 3), 255, np.uint8), timeout_s=10)
            except EdgeRuntimeError:
                counters["inference_errors"] += 1
        return dict(counters)

    with pytest.raises(InstallError) as err:
        inst.install(bundles["bright-fails"].path, source="test", health_probe=probe)
    assert err.value.step == "health"
    assert "inference error" in err.value.reason
    assert seen[0] == state / "bundles" / "cls" / "slot-b"  # the trial ran during the window
    assert inst.active_bundle("cls") == state / "bundles" / "cls" / "slot-a"
    assert active_digest(inst) == bundles["v1"].digest
    assert slot_files(state, "cls", "b") == []
    last = rec.reports[-1]
    assert (last["status"], last["step"], last["rolled_back"]) == ("failed", "health", True)
    assert last["active"]["digest"] == bundles["v1"].digest
    assert (journal(state)["status"], journal(state)["step"]) == ("failed", "health")


def test_worker_crash_in_the_health_window_rolls_back(
    state: Path, bundles: dict[str, Bundle]
) -> None:
    """The probe runs the trial slot in a pool of its own; after the baseline one of its
    workers is killed, and the pool's restart counter is what the probe reports."""
    inst = installer(state)
    pools: list[WorkerPool] = []

    def probe() -> dict[str, float]:
        if not pools:
            path = inst.active_bundle("cls")
            assert path is not None
            cfg = load_bundle(path).model_config("probe")
            pools.append(WorkerPool([cfg], PoolConfig(workers=1, pin=False)).start())
        else:
            pool = pools[0]
            pid = pool.worker_pids()[0]
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while pool.restarts() == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
        return {"worker_crashes": pools[0].restarts(), "inference_errors": 0, "p95_ms": 0.0}

    try:
        with pytest.raises(InstallError, match="1 worker crash") as err:
            inst.install(bundles["v2"].path, source="test", health_probe=probe)
    finally:
        for pool in pools:
            pool.close()
    assert err.value.step == "health"
    assert active_digest(inst) == bundles["v1"].digest


def test_rollback_by_hand_returns_to_the_previous_slot(
    state: Path, bundles: dict[str, Bundle]
) -> None:
    rec = Recorder()
    inst = installer(state, rec)
    inst.install(bundles["v2"].path, source="test")
    result = inst.rollback()
    assert (result.outcome, result.slot) == ("rolled-back", "a")
    assert active_digest(inst) == bundles["v1"].digest
    assert rec.reports[-1]["status"] == "rolled-back"
    # rollback protection follows the committed release: v2 installs again, into b
    again = inst.install(bundles["v2"].path, source="test")
    assert (again.outcome, again.slot) == ("committed", "b")


def test_rollback_by_hand_without_a_previous_slot_is_refused(state: Path) -> None:
    inst = installer(state)
    with pytest.raises(InstallError, match="no previously committed bundle") as err:
        inst.rollback("cls")
    assert err.value.step == "rollback"
    assert inst.active_bundle("cls") == state / "bundles" / "cls" / "slot-a"


def test_failed_install_leaves_no_rollback_target(state: Path, bundles: dict[str, Bundle]) -> None:
    inst = installer(state)
    inst.install(bundles["v2"].path, source="test")
    with pytest.raises(InstallError):
        inst.install(bundles["v3"].path, source="test", health_probe=lambda: {"x": 1})
    assert active_digest(inst) == bundles["v2"].digest
    # slot-a held v1 but was re-staged for v3: nothing to go back to any more
    with pytest.raises(InstallError, match="no previously committed"):
        inst.rollback("cls")


@pytest.mark.parametrize(
    "damage",
    [b"\x00\xff garbage \x13", b'{"format": 1, "name": "cls", "status": "comm', b"", None],
    ids=["garbage", "truncated", "empty", "missing"],
)
def test_corrupt_or_missing_install_state_falls_back_to_last_known_good(
    state: Path, bundles: dict[str, Bundle], damage: bytes | None
) -> None:
    inst = installer(state)
    inst.install(bundles["v2"].path, source="test")
    path = state / "bundles" / "cls" / JOURNAL_FILE
    if damage is None:
        path.unlink()
    else:
        path.write_bytes(damage)
    fresh = installer(state)
    assert active_digest(fresh) == bundles["v2"].digest
    fresh.recover()
    assert active_digest(fresh) == bundles["v2"].digest
    assert fresh.recover() == []  # idempotent
    assert {s.slot: s.state for s in fresh.status()} == {"a": "previous", "b": "committed"}


def test_lost_pointer_and_state_fall_back_to_the_last_commit(
    state: Path, bundles: dict[str, Bundle]
) -> None:
    inst = installer(state)
    inst.install(bundles["v2"].path, source="test")
    inst.rollback()  # v1 in a is now the last commit, though b holds a higher release
    (state / "bundles" / "cls" / POINTER_FILE).write_bytes(b"\x00" * 7)
    (state / "bundles" / "cls" / JOURNAL_FILE).unlink()
    fresh = installer(state)
    assert active_digest(fresh) == bundles["v1"].digest
    reports = fresh.recover()
    assert reports[0]["status"] == "recovered"
    assert json.loads((state / "bundles" / "cls" / POINTER_FILE).read_text())["committed"] == "a"


def test_damaged_committed_slot_falls_back_to_the_previous_one(
    state: Path, bundles: dict[str, Bundle]
) -> None:
    inst = installer(state)
    inst.install(bundles["v2"].path, source="test")
    model = state / "bundles" / "cls" / "slot-b" / "cls.onnx"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    assert active_digest(inst) == bundles["v1"].digest
    inst.recover()
    assert inst.active_bundle("cls") == state / "bundles" / "cls" / "slot-a"
    assert temp_files(state) == []


def test_second_install_of_the_same_bundle_waits_then_is_refused(
    state: Path, bundles: dict[str, Bundle]
) -> None:
    lock = NameLock(state / "bundles" / "cls")
    assert lock.acquire(1.0)
    try:
        inst = Installer(
            state, profile_name=PROFILE, config=CONFIG.model_copy(update={"lock_timeout_s": 0.2})
        )
        with pytest.raises(InstallError, match="another install"):
            inst.install(bundles["v2"].path, source="test")
    finally:
        lock.release()


def test_cli_install_bundles_and_rollback(
    tmp_path: Path, bundles: dict[str, Bundle], capsys: pytest.CaptureFixture[str]
) -> None:
    st = tmp_path / "cli"
    kw: dict[str, Any] = {"state_dir": st, "profile": PROFILE, "config": CONFIG}
    assert installer_cli.cmd_install(bundles["v1"].path, **kw) == 0
    assert "committed in slot-a" in capsys.readouterr().out
    assert installer_cli.cmd_install(bundles["v2"].path, as_json=True, **kw) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["outcome"], out["slot"], out["release"]) == ("committed", "b", 2)
    assert installer_cli.cmd_install(bundles["v1"].path, **kw) == 2
    assert "install failed at plan" in capsys.readouterr().err
    assert installer_cli.cmd_bundles(state_dir=st, as_json=True) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["slot"], r["state"], r["release"]) for r in rows] == [
        ("a", "previous", 1),
        ("b", "committed", 2),
    ]
    assert installer_cli.cmd_rollback(None, state_dir=st, profile=PROFILE) == 0
    assert "back on 1.0.0" in capsys.readouterr().out
    assert installer_cli.cmd_bundles(state_dir=st) == 0
    table = capsys.readouterr().out
    assert "*a" in table
    assert "rolled-back" in table


def test_cli_subcommands_read_state_dir_and_profile_from_the_agent_config(
    tmp_path: Path, bundles: dict[str, Bundle], capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[agent]\ndevice_id = "d1"\nstate_dir = "st"\nprofile = "{PROFILE}"\n')
    parser = argparse.ArgumentParser(prog="edge-agent")
    sub = parser.add_subparsers(dest="command", required=True)
    installer_cli.add_parsers(sub, lambda p: p.add_argument("--config", required=True))

    def run(*argv: str) -> int:
        args = parser.parse_args(argv)
        return int(args.func(args))

    window = ("--health-window", "0.1")
    assert run("install", str(bundles["v1"].path), "--config", str(cfg), *window) == 0
    assert run("install", str(bundles["v2"].path), "--config", str(cfg), *window) == 0
    capsys.readouterr()
    assert run("rollback", "cls", "--config", str(cfg), "--json") == 0
    assert json.loads(capsys.readouterr().out)["release"] == 1
    assert run("bundles", "--config", str(cfg), "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["slot"], r["state"], r["active"]) for r in rows] == [
        ("a", "committed", True),
        ("b", "previous", False),
    ]
    assert (tmp_path / "st" / "bundles" / "cls" / "slot-a" / "manifest.json").is_file()
