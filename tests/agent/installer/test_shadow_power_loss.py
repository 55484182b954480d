"""Power loss during a shadow install: the installer runs in a process of its own
(install_driver.py --shadow) that is SIGKILLed at every named point of a shadow install
(mid file write included) and at a disk too small for the candidate. After it, what the
hot path would load (shadow_bundle) is never a half or unchecked candidate, recovery
removes what was left, the A/B side is as it was, and the install then finishes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from agent.installer import Installer
from agent.installer.shadow import (
    SHADOW_STATE_FILE,
    shadow_bundle,
    shadow_dir,
    shadow_retired_dir,
    shadow_staging_dir,
)
from agent.installer.shadowslot import SHADOW_CHECKPOINTS
from agent.kernel.bundle import Bundle, load_bundle
from tests.agent.installer.installer_helpers import make_bundle, temp_files
from tests.agent.installer.test_power_loss import copy_state, installer, reached, run_driver

PUBLISHED = ("shadow-done",)
"""Points at which the candidate is already in the slot."""


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return make_bundle(tmp_path_factory.mktemp("v1"), version="1.0.0", release=1)


@pytest.fixture(scope="module")
def v2(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    # several copy chunks, so "shadow-stage-write" stops with a half-written model file
    return make_bundle(tmp_path_factory.mktemp("v2"), version="2.0.0", release=2, pad=200_000)


@pytest.fixture(scope="module")
def v1_state(tmp_path_factory: pytest.TempPathFactory, v1: Bundle) -> Path:
    state = tmp_path_factory.mktemp("v1-state")
    installer(state).install(v1.path, source="test")
    return state


def ab_files(state: Path) -> dict[str, bytes]:
    d = state / "bundles" / "cls"
    return {
        str(p.relative_to(d)): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file()
        and not str(p.relative_to(d)).startswith(("slot-shadow", SHADOW_STATE_FILE, ".lock"))
    }


def shadow_digest(state: Path) -> str | None:
    path = shadow_bundle(state, "cls")
    return load_bundle(path).digest if path is not None else None


@pytest.mark.parametrize("point", SHADOW_CHECKPOINTS)
def test_power_cut_during_a_shadow_install_never_leaves_a_half_candidate(
    point: str, tmp_path: Path, v1_state: Path, v1: Bundle, v2: Bundle
) -> None:
    state = copy_state(v1_state, tmp_path)
    before = ab_files(state)
    proc = run_driver(state, tmp_path, "--bundle", str(v2.path), "--shadow", crash_at=point)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert reached(proc.stdout)[-1] == point
    published = point in PUBLISHED
    # what the hot path sees at start, before anything repairs the files
    assert shadow_digest(state) == (v2.digest if published else None)

    inst: Installer = installer(state)
    inst.recover()

    assert shadow_digest(state) == (v2.digest if published else None)
    assert not shadow_staging_dir(state, "cls").exists()
    assert not shadow_retired_dir(state, "cls").exists()
    if not published:
        assert not shadow_dir(state, "cls").exists()
    assert temp_files(state) == []
    assert ab_files(state) == before, "a shadow install (or its recovery) touched A/B"
    active = inst.active_bundle("cls")
    assert active is not None
    assert load_bundle(active).digest == v1.digest
    result = inst.install_shadow(v2.path, source="test")
    assert result.outcome == ("noop" if published else "committed")
    assert shadow_digest(state) == v2.digest


def test_a_disk_too_small_for_the_candidate_fails_at_stage_and_leaves_no_slot(
    tmp_path: Path, v1_state: Path, v2: Bundle
) -> None:
    state = copy_state(v1_state, tmp_path)
    before = ab_files(state)
    proc = run_driver(state, tmp_path, "--bundle", str(v2.path), "--shadow", "--fsize", "100000")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert '"step": "stage"' in proc.stdout
    assert '"mode": "shadow"' in proc.stdout
    assert shadow_bundle(state, "cls") is None
    assert not shadow_dir(state, "cls").exists()
    assert not shadow_staging_dir(state, "cls").exists()
    assert temp_files(state) == []
    assert ab_files(state) == before
