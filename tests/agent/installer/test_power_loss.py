"""Power loss: the installer runs in a process of its own (install_driver.py) that is
SIGKILLed at every named point of an install, of an automatic rollback and of a rollback
by hand - mid file write included - and at random moments. Then, in this process: what
the agent would load at start, recovery, and a second install that finishes cleanly.

Before the commit pointer is renamed into place the device comes back on the old model;
after it, on the new one.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.installer import CHECKPOINTS, Installer, InstallerConfig
from agent.installer.store import JOURNAL_FILE
from agent.kernel.bundle import Bundle, load_bundle
from tests.agent.installer.installer_helpers import PROFILE, make_bundle, slot_files, temp_files

DRIVER = Path(__file__).with_name("install_driver.py")
CONFIG = InstallerConfig(benchmark_runs=10, health_window_s=0.2, health_poll_s=0.1)
OLD_AFTER = (
    "stage",
    "stage-write",
    "load",
    "benchmark",
    "switch",
    "switch-write",
    "health",
    "commit",
    "commit-write",
)
NEW_AFTER = ("commit-marker", "done")


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return make_bundle(tmp_path_factory.mktemp("v1"), version="1.0.0", release=1)


@pytest.fixture(scope="module")
def v2(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    # several copy chunks, so "stage-write" stops with a half-written model file
    return make_bundle(tmp_path_factory.mktemp("v2"), version="2.0.0", release=2, pad=200_000)


def installer(state: Path) -> Installer:
    return Installer(state, profile_name=PROFILE, config=CONFIG)


@pytest.fixture(scope="module")
def v1_state(tmp_path_factory: pytest.TempPathFactory, v1: Bundle) -> Path:
    state = tmp_path_factory.mktemp("v1-state")
    installer(state).install(v1.path, source="test")
    return state


@pytest.fixture(scope="module")
def v1v2_state(tmp_path_factory: pytest.TempPathFactory, v1: Bundle, v2: Bundle) -> Path:
    state = tmp_path_factory.mktemp("v1v2-state")
    installer(state).install(v1.path, source="test")
    installer(state).install(v2.path, source="test")
    return state


def copy_state(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "state"
    shutil.copytree(src, dst)
    return dst


def driver_cmd(state: Path, *args: str) -> list[str]:
    return [sys.executable, str(DRIVER), str(state), *args]


def driver_env(tmp_path: Path, crash_at: str | None) -> dict[str, str]:
    shm = tmp_path / "shm"  # segments of a killed driver stay here, not in /dev/shm
    shm.mkdir(exist_ok=True)
    env = {**os.environ, "EDGEFLEET_SHM_DIR": str(shm)}
    if crash_at is not None:
        env["EDGEFLEET_TEST_CRASH_AT"] = crash_at
    return env


def run_driver(
    state: Path, tmp_path: Path, *args: str, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        driver_cmd(state, *args),
        env=driver_env(tmp_path, crash_at),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def reached(stdout: str) -> list[str]:
    return [ln.split()[1] for ln in stdout.splitlines() if ln.startswith("checkpoint ")]


def active_digest(inst: Installer) -> str | None:
    path = inst.active_bundle("cls")
    return load_bundle(path).digest if path is not None else None


def assert_recovers_to(state: Path, expected: Bundle) -> Installer:
    inst = installer(state)
    # what the agent loads at start, before anything repairs the files ...
    assert active_digest(inst) == expected.digest
    inst.recover()
    # ... and after recovery, which is idempotent
    assert active_digest(inst) == expected.digest
    assert inst.recover() == []
    assert temp_files(state) == []
    return inst


def test_every_install_point_is_covered() -> None:
    assert set(OLD_AFTER) | set(NEW_AFTER) | {"rollback", "rollback-write"} == set(CHECKPOINTS)


@pytest.mark.parametrize("point", OLD_AFTER + NEW_AFTER)
def test_power_cut_during_install_comes_back_on_the_right_model(
    point: str, tmp_path: Path, v1_state: Path, v1: Bundle, v2: Bundle
) -> None:
    state = copy_state(v1_state, tmp_path)
    proc = run_driver(state, tmp_path, "--bundle", str(v2.path), crash_at=point)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert reached(proc.stdout)[-1] == point
    before_commit = point in OLD_AFTER
    inst = assert_recovers_to(state, v1 if before_commit else v2)
    if before_commit:
        assert slot_files(state, "cls", "b") == []  # partial or trial files removed
        assert '"status": "failed"' in (state / "bundles/cls" / JOURNAL_FILE).read_text()
    result = inst.install(v2.path, source="test")
    assert result.outcome == ("committed" if before_commit else "noop")
    assert active_digest(inst) == v2.digest


@pytest.mark.parametrize("point", ["rollback", "rollback-write"])
def test_power_cut_during_automatic_rollback_comes_back_on_the_old_model(
    point: str, tmp_path: Path, v1_state: Path, v1: Bundle, v2: Bundle
) -> None:
    state = copy_state(v1_state, tmp_path)
    args = ("--bundle", str(v2.path), "--probe", "errors")
    proc = run_driver(state, tmp_path, *args, crash_at=point)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "health" in reached(proc.stdout)
    assert_recovers_to(state, v1)
    assert slot_files(state, "cls", "b") == []


@pytest.mark.parametrize("point", ["rollback", "rollback-write"])
def test_power_cut_during_rollback_by_hand_keeps_the_current_model(
    point: str, tmp_path: Path, v1v2_state: Path, v1: Bundle, v2: Bundle
) -> None:
    state = copy_state(v1v2_state, tmp_path)
    proc = run_driver(state, tmp_path, "--rollback", "cls", crash_at=point)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    inst = assert_recovers_to(state, v2)
    inst.rollback("cls")
    assert active_digest(inst) == v1.digest


def test_corrupt_install_state_after_a_cut_on_trial_comes_back_on_the_old_model(
    tmp_path: Path, v1_state: Path, v1: Bundle, v2: Bundle
) -> None:
    state = copy_state(v1_state, tmp_path)
    proc = run_driver(state, tmp_path, "--bundle", str(v2.path), crash_at="health")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (state / "bundles/cls" / JOURNAL_FILE).write_bytes(b'{"format": 1, "na\x00\xff')
    assert_recovers_to(state, v1)
    assert slot_files(state, "cls", "b") == []


def test_sigkill_at_random_moments_never_leaves_a_broken_install(
    tmp_path: Path, v1_state: Path, v1: Bundle, v2: Bundle
) -> None:
    rng = random.Random(20240611)
    for i in range(5):
        state = copy_state(v1_state, tmp_path / str(i))
        with subprocess.Popen(
            driver_cmd(state, "--bundle", str(v2.path)),
            env=driver_env(tmp_path, None),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        ) as proc:
            time.sleep(rng.uniform(0.2, 1.1))
            proc.kill()
            out, _ = proc.communicate(timeout=30)
        points = reached(out)
        inst = installer(state)
        inst.recover()
        digest = active_digest(inst)
        if "commit-marker" in points:
            assert digest == v2.digest, points
        elif "commit-write" not in points:
            assert digest == v1.digest, points
        else:  # killed between the commit pointer's temp file and its rename: either
            assert digest in (v1.digest, v2.digest), points
        assert temp_files(state) == []
        inst.install(v2.path, source="test")
        assert active_digest(inst) == v2.digest
