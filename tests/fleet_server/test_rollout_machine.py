"""The rollout state machine, driven without a broker: named scenarios (happy path, a bad
bundle in wave 2, approval, an offline device returning, shifts, timeouts) and seeded
random event sequences checked against the machine's invariants after every step."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import pytest

from fleet_server.rollout import (
    TERMINAL,
    Approve,
    AssignDirective,
    BundleRef,
    Cancel,
    Command,
    DeviceInfo,
    DeviceReport,
    DeviceStatus,
    Event,
    InstallOutcome,
    Notify,
    Pause,
    Phase,
    Resolve,
    Resume,
    RevertDirective,
    RevertRefused,
    Rollback,
    Rollout,
    RolloutError,
    Tick,
    dumps,
    loads,
    outstanding,
    parse_spec,
    plan,
    refusal,
    step,
    step_all,
)

T0 = datetime(2024, 3, 4, 0, 0, tzinfo=timezone.utc).timestamp()  # a Monday, 00:00 UTC
OLD = BundleRef("det", 1)
NEW = BundleRef("det", 2)
BASE = {"pass": 900, "reject": 100}
S = DeviceStatus
STOPS = {*TERMINAL, Phase.PAUSED, Phase.ROLLING_BACK, Phase.AWAITING_APPROVAL, Phase.FINISHING}


def _spec(waves: str = "1,10%,50%,100%", soak: str = "10m", **policy: Any) -> Any:
    return parse_spec(
        {"bundle": "det@2.0.0", "selector": "profile=orin", "waves": waves, "soak_s": soak}
        | ({"policy": policy} if policy else {})
    )


def _devices(n: int, *, offline: Iterable[int] = (), line: str = "1") -> list[DeviceInfo]:
    off = set(offline)
    return [
        DeviceInfo(
            f"cam-{i:03d}",
            {"profile": "orin", "line": line},
            online=i not in off,
            active=OLD,
            p99_ms=20.0,
            outcome_counts=BASE,
        )
        for i in range(n)
    ]


@dataclass
class Fleet:
    """Drives a rollout and plays the devices: an assigned device installs and reports."""

    r: Rollout
    now: float = T0
    bad: set[str] = field(default_factory=set)
    silent: set[str] = field(default_factory=set)
    cmds: list[Command] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    handled: int = 0

    def send(self, ev: Event) -> list[Command]:
        self.events.append(ev)
        self.r, out = step(self.r, ev)
        self.cmds += out
        return out

    def tick(self, dt: float = 0.0) -> list[Command]:
        self.now += dt
        return self.send(Tick(self.now))

    def report(self, device_id: str, **kw: Any) -> list[Command]:
        return self.send(DeviceReport(device_id, self.now, **kw))

    def answer(self) -> None:
        """Devices that got a directive before this call install it, or revert."""
        end = len(self.cmds)
        while self.handled < end:
            cmd = self.cmds[self.handled]
            self.handled += 1
            if cmd.__class__ is AssignDirective and cmd.device_id not in self.silent:
                self.install(cmd.device_id, ok=cmd.device_id not in self.bad)
            elif isinstance(cmd, RevertDirective) and cmd.device_id not in self.silent:
                self.report(cmd.device_id, active_bundle="det", active_release=1)

    def install(self, device_id: str, *, ok: bool) -> None:
        about = {"install_bundle": "det", "install_release": 2}
        self.report(
            device_id,
            active_bundle="det",
            active_release=1,
            install=InstallOutcome.RUNNING,
            **about,
        )
        if ok:
            self.report(
                device_id,
                active_bundle="det",
                active_release=2,
                install=InstallOutcome.COMMITTED,
                p99_ms=21.0,
                outcome_counts={"pass": 905, "reject": 95},
                **about,
            )
        else:
            self.report(
                device_id,
                active_bundle="det",
                active_release=1,
                install=InstallOutcome.FAILED,
                auto_rollback=True,
                worker_crashes=2,
                **about,
            )

    def run(
        self, dt: float = 60.0, limit: int = 2000, until: Callable[[Rollout], bool] | None = None
    ) -> None:
        """Answer directives and tick until the rollout waits for someone (or ``until``)."""
        for _ in range(limit):
            self.answer()
            if until is not None and until(self.r):
                return
            if self.r.phase in STOPS:
                return
            self.tick(dt)
        raise AssertionError(f"still {self.r.phase} after {limit} ticks")

    def assigns(self) -> list[str]:
        return [c.device_id for c in self.cmds if isinstance(c, AssignDirective)]

    def reverts(self) -> list[str]:
        return [c.device_id for c in self.cmds if isinstance(c, RevertDirective)]

    def notes(self, kind: str) -> list[str]:
        return [c.message for c in self.cmds if isinstance(c, Notify) and c.kind == kind]


def _fleet(n: int = 20, spec: Any = None, **kw: Any) -> Fleet:
    devices = kw.pop("devices", None) or _devices(n)
    return Fleet(plan("ro-1", spec or _spec(), 2, devices, T0, budget_ms=50.0), **kw)


# -- named scenarios ------------------------------------------------------------------


def test_happy_path_goes_1_then_10_then_50_then_100_percent() -> None:
    f = _fleet(20)
    assert f.r.phase is Phase.PLANNED
    assert [w.target for w in f.r.waves] == [1, 2, 10, 20]
    f.run()
    assert f.r.phase is Phase.COMPLETED
    assert [len(w.devices) for w in f.r.waves] == [1, 1, 8, 10]
    assert all(w.passed_at is not None for w in f.r.waves)
    assert sorted(f.assigns()) == sorted(f.r.devices)  # each device assigned exactly once
    assert list(f.assigns()) == list(f.r.order)  # in the rollout's stable order
    assert f.r.count(S.DONE) == 20
    phases = [(t.phase, t.wave) for t in f.r.history]
    for wave in (1, 2, 3, 4):
        assert phases.index((Phase.ASSIGNING, wave)) < phases.index((Phase.SOAKING, wave))
    assert phases[-1] == (Phase.COMPLETED, 4)
    assert f.r.deadline is None
    assert f.reverts() == []


def test_each_wave_soaks_for_the_soak_time_after_its_last_device_settled() -> None:
    f = _fleet(20, _spec(soak="10m"))
    f.run(dt=30.0)
    for wave in f.r.waves:
        settled = max(f.r.devices[d].settled_at or 0 for d in wave.devices)
        assert wave.passed_at is not None
        assert settled + 600 <= wave.passed_at < settled + 600 + 60


def test_bad_bundle_in_wave_2_pauses_and_rolls_back_waves_1_and_2() -> None:
    f = _fleet(40)
    assert [w.target for w in f.r.waves] == [1, 4, 20, 40]
    wave1, wave2 = f.r.order[0], f.r.order[1:4]
    f.bad = {wave2[1]}
    f.run()
    assert f.r.phase is Phase.ROLLING_BACK
    assert f.r.wave == 1
    assert "gate failed in wave 2" in f.r.reason
    assert "automatic rollbacks" in f.r.reason
    assert f.notes("gate_failed")
    assert set(f.assigns()) == {wave1, *wave2}
    assert sorted(f.reverts()) == sorted([wave1, *wave2])
    reverts = [c for c in f.cmds if isinstance(c, RevertDirective)]
    assert all((c.bundle, c.release) == ("det", 1) for c in reverts)
    f.answer()  # the devices go back to release 1
    f.tick()
    assert f.r.phase is Phase.ROLLED_BACK
    assert all(f.r.devices[d].status is S.ROLLED_BACK for d in (wave1, *wave2))
    assert f.r.count(S.PENDING) == 36
    f.tick(86_400)
    assert len(f.assigns()) == 4  # nothing more was assigned


def test_failed_gate_without_rollback_policy_only_pauses_and_resume_accepts_it() -> None:
    f = _fleet(20, _spec(rollback_done_waves_on_failure=False))
    f.bad = {f.r.order[1]}
    f.run()
    assert f.r.phase is Phase.PAUSED
    assert f.r.reason.startswith("gate failed in wave 2")
    assert f.reverts() == []
    assert f.r.failed_devices == (f.r.order[1],)
    f.tick(3600)
    assert f.r.phase is Phase.PAUSED
    assert len(f.assigns()) == 2
    f.send(Resume(f.now))
    assert f.r.devices[f.r.order[1]].waived
    f.run()
    assert f.r.phase is Phase.COMPLETED_PARTIAL
    assert f.r.count(S.DONE) == 19
    assert f.r.devices[f.r.order[1]].status is S.FAILED
    assert f.r.order[1] in f.r.reason


def test_a_waived_failed_canary_gives_its_place_to_another_device_at_once() -> None:
    f = _fleet(20, _spec(rollback_done_waves_on_failure=False))
    canary = f.r.order[0]
    f.bad = {canary}
    f.run()
    assert f.r.phase is Phase.PAUSED
    assert f.r.reason.startswith("gate failed in wave 1")
    f.bad = set()
    f.send(Resume(f.now))
    assert f.r.devices[canary].waived
    assert f.assigns()[-1] == f.r.order[1]  # assigned on resume, not after a timeout
    f.run()
    assert f.r.phase is Phase.COMPLETED_PARTIAL
    assert f.r.count(S.DONE) == 19
    assert not any("timeout" in t.reason for t in f.r.history)


def test_approval_blocks_the_next_wave_until_approve() -> None:
    f = _fleet(20, _spec(approval_between_waves=True))
    f.run()
    assert f.r.phase is Phase.AWAITING_APPROVAL
    assert f.r.wave == 0
    f.tick(3600 * 5)
    assert f.r.phase is Phase.AWAITING_APPROVAL
    assert len(f.assigns()) == 1
    f.send(Approve(f.now, by="ops"))
    assert f.r.phase is Phase.ASSIGNING
    assert f.r.wave == 1
    assert len(f.assigns()) == 2
    assert f.r.history[-1].reason == "wave 2 approved by ops"
    assert f.r.history[-1].wave == 2  # the transition and its reason name the same wave
    for _ in range(2):
        f.run()
        assert f.r.phase is Phase.AWAITING_APPROVAL
        f.send(Approve(f.now))
    f.run()
    assert f.r.phase is Phase.COMPLETED  # no approval after the last wave


def test_approval_that_never_comes_pauses_then_cancels() -> None:
    f = _fleet(20, _spec(approval_between_waves=True))
    f.run()
    f.tick(86_400)
    assert f.r.phase is Phase.PAUSED
    assert "no approval" in f.r.reason
    f.send(Resume(f.now))
    assert f.r.phase is Phase.AWAITING_APPROVAL  # resumed where it was
    f.tick(86_400)
    f.tick(7 * 86_400)
    assert f.r.phase is Phase.CANCELLED
    assert len(f.assigns()) == 1


def test_operator_event_in_the_wrong_phase_is_rejected_and_changes_nothing() -> None:
    f = _fleet(20)
    f.tick()
    before = dumps(f.r)
    out = f.send(Approve(f.now))
    assert out == [Notify("rejected", "assigning", 1, "cannot approve a rollout that is assigning")]
    assert dumps(f.r) == before
    assert refusal(f.r, Resume(f.now)) == "cannot resume a rollout that is assigning"
    assert refusal(f.r, Pause(f.now)) is None


def test_offline_device_is_pending_and_assigned_when_it_returns() -> None:
    f = _fleet(devices=_devices(10))
    first = f.r.order[0]
    f.report(first, online=False)
    assert f.r.devices[first].status is S.OFFLINE
    f.run()
    assert f.r.phase is Phase.FINISHING
    assert f.r.devices[first].status is S.OFFLINE
    assert first not in f.assigns()
    assert f.r.waves[0].devices == (f.r.order[1],)  # the canary is the first online device
    assert f.r.count(S.FAILED) == 0
    f.tick(3600)
    f.report(first, online=True, active_bundle="det", active_release=1)
    assert f.assigns()[-1] == first
    f.run()
    assert f.r.phase is Phase.COMPLETED
    assert f.r.devices[first].wave == len(f.r.waves) - 1


def test_device_that_never_returns_ends_completed_partial_after_the_final_timeout() -> None:
    f = _fleet(devices=_devices(10, offline=[3]), spec=_spec(timeouts={"finishing_s": 7200}))
    f.run()
    assert f.r.phase is Phase.FINISHING
    since = f.r.since
    f.tick(7199 - (f.now - since))
    assert f.r.phase is Phase.FINISHING
    f.tick(2)
    assert f.r.phase is Phase.COMPLETED_PARTIAL
    assert "cam-003" in f.r.reason
    assert f.r.devices["cam-003"].status is S.OFFLINE


def test_device_already_on_the_target_counts_as_done_without_a_directive() -> None:
    devices = _devices(10)
    devices[4] = DeviceInfo("cam-004", {"profile": "orin"}, active=NEW)
    f = _fleet(devices=devices)
    assert f.r.devices["cam-004"].status is S.DONE
    assert f.r.waves[-1].target == 9
    late = next(d for d in reversed(f.r.order) if d != "cam-004")
    f.report(late, active_bundle="det", active_release=2)  # e.g. side-loaded from USB
    assert f.r.devices[late].status is S.DONE
    f.run()
    assert f.r.phase is Phase.COMPLETED
    assert "cam-004" not in f.assigns()
    assert late not in f.assigns()


def test_every_selected_device_already_on_the_target_completes_at_once() -> None:
    devices = [DeviceInfo(f"d{i}", {"profile": "orin"}, active=NEW) for i in range(3)]
    f = _fleet(devices=devices)
    f.tick()
    assert f.r.phase is Phase.COMPLETED
    assert f.assigns() == []


def test_devices_outside_the_selector_are_not_in_the_rollout() -> None:
    devices = [*_devices(3), DeviceInfo("other", {"profile": "x86"}, active=OLD)]
    f = _fleet(devices=devices)
    assert "other" not in f.r.devices
    f.report("other", active_bundle="det", active_release=1)
    assert f.r.ignored_reports == 1
    with pytest.raises(RolloutError, match="matches no device"):
        plan("ro-2", _spec(), 2, [devices[-1]], T0)
    with pytest.raises(RolloutError, match="repeated"):
        plan("ro-2", _spec(), 2, [devices[0], devices[0]], T0)


def test_assigned_device_that_never_reports_times_the_wave_out_into_pause() -> None:
    f = _fleet(20, _spec(timeouts={"assigning_s": 1800}))
    canary = f.r.order[0]
    f.silent = {canary}
    f.run()
    assert f.r.phase is Phase.PAUSED
    assert f.r.reason.startswith("timeout: wave 1 devices did not report done")
    assert canary in f.r.reason
    assert f.r.history[-1].at - f.r.history[-2].at == 1800
    f.send(Resume(f.now))
    assert f.r.phase is Phase.ASSIGNING
    assert f.r.deadline == f.now + 1800
    f.silent.clear()
    f.install(canary, ok=True)
    f.run()
    assert f.r.phase is Phase.COMPLETED
    assert f.assigns().count(canary) == 1


def test_a_revert_not_confirmed_by_its_deadline_is_stuck_with_the_reason() -> None:
    f = _fleet(20)
    f.bad = {f.r.order[2]}
    f.run()
    assert f.r.phase is Phase.ROLLING_BACK
    cause = f.r.reason
    quiet = f.r.order[0]
    f.silent = {quiet}
    f.answer()
    sent = f.r.devices[quiet].reverted_at
    assert sent is not None
    assert f.r.deadline == f.r.devices[quiet].deadline == sent + 3600
    f.tick(3599)
    assert f.r.devices[quiet].status is S.REVERTING
    f.tick(1)
    d = f.r.devices[quiet]
    assert d.status is S.STUCK
    assert d.why == "timeout: no revert to det release 1 confirmed within 3600 s"
    assert f.notes("device_stuck") == [f"{quiet}: {d.why}"]
    # a stuck device holds the rollout in rolling_back (and its devices) until resolved
    f.tick(86_400)
    assert f.r.phase is Phase.ROLLING_BACK
    assert f.r.deadline is None
    assert f.r.reason == cause


def test_an_operator_retries_a_stuck_revert_and_the_rollback_finishes() -> None:
    f = _fleet(20)
    f.bad = {f.r.order[2]}
    f.run()
    quiet = f.r.order[0]
    f.silent = {quiet}
    f.answer()
    f.tick(3600)
    assert f.r.devices[quiet].status is S.STUCK
    before = f.reverts().count(quiet)
    f.silent.clear()
    out = f.send(Resolve(f.now, quiet, "retry", by="alice"))
    assert [c for c in out if isinstance(c, RevertDirective)] == [RevertDirective(quiet, "det", 1)]
    assert f.reverts().count(quiet) == before + 1
    assert f.r.devices[quiet].status is S.REVERTING
    assert f.r.devices[quiet].deadline == f.now + 3600
    (note,) = [c for c in out if isinstance(c, Notify) and c.kind == "resolved"]
    assert note.by == "alice"
    assert note.message == f"{quiet}: retry by alice: revert to det release 1"
    f.answer()
    assert f.r.phase is Phase.ROLLED_BACK
    assert f.r.devices[quiet].status is S.ROLLED_BACK
    assert f.r.reason.endswith("; every reverted device runs its previous bundle")


def test_an_operator_assigns_a_named_release_to_a_stuck_device() -> None:
    f = _fleet(20)
    f.bad = {f.r.order[2]}
    f.run()
    quiet = f.r.order[0]
    f.silent = {quiet}
    f.answer()
    f.tick(3600)
    out = f.send(Resolve(f.now, quiet, "assign", release=3, by="bob"))
    assert RevertDirective(quiet, "det", 3) in out
    assert f.r.devices[quiet].revert_to == BundleRef("det", 3)
    # release 1 is no answer now; release 3 is
    f.report(quiet, active_bundle="det", active_release=1)
    assert f.r.devices[quiet].status is S.REVERTING
    f.report(quiet, active_bundle="det", active_release=3)
    assert f.r.devices[quiet].status is S.ROLLED_BACK
    assert f.r.phase is Phase.ROLLED_BACK


def test_an_operator_accepts_a_stuck_device_as_it_is_and_who_is_kept() -> None:
    f = _fleet(20)
    f.bad = {f.r.order[2]}
    f.run()
    quiet = f.r.order[0]
    f.silent = {quiet}
    f.answer()
    f.tick(3600)
    out = f.send(Resolve(f.now, quiet, "accept", by="carol", reason="line restarted on it"))
    assert not [c for c in out if isinstance(c, RevertDirective)]
    d = f.r.devices[quiet]
    assert d.status is S.ACCEPTED
    assert d.why == "accepted as it is (det release 2) by carol: line restarted on it"
    assert f.r.phase is Phase.ROLLED_BACK
    assert f.r.reason.endswith(f"accepted as they are: {quiet}")


def test_a_device_that_reports_its_revert_failed_is_stuck_with_its_reason() -> None:
    f = _fleet(20)
    f.bad = {f.r.order[2]}
    f.run()
    quiet = f.r.order[0]
    f.silent = {quiet}
    f.answer()
    sent = f.r.devices[quiet].reverted_at
    assert sent is not None
    # a failure older than the revert is not its answer
    f.report(
        quiet,
        active_bundle="det",
        active_release=2,
        install=InstallOutcome.FAILED,
        install_bundle="det",
        install_release=1,
        install_at=sent - 600,
        install_reason="download: gone",
    )
    assert f.r.devices[quiet].status is S.REVERTING
    f.report(
        quiet,
        active_bundle="det",
        active_release=2,
        install=InstallOutcome.FAILED,
        install_bundle="det",
        install_release=1,
        install_at=sent + 5,
        install_reason="fetch: timed out",
    )
    d = f.r.devices[quiet]
    assert d.status is S.STUCK
    assert d.why == "the device could not revert to det release 1: fetch: timed out"
    # an older agent refuses the revert directive before reading what it names
    g = _fleet(20)
    g.bad = {g.r.order[2]}
    g.run()
    g.silent = {quiet}
    g.answer()
    g.report(quiet, active_bundle="det", active_release=2, install=InstallOutcome.FAILED,
             install_at=g.now, install_reason="verify: custom.mode 'revert' is not one of "
             "active, shadow")  # fmt: skip
    assert g.r.devices[quiet].status is S.STUCK
    assert g.r.devices[quiet].why.endswith("custom.mode 'revert' is not one of active, shadow")
    # it comes back by itself later: rolled back, and the rollout ends
    f.report(quiet, active_bundle="det", active_release=1)
    assert f.r.devices[quiet].status is S.ROLLED_BACK
    assert f.r.phase is Phase.ROLLED_BACK


def test_a_revert_the_fleet_could_not_send_is_stuck_with_why() -> None:
    f = _fleet(20)
    f.bad = {f.r.order[2]}
    f.run()
    quiet = f.r.order[0]
    f.silent = {quiet}
    f.answer()
    f.send(RevertRefused(f.now, quiet, "bundle 'det' release 1 is not published"))
    d = f.r.devices[quiet]
    assert d.status is S.STUCK
    assert d.why == "the revert could not be sent: bundle 'det' release 1 is not published"
    assert f.r.phase is Phase.ROLLING_BACK


def test_a_device_that_ran_no_known_bundle_is_stuck_at_once_not_left_reverting() -> None:
    devices = _devices(3)
    devices[0] = replace(devices[0], active=None)
    spec = _spec(waves="100%")
    f = Fleet(plan("ro-1", spec, 2, devices, T0, budget_ms=50.0))
    f.run()
    f.send(Rollback(f.now, "operator", by="dave"))
    d = f.r.devices["cam-000"]
    assert d.status is S.STUCK
    assert "no bundle to return to" in d.why
    assert "cam-000" not in f.reverts()
    assert refusal(f.r, Resolve(f.now, "cam-000", "retry")) is not None
    f.answer()
    assert f.r.phase is Phase.ROLLING_BACK
    f.send(Resolve(f.now, "cam-000", "assign", release=1, by="dave"))
    f.answer()
    assert f.r.phase is Phase.ROLLED_BACK


def test_resolve_is_refused_outside_a_rollback_and_for_a_device_not_stuck() -> None:
    f = _fleet(20)
    first = f.r.order[0]
    assert refusal(f.r, Resolve(f.now, first, "accept")) == (
        "cannot resolve a rollout that is planned"
    )
    f.bad = {f.r.order[2]}
    f.run()
    f.answer()
    assert refusal(f.r, Resolve(f.now, first, "accept")) == (
        "cannot resolve a rollout that is rolled_back"
    )
    g = _fleet(20)
    g.bad = {g.r.order[2]}
    g.run()
    g.silent = {g.r.order[0]}
    g.answer()
    never = g.r.order[-1]
    assert refusal(g.r, Resolve(g.now, never, "accept")) == (
        f"device {never} is pending: only a stuck or reverting device is resolved"
    )
    assert refusal(g.r, Resolve(g.now, "nope", "accept")) == "device 'nope' is not in rollout ro-1"
    assert "not one of retry, assign, accept" in str(
        refusal(g.r, Resolve(g.now, g.r.order[0], "forget"))
    )
    assert refusal(g.r, Resolve(g.now, g.r.order[0], "assign")) is not None


def test_shift_holds_its_line_and_the_devices_are_assigned_after_it() -> None:
    spec = _spec(waves="100%", shifts={"3": ["06:00-14:00"]}, timeouts={"assigning_s": 86_400})
    devices = _devices(4, line="3") + [
        DeviceInfo(f"b-{i}", {"profile": "orin", "line": "4"}, active=OLD) for i in range(2)
    ]
    f = _fleet(devices=devices, spec=spec)
    f.now = T0 + 7 * 3600  # 07:00 UTC, line 3 is producing
    f.tick()
    assert sorted(f.assigns()) == ["b-0", "b-1"]
    f.answer()
    f.tick(6 * 3600 + 59 * 60)  # 13:59
    assert sorted(f.assigns()) == ["b-0", "b-1"]
    assert f.r.phase is Phase.FINISHING
    f.tick(60)  # 14:00: the shift is over
    assert sorted(f.assigns()) == ["b-0", "b-1", "cam-000", "cam-001", "cam-002", "cam-003"]
    f.run()
    assert f.r.phase is Phase.COMPLETED


def test_wave_entirely_in_a_shift_waits_for_it_then_times_out_into_pause() -> None:
    spec = _spec(shifts={"*": ["00:00-24:00"]}, timeouts={"assigning_s": 3600})
    f = _fleet(5, spec)
    f.tick()
    f.tick(3600)
    assert f.r.phase is Phase.PAUSED
    assert "1 held by a shift" not in f.r.reason
    assert "5 held by a shift" in f.r.reason
    assert f.assigns() == []


def test_wave_that_can_assign_nobody_waits_instead_of_passing_empty() -> None:
    f = _fleet(
        devices=_devices(10, offline=range(1, 10)), spec=_spec(timeouts={"assigning_s": 3600})
    )
    assert [w.target for w in f.r.waves] == [1, 2, 5, 10]
    f.run(until=lambda r: r.wave == 1)
    assert f.r.phase is Phase.ASSIGNING
    f.tick(3599)
    assert (f.r.phase, f.r.wave) == (Phase.ASSIGNING, 1)
    f.tick(1)
    assert f.r.phase is Phase.PAUSED
    assert "wave 2 could not assign a device" in f.r.reason
    assert "9 offline" in f.r.reason
    f.send(Resume(f.now))
    f.report("cam-007", active_bundle="det", active_release=1)
    assert f.assigns() == ["cam-000", "cam-007"]
    assert f.r.waves[1].devices == ("cam-007",)


def test_terminal_and_rolling_back_rollouts_refuse_cancel_pause_and_approve() -> None:
    f = _fleet(5)
    f.run()
    assert f.r.phase is Phase.COMPLETED
    for ev in (Cancel(f.now), Pause(f.now), Approve(f.now), Resume(f.now)):
        assert refusal(f.r, ev) is not None
        out = f.send(ev)
        assert [c.kind for c in out if isinstance(c, Notify)] == ["rejected"]
        assert f.r.phase is Phase.COMPLETED
    f.send(Rollback(f.now))
    f.silent = set(f.r.devices)
    assert f.r.phase is Phase.ROLLING_BACK
    for ev in (Cancel(f.now), Pause(f.now), Rollback(f.now)):
        f.send(ev)
        assert f.r.phase is Phase.ROLLING_BACK


def test_cancel_stops_assigning_and_reverts_nothing() -> None:
    f = _fleet(20)
    f.run(until=lambda r: r.wave == 2)
    assigned = len(f.assigns())
    assert assigned == 10
    f.send(Cancel(f.now, reason="wrong bundle"))
    assert f.r.phase is Phase.CANCELLED
    assert f.r.reason == "cancelled: wrong bundle"
    for _ in range(20):
        f.answer()
        f.tick(3600)
    assert len(f.assigns()) == assigned
    assert f.reverts() == []
    assert f.r.deadline is None


def test_operator_rollback_after_completion_reverts_every_assigned_device() -> None:
    f = _fleet(10)
    f.run()
    assert f.r.phase is Phase.COMPLETED
    f.send(Rollback(f.now, reason="customer complaint"))
    assert f.r.phase is Phase.ROLLING_BACK
    assert sorted(f.reverts()) == sorted(f.r.devices)
    f.answer()
    f.tick()
    assert f.r.phase is Phase.ROLLED_BACK
    assert refusal(f.r, Rollback(f.now)) is not None


def test_pause_stops_assignments_and_resume_continues() -> None:
    f = _fleet(20)
    f.run(until=lambda r: r.wave == 1)
    f.send(Pause(f.now, reason="line audit"))
    assert f.r.phase is Phase.PAUSED
    assert f.r.reason == "paused by operator: line audit"
    n = len(f.assigns())
    for _ in range(10):
        f.answer()
        f.tick(3600)
    assert len(f.assigns()) == n
    f.send(Resume(f.now))
    f.run()
    assert f.r.phase is Phase.COMPLETED


def test_stale_failure_of_another_release_does_not_fail_the_device() -> None:
    f = _fleet(10)
    f.tick()
    canary = f.r.order[0]
    f.report(
        canary,
        active_bundle="det",
        active_release=1,
        install=InstallOutcome.FAILED,
        install_bundle="det",
        install_release=1,
        auto_rollback=True,
    )
    assert f.r.devices[canary].status is S.ASSIGNED
    assert f.r.phase is Phase.ASSIGNING
    other = f.r.order[-1]  # runs the target; a later install of release 3 failed
    f.report(
        other,
        active_bundle="det",
        active_release=2,
        install=InstallOutcome.FAILED,
        install_bundle="det",
        install_release=3,
    )
    assert f.r.devices[other].status is S.DONE


def test_event_dated_before_the_last_one_is_taken_as_now() -> None:
    f = _fleet(10)
    f.tick(100)
    f.send(Tick(T0 - 1000))
    assert f.r.clock == T0 + 100
    assert f.r.since <= f.r.clock


def test_step_does_not_change_its_input_and_replays_identically() -> None:
    f = _fleet(20)
    f.bad = {f.r.order[5]}
    f.run()
    f.answer()
    f.tick()
    assert f.r.phase is Phase.ROLLED_BACK
    state = plan("ro-1", _spec(), 2, _devices(20), T0, budget_ms=50.0)
    commands: list[Command] = []
    for ev in f.events:
        before = dumps(state)
        nxt, out = step(state, ev)
        assert dumps(state) == before  # the input is untouched
        state = nxt
        commands += out
    assert dumps(state) == dumps(f.r)
    assert commands == f.cmds


def test_state_survives_a_json_round_trip_mid_rollout() -> None:
    f = _fleet(20, _spec(shifts={"2": ["22:00-06:00"]}, timezone="Europe/Berlin"))
    f.run()
    f.answer()
    f.tick(30)
    again = loads(dumps(f.r))
    assert again == f.r
    assert isinstance(again.phase, Phase)
    assert again.devices[f.r.order[0]].status is S.DONE
    nxt, _ = step(again, Tick(f.now + 600))
    ref, _ = step(f.r, Tick(f.now + 600))
    assert nxt == ref


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("not json", "not JSON"),
        ("[]", "not a rollout document"),
        ('{"format": 9, "rollout": {}}', "format"),
        ('{"format": 1, "rollout": {"rollout_id": "x"}}', "state"),
    ],
)
def test_damaged_stored_state_is_an_error(text: str, words: str) -> None:
    with pytest.raises(RolloutError, match=words):
        loads(text)


def test_damaged_field_in_stored_state_is_named() -> None:
    f = _fleet(3)
    f.tick()
    text = dumps(f.r).replace('"phase":"assigning"', '"phase":"sleeping"')
    with pytest.raises(RolloutError) as info:
        loads(text)
    assert info.value.field == "state.phase"


# -- a tick's reports at once (step_all, what the reconciler does) ----------------------


@dataclass
class BatchFleet(Fleet):
    """Like :class:`Fleet`, but the devices' reports wait for the next tick and are
    applied together by :func:`step_all`, as the reconciler reads them."""

    inbox: list[DeviceReport] = field(default_factory=list)

    def report(self, device_id: str, **kw: Any) -> list[Command]:
        self.inbox.append(DeviceReport(device_id, self.now, **kw))
        return []

    def tick(self, dt: float = 0.0) -> list[Command]:
        self.now += dt
        reports, self.inbox = self.inbox, []
        before = dumps(self.r)
        self.r, out = step_all(self.r, reports, self.now)
        assert dumps(self.r) != before or not out  # commands come with a changed state
        self.cmds += out
        return out


def _batch_fleet(n: int, spec: Any = None) -> BatchFleet:
    return BatchFleet(plan("ro-1", spec or _spec(), 2, _devices(n), T0, budget_ms=50.0))


def test_reports_applied_together_complete_the_same_waves_with_one_directive_each() -> None:
    one, many = _fleet(40), _batch_fleet(40)
    one.run()
    many.run()
    assert one.r.phase is many.r.phase is Phase.COMPLETED
    assert [w.devices for w in many.r.waves] == [w.devices for w in one.r.waves]
    assert many.assigns() == one.assigns() == list(many.r.order)  # each once, in order
    assert many.r.count(S.DONE) == 40


def test_a_bad_device_among_a_ticks_reports_fails_its_wave_and_reverts_it() -> None:
    f = _batch_fleet(40)
    wave2 = f.r.order[1:4]
    f.bad = {wave2[1]}
    f.run()
    assert f.r.phase is Phase.ROLLING_BACK
    assert "gate failed in wave 2" in f.r.reason
    assert sorted(f.reverts()) == sorted([f.r.order[0], *wave2])
    assert len(f.assigns()) == 4  # nothing of wave 3 was assigned
    f.answer()
    f.tick()
    assert f.r.phase is Phase.ROLLED_BACK


def test_step_all_leaves_its_input_alone_and_equals_stepping_then_a_tick_for_one_report() -> None:
    f = _fleet(10)
    f.tick()
    (device,) = f.assigns()
    report = DeviceReport(device, f.now + 5, active_bundle="det", active_release=1,
                          install=InstallOutcome.RUNNING, install_bundle="det",
                          install_release=2)  # fmt: skip
    before = dumps(f.r)
    batched, out = step_all(f.r, [report], f.now + 5)
    assert dumps(f.r) == before
    stepped, first = step(f.r, report)
    stepped, second = step(stepped, Tick(f.now + 5))
    assert batched == stepped
    assert out == first + second
    assert batched.devices[device].status is S.INSTALLING


def test_outstanding_names_the_unanswered_assigns_and_reverts_as_first_sent() -> None:
    f = _fleet(40)
    wave2 = f.r.order[1:4]
    f.silent = {wave2[0]}
    f.run(until=lambda r: r.wave == 1 and len(r.waves[1].devices) == 3)
    f.answer()
    first = [c for c in f.cmds if isinstance(c, AssignDirective) and c.device_id == wave2[0]]
    assert len(first) == 1
    assert outstanding(f.r) == first  # the silent one, exactly as it was told

    g = _fleet(40)
    g.bad = {wave2[1]}
    g.run()
    assert g.r.phase is Phase.ROLLING_BACK
    waiting = [d for d in g.r.order if g.r.devices[d].status is S.REVERTING]
    assert waiting  # reverts not confirmed yet
    again = outstanding(g.r)
    assert again == [c for c in g.cmds if isinstance(c, RevertDirective) and c.device_id in waiting]


# -- random event sequences -----------------------------------------------------------

WAVES = ["100%", "1,100%", "1,10%,50%,100%", "2,5,25%,100%", "1,2,3,100%", "50%,100%"]
SHIFTS: list[dict[str, list[str]]] = [
    {},
    {"a": ["06:00-14:00"]},
    {"b": ["22:00-06:00"], "a": ["10:00-12:00"]},
    {"*": ["12:00-13:00"]},
]


def _random_rollout(rng: random.Random, finishing_s: int | None = None) -> Rollout:
    policy = {
        "approval_between_waves": rng.random() < 0.3,
        "rollback_done_waves_on_failure": rng.random() < 0.5,
        "shifts": rng.choice(SHIFTS),
        "gates": {
            "max_install_failures": rng.choice([0, 0, 1, 3]),
            "max_auto_rollbacks": rng.choice([0, 1]),
            "max_worker_crashes": rng.choice([0, 5]),
            "max_outcome_tvd": rng.choice([None, 0.1, 0.3]),
            "min_outcome_samples": 100,
        },
        "timeouts": {
            key: rng.choice([600, 3600, 7200])
            for key in ("assigning_s", "awaiting_approval_s", "finishing_s", "rolling_back_s")
        }
        | {"paused_s": rng.choice([3600, 86_400])},
    }
    if finishing_s is not None:
        policy["timeouts"]["finishing_s"] = finishing_s  # type: ignore[index]
    spec = _spec(rng.choice(WAVES), rng.choice(["0s", "90s", "10m", "30m"]), **policy)
    devices = []
    for i in range(rng.randint(1, 25)):
        active = rng.choices([OLD, NEW, None], weights=[85, 10, 5])[0]
        labels = {"profile": "orin", "line": rng.choice("abc")}
        devices.append(DeviceInfo(f"d{i:02d}", labels, rng.random() < 0.8, active, 20.0, BASE))
    start = T0 + rng.randrange(0, 86_400, 60)
    return plan(f"ro-{rng.random()}", spec, 2, devices, start, budget_ms=50.0)


KINDS = ["offline", "old", "running", "good", "bad", "stale", "sideload"]


def _random_report(  # noqa: PLR0911 (one return per kind of report)
    rng: random.Random, device_id: str, now: float, bad: float, answer: bool = False
) -> DeviceReport:
    """A random report; an ``answer`` to a directive is mostly an install's end."""
    about: dict[str, Any] = {"install_bundle": "det", "install_release": 2}
    weights = [2, 2, 5, 90, 100 * bad, 2, 2] if answer else [10, 10, 10, 40, 100 * bad, 5, 5]
    kind = rng.choices(KINDS, weights=weights)[0]
    if kind == "offline":
        return DeviceReport(device_id, now, online=False)
    if kind == "old":
        return DeviceReport(
            device_id, now, active_bundle="det", active_release=1, p99_ms=20.0, outcome_counts=BASE
        )
    if kind == "running":
        return DeviceReport(
            device_id,
            now,
            active_bundle="det",
            active_release=1,
            install=InstallOutcome.RUNNING,
            **about,
        )
    if kind == "good":
        sick = rng.random() < bad
        return DeviceReport(
            device_id,
            now,
            active_bundle="det",
            active_release=2,
            install=InstallOutcome.COMMITTED,
            p99_ms=rng.choice([20.0, 22.0, 70.0]) if sick else 21.0,
            outcome_counts={"pass": 500, "reject": 500} if sick else BASE,
            worker_crashes=rng.choice([0, 1]) if sick else 0,
            **about,
        )
    if kind == "bad":
        return DeviceReport(
            device_id,
            now,
            active_bundle="det",
            active_release=1,
            install=InstallOutcome.FAILED,
            auto_rollback=rng.random() < 0.5,
            **about,
        )
    if kind == "stale":
        return DeviceReport(
            device_id,
            now,
            active_bundle="det",
            active_release=1,
            install=InstallOutcome.FAILED,
            install_bundle="det",
            install_release=1,
            auto_rollback=True,
        )
    return DeviceReport(device_id, now, active_bundle="det", active_release=2)


def _random_event(
    rng: random.Random, r: Rollout, now: float, waiting: list[str], bad: float, ops: float
) -> Event:
    roll = rng.random()
    if roll < 0.35 and waiting:
        device_id = waiting.pop(rng.randrange(len(waiting)))
        report = _random_report(rng, device_id, now, bad, answer=True)
        if report.install_release != 2 or report.install is InstallOutcome.RUNNING:
            waiting.append(device_id)  # not an answer yet: it will report again
        return report
    if roll < 0.6:
        return _random_report(rng, rng.choice(r.order), now, bad)
    if roll < 1 - ops:
        return Tick(now)
    choices: list[Event] = [
        Approve(now),
        Approve(now),
        Pause(now),
        Resume(now),
        Resume(now),
        Cancel(now),
        Rollback(now),
    ]
    return rng.choice(choices)


def _in_shift(r: Rollout, device_id: str, now: float) -> bool:
    """Independent of the machine: whole-hour UTC ranges only (as in SHIFTS)."""
    line = r.devices[device_id].labels.get("line", "")
    hour = datetime.fromtimestamp(now, timezone.utc).hour
    for text in [*r.spec.policy.shifts.get(line, []), *r.spec.policy.shifts.get("*", [])]:
        start, end = int(text[:2]), int(text[6:8])
        if (start <= hour < end) if start < end else (hour >= start or hour < end):
            return True
    return False


@dataclass
class Watch:
    """What the invariants need to remember across steps."""

    assigns: dict[str, int] = field(default_factory=dict)
    reverts: dict[str, int] = field(default_factory=dict)
    failure_reported: set[str] = field(default_factory=set)
    closed: bool = False


def _check(old: Rollout, ev: Event, new: Rollout, out: list[Command], w: Watch) -> None:
    now = new.clock
    policy = new.spec.policy
    if (
        isinstance(ev, DeviceReport)
        and ev.install is InstallOutcome.FAILED
        and (ev.install_release == 2)
    ):
        w.failure_reported.add(ev.device_id)
    if isinstance(ev, DeviceReport) and ev.auto_rollback and ev.install_release == 2:
        w.failure_reported.add(ev.device_id)
    for cmd in out:
        if isinstance(cmd, AssignDirective):
            d = new.devices[cmd.device_id]
            assert not w.closed, "assigned after cancel, completion or rollback"
            assert w.assigns.get(cmd.device_id, 0) == 0, "a second directive to one device"
            assert w.reverts.get(cmd.device_id, 0) == 0
            assert old.devices[cmd.device_id].status in (S.PENDING, S.OFFLINE)
            assert d.online
            assert not _in_shift(new, cmd.device_id, now), "assigned during its line's shift"
            assert (cmd.bundle, cmd.release) == ("det", 2)
            w.assigns[cmd.device_id] = 1
        elif isinstance(cmd, RevertDirective):
            assert w.assigns.get(cmd.device_id) == 1, "reverting a device never assigned"
            assert w.reverts.get(cmd.device_id, 0) == 0
            w.reverts[cmd.device_id] = 1
    if new.waves:
        holding = sum(1 for d in new.devices.values() if d.wave is not None and not d.waived)
        assert holding <= new.waves[new.wave].target, "assigned beyond the current wave"
    assert new.wave >= old.wave
    if new.wave > old.wave and policy.approval_between_waves:
        assert isinstance(ev, Approve), "next wave started without approval"
    for device_id, d in new.devices.items():
        if d.status is S.FAILED:
            assert device_id in w.failure_reported, "failed without a failure report"
    if isinstance(ev, DeviceReport) and ev.device_id in new.devices:
        before = old.devices[ev.device_id].status
        committed = ev.install in (None, InstallOutcome.COMMITTED) or ev.install_release != 2
        if (
            ev.active_release == 2
            and committed
            and before in (S.PENDING, S.OFFLINE, S.ASSIGNED, S.INSTALLING)
        ):
            assert new.devices[ev.device_id].status in (S.DONE, S.REVERTING, S.STUCK)
        if ev.online is False and before is not S.FAILED:
            assert new.devices[ev.device_id].status is not S.FAILED
    if new.phase is Phase.ROLLING_BACK:
        # its deadline is the first reverting device's; none while only stuck ones wait
        reverting = [d for d in new.devices.values() if d.status is S.REVERTING]
        assert new.deadline == min((d.deadline for d in reverting if d.deadline), default=None)
        assert all(d.why for d in new.devices.values() if d.status is S.STUCK)
    else:
        assert (new.deadline is None) == (new.phase in TERMINAL)
    if new.phase is Phase.COMPLETED and old.phase is not Phase.COMPLETED:
        assert all(d.status is S.DONE for d in new.devices.values())
    if any(isinstance(c, Notify) and c.kind == "gate_failed" for c in out):
        if policy.rollback_done_waves_on_failure:
            assert new.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK)
            for d in new.devices.values():
                if d.wave is not None:
                    assert d.status not in (S.ASSIGNED, S.INSTALLING, S.DONE, S.FAILED)
                    # each is sent its revert, or stuck: it has nothing to go back to
                    sent = w.reverts.get(d.device_id) == 1
                    assert sent or (d.status is S.STUCK and d.previous is None)
        else:
            assert new.phase is Phase.PAUSED
    if new.phase in TERMINAL or new.phase is Phase.ROLLING_BACK:
        w.closed = True


def _leaves_on_timeout(r: Rollout) -> None:
    """From ``r``, ticking at each deadline changes the phase every time (while rolling
    back: makes the reverting devices due stuck), and reaches a terminal phase within a
    bound, with no device reporting anything; a rollback whose reverts are all stuck
    waits for an operator, and ends once each stuck device is accepted."""
    for _ in range(4 * len(r.waves) + 8 + len(r.devices)):
        if r.phase in TERMINAL:
            return
        if r.phase is Phase.ROLLING_BACK and r.deadline is None:
            stuck = [d for d in r.order if r.devices[d].status is S.STUCK]
            assert stuck, "rolling back with nothing to wait for"
            assert all(r.devices[d].why for d in stuck)
            for device_id in stuck:
                r, _ = step(r, Resolve(r.clock, device_id, "accept", by="test"))
            continue
        assert r.deadline is not None
        nxt, _ = step(r, Tick(max(r.deadline, r.clock)))
        if r.phase is Phase.ROLLING_BACK:
            assert nxt.count(S.REVERTING) < r.count(S.REVERTING), "a due revert not stuck"
        else:
            assert (nxt.phase, nxt.wave, nxt.since) != (r.phase, r.wave, r.since), r.phase
        r = nxt
    raise AssertionError(f"still {r.phase} after ticking through every timeout")


@pytest.mark.parametrize("seed", range(8))
def test_random_event_sequences_keep_every_invariant(seed: int) -> None:
    rng = random.Random(seed)
    phases: set[Phase] = set()
    for _ in range(25):
        r = _random_rollout(rng)
        w = Watch()
        now = r.created_at
        waiting: list[str] = []
        bad, ops = rng.choice([0.0, 0.02, 0.3]), rng.choice([0.0, 0.01, 0.05])
        for i in range(250):
            now += rng.choices([0, 1, 30, 120, 600, 3600, 4 * 3600], [5, 5, 20, 30, 30, 5, 2])[0]
            ev = _random_event(rng, r, now, waiting, bad, ops)
            frozen = dumps(r) if i % 10 == 0 else ""
            new, out = step(r, ev)
            if frozen:
                assert dumps(r) == frozen, "step changed its input"
                assert loads(dumps(new)) == new
            _check(r, ev, new, out, w)
            waiting += [
                c.device_id for c in out if isinstance(c, AssignDirective | RevertDirective)
            ]
            if i % 25 == 0:
                _leaves_on_timeout(new)
            r = new
        _leaves_on_timeout(r)
        phases |= {t.phase for t in r.history}
    assert len(phases) >= 9, phases  # the sequences reach (nearly) every phase


@pytest.mark.parametrize("seed", range(4))
def test_cooperative_fleets_complete_once_every_device_is_back_and_shifts_end(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for _ in range(20):
        f = Fleet(_random_rollout(rng, finishing_s=86_400))
        f.now = f.r.created_at
        for _ in range(400):
            f.run(dt=rng.choice([60.0, 600.0, 3600.0]), limit=200)
            away = [d for d in f.r.order if not f.r.devices[d].online]
            if away and rng.random() < 0.3:  # an offline device comes back
                f.report(rng.choice(away), active_bundle="det", active_release=1)
            if f.r.phase is Phase.AWAITING_APPROVAL:
                f.send(Approve(f.now))
            elif f.r.phase is Phase.PAUSED:
                f.send(Resume(f.now))
            elif f.r.phase is Phase.FINISHING:
                f.tick(3600)
            if f.r.phase in TERMINAL:
                break
        assert f.r.phase is Phase.COMPLETED, (f.r.phase, f.r.reason)
        assert all(s.status is S.DONE for s in f.r.devices.values())
        assert len(f.assigns()) == len(set(f.assigns()))
