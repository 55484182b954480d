"""The rollout controller's core: a pure state machine (no I/O, no clock).

:func:`fleet_server.rollout.plan.plan` builds a rollout; :func:`step` takes a rollout
and one event and returns the next rollout and the commands for the I/O shell. The input
is never modified; the same events give the same states and commands. The phases,
events, timeouts and next states are tabled in docs/rollouts.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from fleet_server.rollout import gates
from fleet_server.rollout.events import (
    MODE_ACTIVE,
    MODE_SHADOW,
    RESOLUTIONS,
    RESOLVE_ACCEPT,
    RESOLVE_ASSIGN,
    RESOLVE_RETRY,
    Approve,
    AssignDirective,
    Cancel,
    Command,
    DeviceReport,
    Event,
    LabelReport,
    Notify,
    Operator,
    Pause,
    Resolve,
    Resume,
    RevertDirective,
    RevertRefused,
    Rollback,
    Tick,
)
from fleet_server.rollout.reports import apply_report, revert_target
from fleet_server.rollout.shadowgate import ShadowSample, evaluate_shadow
from fleet_server.rollout.spec import ALL
from fleet_server.rollout.state import (
    ACTIVE,
    HISTORY,
    REVERT_OPEN,
    SHADOW,
    TERMINAL,
    UNASSIGNED,
    UNSETTLED,
    BundleRef,
    DeviceState,
    Phase,
    Rollout,
    Transition,
)
from fleet_server.rollout.state import DeviceStatus as S
from fleet_server.rollout.windows import in_ranges

MAX_PASSES = 64
"""Bound on phase changes computed for one event (each wave takes at most three)."""


def step(rollout: Rollout, event: Event) -> tuple[Rollout, list[Command]]:
    """The rollout after ``event``, and the commands to carry out (in order)."""
    run = _Run(rollout, max(event.now, rollout.clock))
    if isinstance(event, DeviceReport):
        run.report(event)
    elif isinstance(event, LabelReport):
        run.r = replace(run.r, labels=event.counts)
    elif isinstance(event, RevertRefused):
        run.revert_refused(event)
    elif not isinstance(event, Tick):
        run.operator(event)
    run.advance()
    return run.result()


def step_all(
    rollout: Rollout, reports: Iterable[DeviceReport | LabelReport], now: float
) -> tuple[Rollout, list[Command]]:
    """The rollout after every report and then a :class:`Tick` at ``now``, with the phases
    advanced once, after the last report: what the reconciler does each tick.

    Stepping report by report would compute the gates over every device after each one
    (quadratic in the rollout's size: minutes per tick at 10,000 devices); the reports
    are facts about devices, read at the same instant, so the phases are advanced once
    they are all in, with every fact known.
    """
    run = _Run(rollout, max(now, rollout.clock))
    for event in reports:
        if isinstance(event, DeviceReport):
            run.report(event)
        else:
            run.r = replace(run.r, labels=event.counts)
    run.advance()
    return run.result()


def outstanding(rollout: Rollout) -> list[Command]:
    """The directives the stored state says were sent and not yet answered: an assign to
    each device still ``assigned`` or ``shadow-assigned``, a revert to each ``reverting``
    one, in the rollout's order.

    A leader can save a step and lose its lease (or die) before it publishes the step's
    directives; the next term sends these once again so that none is lost. Each is the
    directive the device was already told (same bundle, release and mode): a device that
    got it the first time reports ``noop``.
    """
    target, out = rollout.target, list[Command]()
    for device_id in rollout.order:
        d = rollout.devices[device_id]
        if d.status is S.ASSIGNED:
            out.append(AssignDirective(device_id, target.name, target.release, MODE_ACTIVE))
        elif d.status is S.SHADOW_ASSIGNED:
            out.append(AssignDirective(device_id, target.name, target.release, MODE_SHADOW))
        elif d.status is S.REVERTING:
            out.append(_revert_directive(d))
    return out


def _revert_directive(d: DeviceState) -> RevertDirective:
    back = d.previous if d.shadow_only else revert_target(d)
    return RevertDirective(
        d.device_id, back.name if back else None, back.release if back else None, d.shadow_only
    )


def refusal(rollout: Rollout, event: Operator) -> str | None:
    """Why ``event`` does not apply in the rollout's phase (None when it does)."""
    phase = rollout.phase
    ok = {
        Approve: phase is Phase.AWAITING_APPROVAL,
        Pause: phase is Phase.PLANNED or phase in ACTIVE,
        Resume: phase is Phase.PAUSED,
        Cancel: phase not in TERMINAL and phase is not Phase.ROLLING_BACK,
        Rollback: phase not in (Phase.ROLLING_BACK, Phase.ROLLED_BACK),
        Resolve: phase is Phase.ROLLING_BACK,
    }[type(event)]
    if not ok:
        return f"cannot {type(event).__name__.lower()} a rollout that is {phase.value}"
    return _resolve_refusal(rollout, event) if isinstance(event, Resolve) else None


def _resolve_refusal(rollout: Rollout, event: Resolve) -> str | None:
    d = rollout.devices.get(event.device_id)
    if d is None:
        return f"device {event.device_id!r} is not in rollout {rollout.rollout_id}"
    if d.status not in REVERT_OPEN:
        return (
            f"device {event.device_id} is {d.status.value}: only a stuck or reverting "
            "device is resolved"
        )
    if event.how not in RESOLUTIONS:
        return f"{event.how!r} is not one of {', '.join(RESOLUTIONS)}"
    if event.how == RESOLVE_ASSIGN and (event.release is None or event.release < 0):
        return "assign needs the release to send the device to (a number, 0 or more)"
    if event.how == RESOLVE_RETRY and revert_target(d) is None and not d.shadow_only:
        return (
            f"device {event.device_id} has no bundle to return to: assign a release, or "
            "accept it as it is"
        )
    return None


class _Run:
    """One step's working copy: the devices and waves are copied once and mutated here."""

    def __init__(self, rollout: Rollout, now: float) -> None:
        self.r = replace(rollout, clock=now)
        self.now = now
        self.devices = dict(rollout.devices)
        self.waves = list(rollout.waves)
        self.cmds: list[Command] = []
        self._shift: dict[str, bool] = {}
        self.by = ""
        """The operator whose event this step applies (kept on its notes)."""

    def result(self) -> tuple[Rollout, list[Command]]:
        return replace(self.r, devices=self.devices, waves=tuple(self.waves)), self.cmds

    # -- events ---------------------------------------------------------------------

    def report(self, ev: DeviceReport) -> None:
        device = self.devices.get(ev.device_id)
        if device is None:
            self.r = replace(self.r, ignored_reports=self.r.ignored_reports + 1)
            return
        self.devices[ev.device_id] = apply_report(
            device, ev, self.r.target, self.now, self.r.spec.version
        )

    def operator(self, ev: Operator) -> None:
        self.by = ev.by
        why = refusal(self.r, ev)
        if why is not None:
            self.notify("rejected", why)
            return
        if isinstance(ev, Approve):
            by = f" by {ev.by}" if ev.by else ""
            self.next_wave(f"wave {self.r.wave + 2} approved{by}")  # the wave it starts
        elif isinstance(ev, Pause):
            self.pause(f"paused by operator{': ' + ev.reason if ev.reason else ''}")
        elif isinstance(ev, Resume):
            self.resume()
        elif isinstance(ev, Cancel):
            self.enter(Phase.CANCELLED, f"cancelled{': ' + ev.reason if ev.reason else ''}")
        elif isinstance(ev, Resolve):
            self.resolve(ev)
        else:
            by = f" ({ev.by})" if ev.by else ""
            self.rollback(f"rollback by operator{by}{': ' + ev.reason if ev.reason else ''}")

    def resolve(self, ev: Resolve) -> None:
        d = self.devices[ev.device_id]
        by = ev.by or "an operator"
        note = f": {ev.reason}" if ev.reason else ""
        if ev.how == RESOLVE_ACCEPT:
            runs = f"{d.active.name} release {d.active.release}" if d.active else "no bundle"
            why = f"accepted as it is ({runs}) by {by}{note}"
            self.devices[ev.device_id] = replace(
                d, status=S.ACCEPTED, settled_at=self.now, deadline=None, why=why
            )
            self.notify("resolved", f"{ev.device_id}: {why}", by=ev.by)
            return
        if ev.how == RESOLVE_ASSIGN:
            assert ev.release is not None  # noqa: S101 - refusal() checked it
            d = replace(d, revert_to=BundleRef(self.r.target.name, ev.release), shadow_only=False)
        self.devices[ev.device_id] = d = self.revert(d)
        back = d.previous if d.shadow_only else revert_target(d)
        to = f"{back.name} release {back.release}" if back else "its own bundle"
        self.notify("resolved", f"{ev.device_id}: {ev.how} by {by}: revert to {to}{note}", by=ev.by)

    def revert_refused(self, ev: RevertRefused) -> None:
        d = self.devices.get(ev.device_id)
        if d is None or d.status is not S.REVERTING:
            return
        self.stuck(d, f"the revert could not be sent: {ev.reason}")

    def stuck(self, d: DeviceState, why: str) -> None:
        self.devices[d.device_id] = replace(d, status=S.STUCK, deadline=None, why=why)
        self.notify("device_stuck", f"{d.device_id}: {why}")

    def revert(self, d: DeviceState) -> DeviceState:
        """``d`` reverting now (its directive sent), or stuck when there is nothing to
        return it to."""
        shadow_only = d.shadow_only or d.status in SHADOW
        d = replace(d, shadow_only=shadow_only, settled_at=None, why="")
        if not shadow_only and revert_target(d) is None:
            why = (
                "no bundle to return to: it reported none before the rollout "
                "(assign a release, or accept it as it is)"
            )
            self.notify("device_stuck", f"{d.device_id}: {why}")
            return replace(d, status=S.STUCK, deadline=None, why=why)
        d = replace(
            d,
            status=S.REVERTING,
            reverted_at=self.now,
            deadline=self.now + self.r.spec.policy.timeouts.rolling_back_s,
        )
        self.cmds.append(_revert_directive(d))
        return d

    def resume(self) -> None:
        for device_id in self.r.failed_devices:
            d = self.devices.get(device_id)
            if d is not None:
                self.devices[device_id] = replace(d, waived=True)
        self.r = replace(self.r, failed_devices=())
        self.enter(self.r.resume_to or Phase.ASSIGNING, "resumed by operator")

    # -- phases ---------------------------------------------------------------------

    def enter(self, phase: Phase, reason: str) -> None:
        t = self.r.spec.policy.timeouts
        wait = {
            Phase.PLANNED: 0,
            Phase.ASSIGNING: t.assigning_s,
            Phase.SHADOW: self.r.spec.shadow_s,
            Phase.SOAKING: self.r.spec.soak_s,
            Phase.AWAITING_APPROVAL: t.awaiting_approval_s,
            Phase.FINISHING: t.finishing_s,
            Phase.PAUSED: t.paused_s,
            Phase.ROLLING_BACK: t.rolling_back_s,
        }.get(phase)
        history = (*self.r.history, Transition(self.now, phase, self.r.wave + 1, reason))
        self.r = replace(
            self.r,
            phase=phase,
            since=self.now,
            deadline=None if wait is None else self.now + wait,
            reason=reason,
            history=history[-HISTORY:],
        )
        self.notify("phase", reason)

    def notify(self, kind: str, message: str, *, by: str = "") -> None:
        by = by or self.by
        self.cmds.append(Notify(kind, self.r.phase.value, self.r.wave + 1, message, by))

    def pause(self, reason: str) -> None:
        self.r = replace(self.r, resume_to=self.r.phase)
        self.enter(Phase.PAUSED, reason)

    def next_wave(self, reason: str) -> None:
        self.r = replace(self.r, wave=self.r.wave + 1)
        self.waves[self.r.wave] = replace(self.waves[self.r.wave], started_at=self.now)
        self.enter(Phase.ASSIGNING, reason)

    def rollback(self, reason: str) -> None:
        for device_id in self.r.order:
            d = self.devices[device_id]
            if d.wave is None or d.status not in (*UNSETTLED, *SHADOW, S.DONE, S.FAILED):
                continue
            self.devices[device_id] = self.revert(d)
        self.enter(Phase.ROLLING_BACK, reason)
        self.revert_deadline()

    def revert_deadline(self) -> None:
        """While rolling back, the phase's deadline is the first reverting device's."""
        deadlines = [
            d.deadline
            for d in self.devices.values()
            if d.status is S.REVERTING and d.deadline is not None
        ]
        self.r = replace(self.r, deadline=min(deadlines, default=None))

    def advance(self) -> None:
        for _ in range(MAX_PASSES):
            before = (self.r.phase, self.r.wave, self.r.since)
            self.advance_once()
            if (self.r.phase, self.r.wave, self.r.since) == before:
                return

    def advance_once(self) -> None:
        r, now = self.r, self.now
        due = r.deadline is not None and now >= r.deadline
        if r.phase is Phase.PLANNED:
            if not self.waves:
                self.enter(Phase.COMPLETED, "every selected device already runs the target")
            else:
                self.waves[0] = replace(self.waves[0], started_at=now)
                self.enter(Phase.ASSIGNING, "started")
        elif r.phase is Phase.PAUSED and due:
            limit = r.spec.policy.timeouts.paused_s
            self.enter(Phase.CANCELLED, f"cancelled: paused longer than {limit} s")
        elif r.phase is Phase.ROLLING_BACK:
            self.rolling_back()
        elif r.phase in ACTIVE:
            self.active(due)

    def rolling_back(self) -> None:
        """Each reverting device past its deadline is stuck (with the reason); the
        rollout is rolled back once no revert is open (reverting or stuck)."""
        r, now = self.r, self.now
        limit = r.spec.policy.timeouts.rolling_back_s
        for device_id in r.order:
            d = self.devices[device_id]
            if d.status is S.REVERTING and d.deadline is not None and now >= d.deadline:
                back = d.previous if d.shadow_only else revert_target(d)
                to = f"{back.name} release {back.release}" if back else "its own bundle"
                self.stuck(d, f"timeout: no revert to {to} confirmed within {limit} s")
        self.revert_deadline()
        if any(self.devices[d].status in REVERT_OPEN for d in r.order):
            return
        accepted = [d for d in r.order if self.devices[d].status is S.ACCEPTED]
        # the cause stays first in the reason: the operator reads why, not just how
        end = "every reverted device runs its previous bundle"
        if accepted:
            end = (
                "the other reverted devices run their previous bundle; accepted as they "
                f"are: {_ids(accepted)}"
            )
        self.enter(Phase.ROLLED_BACK, f"{r.reason}; {end}")

    def active(self, due: bool) -> None:
        r, now = self.r, self.now
        failing = isinstance(self.verdict(soak_over=False), gates.GateFail)
        if r.phase is not Phase.SHADOW and not failing:
            self.fill()  # a gate that fails already assigns nobody more
        wave = self.waves[r.wave]
        last = r.wave == len(self.waves) - 1
        verdict = self.verdict(soak_over=r.phase is Phase.SOAKING and due)
        self.r = replace(self.r, gate=verdict.metrics | wave.shadow)
        if isinstance(verdict, gates.GateFail):
            self.fail(verdict)
            return
        if self.shadow_phase(due):
            return
        mine = [self.devices[d] for d in r.order if self.devices[d].wave is not None]
        unsettled = [d.device_id for d in mine if d.status in UNSETTLED]
        evidence = any(d.status is S.DONE for d in mine)
        pending = [d for d in self.devices.values() if d.status in UNASSIGNED]
        if unsettled or not evidence:
            if r.phase is not Phase.ASSIGNING:
                why = f"{len(unsettled)} devices installing" if unsettled else "no device done"
                self.enter(Phase.ASSIGNING, why)
            elif due:
                self.pause(self.assign_timeout(unsettled, pending))
        elif r.phase is Phase.ASSIGNING:
            if wave.devices or not pending or last:
                self.enter(Phase.SOAKING, f"all {len(mine)} assigned devices settled")
            elif due:
                self.pause(self.assign_timeout(unsettled, pending))
        elif r.phase is Phase.SOAKING and due and isinstance(verdict, gates.GatePass):
            self.waves[r.wave] = replace(wave, passed_at=now, metrics=verdict.metrics | wave.shadow)
            if last:
                self.finish(pending)
            elif r.spec.policy.approval_between_waves:
                self.enter(Phase.AWAITING_APPROVAL, f"wave {r.wave + 1} passed; approve the next")
            else:
                self.next_wave(f"wave {r.wave + 1} passed")
        elif r.phase is Phase.AWAITING_APPROVAL and due:
            self.pause("timeout: no approval for the next wave")
        elif r.phase is Phase.FINISHING and (due or not pending):
            self.finish(pending if not due else [])

    def finish(self, pending: list[DeviceState]) -> None:
        if pending:
            self.enter(Phase.FINISHING, f"last wave passed; {len(pending)} devices pending")
            return
        done = all(d.status is S.DONE for d in self.devices.values())
        if done:
            self.enter(Phase.COMPLETED, "every selected device runs the target")
        else:
            left = [d for d in self.r.order if self.devices[d].status is not S.DONE]
            self.enter(Phase.COMPLETED_PARTIAL, f"not done: {_ids(left)}")

    def verdict(self, *, soak_over: bool) -> gates.GateResult:
        """The health and accuracy gates over every device assigned so far."""
        r = self.r
        return gates.evaluate(
            r.spec.policy.gates, self.samples(), r.budget_ms, soak_over=soak_over, labels=r.labels
        )

    def shadow_phase(self, due: bool) -> bool:
        """The wave's shadow phase: wait for its devices to run the target as shadow, then
        judge the pooled agreement; on a pass, switch them (``assigned``). True while the
        wave is in it (the rest of :meth:`active` is for switched devices)."""
        r = self.r
        wave = self.waves[r.wave]
        mine = [self.devices[i] for i in wave.devices if i in self.devices]
        waiting = [d.device_id for d in mine if d.status is S.SHADOW_ASSIGNED]
        shadowing = [d for d in mine if d.status is S.SHADOWING]
        if not waiting and not shadowing:
            return False
        if waiting:
            if r.phase is not Phase.ASSIGNING:
                self.enter(Phase.ASSIGNING, f"{len(waiting)} devices installing the shadow")
            elif due:
                self.pause(
                    f"timeout: wave {r.wave + 1} devices did not report the shadow running: "
                    f"{_ids(waiting)}"
                )
            return True
        if r.phase is not Phase.SHADOW:
            self.enter(Phase.SHADOW, f"{len(shadowing)} devices run the target as shadow")
            return True
        samples = [
            ShadowSample(d.device_id, d.shadow_n, d.shadow_agree, d.shadow_p99_ms)
            for d in shadowing
        ]
        verdict = evaluate_shadow(r.spec, samples, r.budget_ms, over=due)
        self.waves[r.wave] = wave = replace(wave, shadow=verdict.metrics)
        self.r = replace(self.r, gate=self.r.gate | verdict.metrics)
        if isinstance(verdict, gates.GateFail):
            self.fail(verdict)
        elif isinstance(verdict, gates.GatePass):
            for d in shadowing:
                self.devices[d.device_id] = replace(d, status=S.ASSIGNED, assigned_at=self.now)
                self.cmds.append(
                    AssignDirective(d.device_id, r.target.name, r.target.release, MODE_ACTIVE)
                )
            self.waves[r.wave] = replace(wave, shadow_passed_at=self.now)
            n, agreement = verdict.metrics["shadow_n"], verdict.metrics["shadow_agreement"]
            lower = verdict.metrics["shadow_lower"]
            self.enter(
                Phase.ASSIGNING,
                f"wave {r.wave + 1} shadow passed: agreement {agreement} "
                f"(lower bound {lower}, n={n}); switching {len(shadowing)} devices",
            )
        return True

    def fail(self, verdict: gates.GateFail) -> None:
        wave = self.r.wave + 1
        self.r = replace(self.r, failed_devices=verdict.devices)
        self.notify("gate_failed", f"wave {wave}: {verdict.reason}")
        reason = f"gate failed in wave {wave}: {verdict.reason}"
        if self.r.spec.policy.rollback_done_waves_on_failure:
            self.rollback(reason)
        else:
            self.pause(reason)

    def assign_timeout(self, unsettled: list[str], pending: list[DeviceState]) -> str:
        wave = self.r.wave + 1
        if unsettled:
            return f"timeout: wave {wave} devices did not report done: {_ids(unsettled)}"
        offline = sum(1 for d in pending if not d.online)
        held = sum(1 for d in pending if d.online and self.in_shift(d))
        return (
            f"timeout: wave {wave} could not assign a device or see one done "
            f"({offline} offline, {held} held by a shift)"
        )

    # -- devices --------------------------------------------------------------------

    def fill(self) -> None:
        """Assign pending, online devices outside a shift, in order, up to the wave's target.
        A failure the operator waived does not hold a place: another device takes it, so
        a wave whose canary was waived still gets a device done as evidence."""
        wave = self.waves[self.r.wave]
        taken = sum(1 for d in self.devices.values() if d.wave is not None and not d.waived)
        room = wave.target - taken
        shadow = self.r.spec.shadow_s > 0 and wave.shadow_passed_at is None
        status, mode = (S.SHADOW_ASSIGNED, MODE_SHADOW) if shadow else (S.ASSIGNED, MODE_ACTIVE)
        added: list[str] = []
        for device_id in self.r.order:
            if room <= 0:
                break
            d = self.devices[device_id]
            if d.status is not S.PENDING or not d.online or self.in_shift(d):
                continue
            self.devices[device_id] = replace(
                d, status=status, wave=self.r.wave, assigned_at=self.now
            )
            target = self.r.target
            self.cmds.append(AssignDirective(device_id, target.name, target.release, mode))
            added.append(device_id)
            room -= 1
        if added:
            self.waves[self.r.wave] = replace(wave, devices=(*wave.devices, *added))

    def in_shift(self, device: DeviceState) -> bool:
        line = device.labels.get("line", "")
        if line not in self._shift:
            policy = self.r.spec.policy
            ranges = [*policy.shifts.get(line, []), *policy.shifts.get(ALL, [])]
            self._shift[line] = in_ranges(ranges, self.now, policy.timezone)
        return self._shift[line]

    def samples(self) -> list[gates.DeviceSample]:
        out = []
        for device_id in self.r.order:
            d = self.devices[device_id]
            if d.wave is None or d.status in SHADOW:
                continue  # a shadowing device runs its own bundle: the shadow gate's
            settled = d.status not in UNSETTLED
            if d.waived:
                out.append(gates.DeviceSample(device_id, settled, d.status is S.DONE))
                continue
            out.append(
                gates.DeviceSample(
                    device_id=device_id,
                    settled=settled,
                    done=d.status is S.DONE,
                    install_failed=d.install_failed,
                    auto_rollback=d.auto_rollback,
                    worker_crashes=d.worker_crashes,
                    p99_ms=d.p99_ms,
                    outcomes=d.outcomes,
                    base_p99_ms=d.base_p99_ms,
                    base_outcomes=d.base_outcomes,
                )
            )
        return out


def _ids(ids: list[str], shown: int = 5) -> str:
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more
