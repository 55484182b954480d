"""Disk full while staging (attack 15): the installer runs in a process whose file size
limit (RLIMIT_FSIZE, SIGXFSZ ignored) is below the new model's size, so the kernel
fails the write with EFBIG half-way through the copy."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.installer import Installer, InstallerConfig
from agent.installer.store import JOURNAL_FILE
from agent.kernel.bundle import Bundle, load_bundle
from tests.agent.installer.installer_helpers import PROFILE, make_bundle, slot_files, temp_files

DRIVER = Path(__file__).with_name("install_driver.py")
CONFIG = InstallerConfig(benchmark_runs=10, health_window_s=0.2, health_poll_s=0.1)
LIMIT = 96 * 1024


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return make_bundle(tmp_path_factory.mktemp("v1"), version="1.0.0", release=1)


@pytest.fixture(scope="module")
def big_v2(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    bundle = make_bundle(tmp_path_factory.mktemp("v2"), version="2.0.0", release=2, pad=400_000)
    assert (bundle.path / "cls.onnx").stat().st_size > 4 * LIMIT
    return bundle


def lines(stdout: str, kind: str) -> list[dict[str, object]]:
    return [json.loads(ln.split(" ", 1)[1]) for ln in stdout.splitlines() if ln.startswith(kind)]


def test_disk_full_while_staging_keeps_the_old_model_and_removes_partial_files(
    tmp_path: Path, v1: Bundle, big_v2: Bundle
) -> None:
    state = tmp_path / "state"
    installer = Installer(state, profile_name=PROFILE, config=CONFIG)
    installer.install(v1.path, source="test")
    old_slot = state / "bundles" / "cls" / "slot-a"
    before = {p.name: p.read_bytes() for p in old_slot.iterdir()}

    proc = subprocess.run(
        [
            sys.executable,
            str(DRIVER),
            str(state),
            "--bundle",
            str(big_v2.path),
            "--fsize",
            str(LIMIT),
        ],
        env={**os.environ, "EDGEFLEET_SHM_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    (error,) = lines(proc.stdout, "error ")
    assert error["step"] == "stage"
    assert os.strerror(errno.EFBIG) in str(error["reason"])
    assert "cls.onnx" in str(error["reason"])
    report = lines(proc.stdout, "report ")[-1]
    assert (report["status"], report["step"]) == ("failed", "stage")
    assert "checkpoint load" not in proc.stdout  # nothing past staging ran

    # the old model: the same bytes, still what the agent loads
    assert {p.name: p.read_bytes() for p in old_slot.iterdir()} == before
    assert installer.active_bundle("cls") == old_slot
    assert load_bundle(old_slot).digest == v1.digest
    # no partial file (nor temp file) left behind
    assert slot_files(state, "cls", "b") == []
    assert temp_files(state) == []
    recorded = json.loads((state / "bundles" / "cls" / JOURNAL_FILE).read_text())
    assert (recorded["status"], recorded["step"]) == ("failed", "stage")
    assert installer.recover() == []  # nothing left to repair

    # with room again the same install goes through
    result = installer.install(big_v2.path, source="test")
    assert (result.outcome, result.slot) == ("committed", "b")
    assert load_bundle(result.path).digest == big_v2.digest
