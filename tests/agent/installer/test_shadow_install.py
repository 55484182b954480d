"""Shadow installs through the real signed path: a fleet repository and key store
(fleet_server.repository), directives from issue_directive, the device's python-tuf
client reading the repository (or a tampered copy) from a directory, and the installer
on real files with a real worker pool.

A shadow directive stages, loads and benchmarks the candidate into slot-shadow and never
touches the A/B slots, the pointer, the markers or the install-state file; its report
says mode "shadow"; a switch or a revert empties the slot; ReportedState names it."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tuf.api.metadata import Metadata, Targets

from agent.directives.config import BundlesConfig
from agent.directives.link import Report, apply_directive, make_client, trust_dir
from agent.directives.report import reported_state
from agent.installer import Installer, InstallerConfig
from agent.installer import cli as installer_cli
from agent.installer.machine import BundleId, PlanKind
from agent.installer.shadow import (
    SHADOW_STATE_FILE,
    shadow_bundle,
    shadow_dir,
    shadow_retired_dir,
    shadow_staging_dir,
)
from agent.installer.shadowslot import plan_shadow, stale_reason
from agent.update.directive import MODE_SHADOW, verify_directive
from agent.update.errors import DirectiveRefused
from agent.update.fetchers import LocalDirFetcher
from agent.update.trust import AppliedCounter
from agent.wire.events import install_state_event
from agent.wire.reports import ReportedState
from fleet_server.repository import KeyStore, Repository
from fleet_server.repository.director import issue_directive
from fleet_server.repository.repo import DIRECTOR
from tests.agent.installer.installer_helpers import PROFILE, make_bundle

DEVICE = "gw-shadow"
NAME = "cls"
CONFIG = InstallerConfig(benchmark_runs=5, health_window_s=0.2, health_poll_s=0.1)
PASSPHRASE = "test passphrase, made at test time"  # noqa: S105 - a test key store


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KeyStore, Repository]]:
    """A signed repository with cls releases 1, 2, 3 and 4 (4 is over its latency budget
    on any device)."""
    root = tmp_path_factory.mktemp("fleet")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
        keys = KeyStore.create(root / "keys", root_keys=1, root_threshold=1)
        repo = Repository(root / "repo")
        repo.init(keys)
        for release in (1, 2, 3):
            b = make_bundle(root, name=NAME, version=f"1.{release}.0", release=release)
            repo.publish(b.path, keys)
        slow = make_bundle(root, name=NAME, version="1.4.0", release=4, budget_ms=0.0001)
        repo.publish(slow.path, keys)
        yield keys, repo


class Device:
    """One device's state directory, installer and directive handling (as the agent's
    directives service does it, without MQTT)."""

    def __init__(self, tmp_path: Path, fleet: tuple[KeyStore, Repository]) -> None:
        self.keys, self.repo = fleet
        self.state = tmp_path / "state"
        self.cfg = BundlesConfig(
            initial_root=self.repo.path / "metadata" / "1.root.json", installer=CONFIG
        )
        self.installer_reports: list[dict[str, Any]] = []
        self.installer = Installer(
            self.state, profile_name=PROFILE, config=CONFIG, on_report=self.installer_reports.append
        )

    def directive(self, release: int, mode: str = "active") -> bytes:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
            return issue_directive(self.repo, self.keys, DEVICE, PROFILE, NAME, release, mode=mode)

    def apply(self, directive: bytes, medium: Path | None = None) -> Report:
        client = make_client(
            self.cfg,
            self.state,
            LocalDirFetcher(medium or self.repo.path),
            device_id=DEVICE,
            hw=PROFILE,
        )
        return apply_directive(
            client, self.installer, directive, staging_root=self.state / "staging", source="test"
        )

    def assign(self, release: int, mode: str = "active", medium: Path | None = None) -> Report:
        return self.apply(self.directive(release, mode), medium)

    def ab_state(self, *, journal: bool = True) -> dict[str, bytes]:
        """Every file of the A/B side: both slots, pointer, markers, install-state (unless
        ``journal`` is false)."""
        d = self.state / "bundles" / NAME
        out = {}
        for p in sorted(d.rglob("*")):
            rel = str(p.relative_to(d))
            if p.is_file() and not rel.startswith(("slot-shadow", SHADOW_STATE_FILE, ".lock")):
                out[rel] = p.read_bytes()
        if not journal:
            out.pop("install-state.json", None)
        return out

    def active_release(self) -> int:
        active = self.installer.active_bundle(NAME)
        assert active is not None
        return int(json.loads((active / "manifest.json").read_text())["release"])

    def shadow_release(self) -> int | None:
        path = shadow_bundle(self.state, NAME)
        return (
            None
            if path is None
            else int(json.loads((path / "manifest.json").read_text())["release"])
        )

    def counter(self) -> int:
        return AppliedCounter(trust_dir(self.cfg, self.state)).read().counter


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, fleet: tuple[KeyStore, Repository]) -> Path:
    """The state directory of a device on which release 1 was installed and committed,
    once per module (an install starts a worker pool to benchmark the bundle)."""
    d = Device(tmp_path_factory.mktemp("installed"), fleet)
    assert d.assign(1)["outcome"] == "committed"
    where = str(d.state).encode()
    named = [p for p in d.state.rglob("*") if p.is_file() and where in p.read_bytes()]
    assert not named, f"these files name the state directory, a copy would differ: {named}"
    return d.state


@pytest.fixture
def device(tmp_path: Path, fleet: tuple[KeyStore, Repository], installed: Path) -> Device:
    """A device with release 1 installed and committed: a copy of ``installed`` (whose
    files name no path, so the copy is the same device state)."""
    shutil.copytree(installed, tmp_path / "state", symlinks=True)
    return Device(tmp_path, fleet)


def _tampered_medium(tmp_path: Path, repo: Repository, release: int) -> Path:
    """A copy of the repository whose model file of ``release`` has one byte flipped."""
    medium = tmp_path / "medium"
    for part in ("metadata", "targets"):
        shutil.copytree(repo.path / part, medium / part)
    (model,) = (medium / "targets" / "bundles" / NAME / str(release)).glob("*.onnx")
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    return medium


# -- the shadow install ------------------------------------------------------------------


def test_a_shadow_directive_stages_into_slot_shadow_and_leaves_the_active_slot_alone(
    device: Device,
) -> None:
    before = device.ab_state()
    assert before, "slot-a, the pointer and the marker are there"

    report = device.assign(2, MODE_SHADOW)

    assert report["outcome"] == "committed", report
    assert (report["mode"], report["step"], report["slot"]) == ("shadow", "shadow", "shadow")
    assert (report["bundle"], report["release"]) == (NAME, 2)
    assert report["benchmark_p95_ms"] >= 0
    assert device.shadow_release() == 2
    assert shadow_bundle(device.state, NAME) == shadow_dir(device.state, NAME)
    assert device.active_release() == 1
    assert device.ab_state() == before, "a shadow install touched the A/B side"
    assert not shadow_staging_dir(device.state, NAME).exists()
    assert not (device.state / "staging" / f"{NAME}-2-shadow").exists()
    last = device.installer_reports[-1]
    assert (last["mode"], last["status"], last["slot"]) == ("shadow", "committed", "shadow")
    assert last["active"]["release"] == 1


def test_the_install_event_of_a_shadow_install_says_mode_shadow(device: Device) -> None:
    report = device.assign(2, MODE_SHADOW)

    event = install_state_event(DEVICE, report)

    assert event.kind == "install"
    assert event.payload["mode"] == "shadow"
    assert (event.payload["outcome"], event.payload["release"]) == ("committed", 2)
    assert json.loads(json.dumps(event.payload)) == event.payload


def test_an_active_directive_reports_mode_active(tmp_path: Path, fleet: Any) -> None:
    report = Device(tmp_path, fleet).assign(1)
    assert (report["outcome"], report["mode"]) == ("committed", "active")
    assert "shadow_cleared" not in report


def test_a_shadow_directive_for_the_active_release_is_a_no_op(device: Device) -> None:
    before = device.ab_state()

    report = device.assign(1, MODE_SHADOW)

    assert (report["outcome"], report["mode"]) == ("noop", "shadow"), report
    assert "nothing to compare" in report["reason"]
    assert shadow_bundle(device.state, NAME) is None
    assert not shadow_dir(device.state, NAME).exists()
    assert device.ab_state() == before


def test_a_tampered_shadow_bundle_is_refused_and_nothing_is_left_in_the_slot(
    tmp_path: Path, device: Device
) -> None:
    medium = _tampered_medium(tmp_path, device.repo, 2)
    before = device.ab_state()
    counter = device.counter()

    report = device.assign(2, MODE_SHADOW, medium=medium)

    assert (report["outcome"], report["mode"]) == ("refused", "shadow"), report
    assert report["step"] == "fetch"
    assert "not the signed length/hashes" in report["reason"]
    assert shadow_bundle(device.state, NAME) is None
    for leftover in (
        shadow_dir(device.state, NAME),
        shadow_staging_dir(device.state, NAME),
        shadow_retired_dir(device.state, NAME),
        device.state / "staging" / f"{NAME}-2-shadow",
    ):
        assert not leftover.exists(), leftover
    assert device.ab_state() == before
    assert device.counter() == counter, "a refused download can be retried"


def test_a_shadow_over_its_latency_budget_fails_at_benchmark_and_leaves_no_slot(
    device: Device,
) -> None:
    report = device.assign(4, MODE_SHADOW)

    assert (report["outcome"], report["step"], report["mode"]) == ("failed", "benchmark", "shadow")
    assert "latency budget" in report["reason"]
    assert not shadow_dir(device.state, NAME).exists()
    assert not shadow_staging_dir(device.state, NAME).exists()
    assert device.active_release() == 1
    state = json.loads((device.state / "bundles" / NAME / SHADOW_STATE_FILE).read_text())
    assert (state["status"], state["step"]) == ("failed", "benchmark")


def test_a_shadow_directive_naming_another_release_replaces_the_shadow(device: Device) -> None:
    assert device.assign(2, MODE_SHADOW)["outcome"] == "committed"

    report = device.assign(3, MODE_SHADOW)

    assert report["outcome"] == "committed", report
    assert device.shadow_release() == 3
    assert not shadow_retired_dir(device.state, NAME).exists()
    assert device.active_release() == 1


def test_the_same_shadow_directive_again_is_already_applied_and_keeps_the_shadow(
    device: Device,
) -> None:
    directive = device.directive(2, MODE_SHADOW)
    assert device.apply(directive)["outcome"] == "committed"

    again = device.apply(directive)  # the retained directive, delivered again

    assert (again["outcome"], again["reason"], again["mode"]) == (
        "noop",
        "already applied",
        "shadow",
    )
    assert device.shadow_release() == 2


def test_a_newer_shadow_directive_for_the_shadow_release_is_a_no_op(device: Device) -> None:
    assert device.assign(2, MODE_SHADOW)["outcome"] == "committed"
    counter = device.counter()

    report = device.assign(2, MODE_SHADOW)

    assert (report["outcome"], report["reason"]) == ("noop", "already the shadow"), report
    assert device.counter() > counter
    assert device.shadow_release() == 2


# -- a switch or a revert ends the comparison -------------------------------------------------


def test_an_active_directive_for_the_shadow_release_switches_and_empties_the_shadow(
    device: Device,
) -> None:
    assert device.assign(2, MODE_SHADOW)["outcome"] == "committed"

    report = device.assign(2)

    assert (report["outcome"], report["mode"]) == ("committed", "active"), report
    assert report["shadow_cleared"] == 2
    assert device.active_release() == 2
    assert shadow_bundle(device.state, NAME) is None
    assert not shadow_dir(device.state, NAME).exists()
    state = json.loads((device.state / "bundles" / NAME / SHADOW_STATE_FILE).read_text())
    assert state["status"] == "removed"


def test_a_revert_to_the_running_release_empties_the_shadow(device: Device) -> None:
    assert device.assign(2, MODE_SHADOW)["outcome"] == "committed"
    before = device.ab_state(journal=False)

    report = device.assign(1)  # the fleet stops the rollout: back to what runs

    assert (report["outcome"], report["mode"]) == ("noop", "active"), report
    assert report["shadow_cleared"] == 2
    assert shadow_bundle(device.state, NAME) is None
    assert device.active_release() == 1
    assert device.ab_state(journal=False) == before  # the install-state says "noop"


def test_a_revert_to_the_previous_slot_empties_the_shadow(device: Device) -> None:
    assert device.assign(2)["outcome"] == "committed"
    assert device.assign(3, MODE_SHADOW)["outcome"] == "committed"

    report = device.assign(1)  # release 1 is intact in the other slot: a rollback

    assert (report["outcome"], report["step"]) == ("rolled-back", "rollback"), report
    assert report["shadow_cleared"] == 3
    assert device.active_release() == 1
    assert shadow_bundle(device.state, NAME) is None


# -- the directive's mode ---------------------------------------------------------------------


def _resigned_with_mode(device: Device, directive: bytes, mode: object) -> bytes:
    """``directive`` with custom.mode set to ``mode``, signed again by the director."""
    md = Metadata[Targets].from_bytes(directive)
    md.signed.unrecognized_fields["custom"]["mode"] = mode
    md.signatures.clear()
    targets = device.repo.targets().signed
    role = targets.get_delegated_role(DIRECTOR)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
        for signer in device.keys.signers(role.keyids):
            md.sign(signer, append=True)
    return md.to_bytes()


@pytest.mark.parametrize("mode", ["canary", "SHADOW", "", 1])
def test_an_unknown_mode_in_a_signed_directive_is_refused(device: Device, mode: object) -> None:
    directive = _resigned_with_mode(device, device.directive(2), mode)
    targets = device.repo.targets().signed
    counter = device.counter()

    with pytest.raises(DirectiveRefused) as err:
        verify_directive(directive, targets, device_id=DEVICE, hardware_class=PROFILE)
    assert "custom.mode" in err.value.reason
    report = device.apply(directive)

    assert report["outcome"] == "refused", report
    assert "custom.mode" in report["reason"]
    assert "mode" not in report, "an unverified directive has no mode"
    assert not shadow_dir(device.state, NAME).exists()
    assert device.active_release() == 1
    assert device.counter() == counter


def test_a_signed_shadow_mode_verifies(device: Device) -> None:
    directive = _resigned_with_mode(device, device.directive(2), "shadow")
    targets = device.repo.targets().signed
    d = verify_directive(directive, targets, device_id=DEVICE, hardware_class=PROFILE)
    assert (d.mode, d.release) == ("shadow", 2)


# -- what the device reports and shows ----------------------------------------------------------


def test_reported_state_carries_the_shadow_while_it_is_in_the_slot(device: Device) -> None:
    assert "shadow" not in reported_state(PROFILE, device.installer, {})
    assert device.assign(2, MODE_SHADOW)["outcome"] == "committed"

    fields = reported_state(PROFILE, device.installer, {"line": "l1"})
    state = ReportedState.model_validate(
        {**fields, "device_id": DEVICE, "ts": time.time(), "online": True}
    )

    assert state.shadow is not None
    assert (state.shadow.name, state.shadow.version, state.shadow.release) == (NAME, "1.2.0", 2)
    assert state.active is not None
    assert state.active.release == 1
    assert device.assign(2)["outcome"] == "committed"
    after = ReportedState.model_validate(
        {**reported_state(PROFILE, device.installer, {}), "device_id": DEVICE, "ts": time.time()}
    )
    assert after.shadow is None
    assert after.active is not None
    assert after.active.release == 2


def test_bundles_cli_lists_the_shadow_slot(
    device: Device, capsys: pytest.CaptureFixture[str]
) -> None:
    assert installer_cli.cmd_bundles(state_dir=device.state, as_json=True) == 0
    assert [r["slot"] for r in json.loads(capsys.readouterr().out)] == ["a", "b"]
    assert device.assign(2, MODE_SHADOW)["outcome"] == "committed"

    assert installer_cli.cmd_bundles(state_dir=device.state, as_json=True) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["slot"], r["state"], r["release"], r["active"]) for r in rows] == [
        ("a", "committed", 1, True),
        ("b", "empty", None, False),
        ("shadow", "shadow", 2, False),
    ]
    assert rows[2]["last"]["status"] == "committed"
    assert installer_cli.cmd_bundles(state_dir=device.state) == 0
    table = capsys.readouterr().out
    assert " shadow shadow     1.2.0 " in table
    assert "committed at shadow" in table


# -- crash safety --------------------------------------------------------------------------------


def test_recovery_removes_a_half_staged_shadow_and_marks_the_install_failed(
    device: Device,
) -> None:
    d = device.state / "bundles" / NAME
    staging = shadow_staging_dir(device.state, NAME)
    staging.mkdir()
    (staging / "cls.onnx").write_bytes(b"half a model")
    half = shadow_dir(device.state, NAME)
    half.mkdir()
    (half / ".cls.onnx.abc.tmp").write_bytes(b"half")
    retired = shadow_retired_dir(device.state, NAME)
    retired.mkdir()
    (retired / "manifest.json").write_text("{}")
    (d / SHADOW_STATE_FILE).write_text(
        json.dumps({"format": 1, "name": NAME, "status": "running", "step": "stage"})
    )
    assert shadow_bundle(device.state, NAME) is None, "no manifest: never seen as a shadow"
    before = device.ab_state()

    Installer(device.state, profile_name=PROFILE, config=CONFIG).recover()

    for leftover in (staging, half, retired):
        assert not leftover.exists(), leftover
    state = json.loads((d / SHADOW_STATE_FILE).read_text())
    assert state["status"] == "failed"
    assert "interrupted during stage" in state["reason"]
    assert device.ab_state() == before
    assert [s.slot for s in device.installer.status()] == ["a", "b"]


def test_recovery_empties_a_shadow_the_device_already_switched_to(device: Device) -> None:
    assert device.assign(2, MODE_SHADOW)["outcome"] == "committed"
    kept = shadow_dir(device.state, NAME).parent / "kept"
    shutil.copytree(shadow_dir(device.state, NAME), kept)
    assert device.assign(2)["outcome"] == "committed"
    shutil.copytree(kept, shadow_dir(device.state, NAME))  # a stop before the wipe

    Installer(device.state, profile_name=PROFILE, config=CONFIG).recover()

    assert shadow_bundle(device.state, NAME) is None
    assert device.active_release() == 2


# -- the rules ----------------------------------------------------------------------------------


def _bid(release: int, digest: str = "") -> BundleId:
    return BundleId(NAME, f"1.{release}.0", release, digest or f"d{release}")


@pytest.mark.parametrize(
    ("committed", "current", "target", "kind"),
    [
        (None, None, _bid(1), PlanKind.INSTALL),
        (_bid(1), None, _bid(2), PlanKind.INSTALL),
        (_bid(1), _bid(2), _bid(3), PlanKind.INSTALL),
        (_bid(1), None, _bid(1), PlanKind.NOOP),
        (_bid(1), _bid(2), _bid(2), PlanKind.NOOP),
        (_bid(2), None, _bid(1), PlanKind.REFUSE),
        (_bid(2), None, _bid(2, "other"), PlanKind.REFUSE),
    ],
)
def test_plan_shadow(
    committed: BundleId | None, current: BundleId | None, target: BundleId, kind: PlanKind
) -> None:
    assert plan_shadow(committed, current, target).kind is kind


def test_stale_reason() -> None:
    assert stale_reason(False, None, _bid(1)) is None
    assert stale_reason(True, _bid(2), _bid(1)) is None
    assert stale_reason(True, None, _bid(1)) is not None
    assert "not above" in (stale_reason(True, _bid(2), _bid(2)) or "")
