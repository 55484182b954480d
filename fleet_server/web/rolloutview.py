"""A stored rollout laid out for its page (pure): phase in words and colour, each wave's
devices by status, the gates against their thresholds, the operator actions the phase
accepts, the devices whose revert is open (stuck ones with why, to resolve), the devices
and the phase history."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

from fleet_server.rollout import (
    TERMINAL,
    Approve,
    Cancel,
    DeviceStatus,
    Pause,
    Phase,
    Resume,
    Rollback,
    Rollout,
    refusal,
)
from fleet_server.rollout.reports import revert_target
from fleet_server.rollout.state import REVERT_OPEN, BundleRef, DeviceState, Transition
from fleet_server.web.charts import Segment, progress_bar
from fleet_server.web.gateview import GateRow, gate_rows

ACTIONS = ("approve", "pause", "resume", "cancel", "rollback")
"""Operator actions, in the order the page shows their buttons."""
_EVENTS = {"approve": Approve, "pause": Pause, "resume": Resume, "cancel": Cancel,
           "rollback": Rollback}  # fmt: skip
STATUS_ORDER = (
    DeviceStatus.DONE, DeviceStatus.INSTALLING, DeviceStatus.ASSIGNED, DeviceStatus.SHADOWING,
    DeviceStatus.SHADOW_ASSIGNED, DeviceStatus.FAILED,
    DeviceStatus.REVERTING, DeviceStatus.STUCK, DeviceStatus.ROLLED_BACK, DeviceStatus.ACCEPTED,
    DeviceStatus.PENDING, DeviceStatus.OFFLINE,
)  # fmt: skip
PHASE_CSS = {
    Phase.PLANNED: "ph-run", Phase.ASSIGNING: "ph-run", Phase.SHADOW: "ph-run",
    Phase.SOAKING: "ph-run",
    Phase.FINISHING: "ph-run", Phase.AWAITING_APPROVAL: "ph-wait", Phase.PAUSED: "ph-wait",
    Phase.ROLLING_BACK: "ph-bad", Phase.COMPLETED: "ph-ok", Phase.COMPLETED_PARTIAL: "ph-wait",
    Phase.CANCELLED: "ph-stop", Phase.ROLLED_BACK: "ph-bad",
}  # fmt: skip
PHASE_TEXT = {
    Phase.PLANNED: "planned: starts at the next tick",
    Phase.ASSIGNING: "installing the wave",
    Phase.SHADOW: "shadow: the wave runs the new bundle beside the live one, never acting",
    Phase.SOAKING: "soaking: watching the gates",
    Phase.AWAITING_APPROVAL: "waiting for an operator to approve the next wave",
    Phase.FINISHING: "last wave passed; waiting for offline devices",
    Phase.PAUSED: "paused: nothing new is assigned",
    Phase.ROLLING_BACK: "rolling back: devices return to their previous bundle",
    Phase.COMPLETED: "completed: every device runs the bundle",
    Phase.COMPLETED_PARTIAL: "completed, but not on every device",
    Phase.CANCELLED: "cancelled: devices keep what they run",
    Phase.ROLLED_BACK: "rolled back",
}
DEVICES_SHOWN = 200
"""Devices listed on a rollout's page; beyond, the ones that need attention come first."""
_ATTENTION = {
    DeviceStatus.STUCK: 0, DeviceStatus.FAILED: 0, DeviceStatus.REVERTING: 1,
    DeviceStatus.INSTALLING: 2, DeviceStatus.ASSIGNED: 3, DeviceStatus.SHADOW_ASSIGNED: 3,
    DeviceStatus.SHADOWING: 3, DeviceStatus.ROLLED_BACK: 4, DeviceStatus.ACCEPTED: 4,
    DeviceStatus.OFFLINE: 5, DeviceStatus.PENDING: 6, DeviceStatus.DONE: 7,
}  # fmt: skip
RESOLVE_TEXT = {"retry": "Retry the revert", "accept": "Accept as it is",
                "assign": "Assign release"}  # fmt: skip
"""The buttons that resolve a stuck (or still reverting) device, by ``how``."""
BUTTON_TEXT = {"approve": "Approve next wave", "pause": "Pause", "resume": "Resume",
               "cancel": "Cancel rollout", "rollback": "Roll back"}  # fmt: skip


def status_css(status: DeviceStatus | str) -> str:
    """The CSS class of a device status (``st-done``, ``st-rolled-back``, ...)."""
    return f"st-{DeviceStatus(status).value}"


def segments(counts: Counter[DeviceStatus]) -> list[Segment]:
    """Progress bar segments in :data:`STATUS_ORDER`."""
    return [Segment(s.value, counts[s], status_css(s)) for s in STATUS_ORDER if counts[s]]


@dataclass(frozen=True)
class WaveRow:
    """One wave on the page."""

    number: int
    target: int
    adds: int
    """Devices the wave is planned to add (it may get more when offline ones return)."""
    state: str
    started_at: float | None
    passed_at: float | None
    bar: Markup
    gates: Sequence[GateRow]


@dataclass(frozen=True)
class DeviceRow:
    """One device of the rollout."""

    device_id: str
    wave: int | None
    status: str
    online: bool
    active: str
    site: str
    line: str
    p99_ms: float | None
    why: str = ""
    """Why it is stuck, or who accepted it."""
    revert_to: str = ""
    """What its revert returns it to ("" when it is in no revert)."""
    deadline: float | None = None
    """A reverting device's deadline."""


@dataclass(frozen=True)
class RolloutPage:
    """Everything the rollout page shows."""

    rollout: Rollout
    phase: str
    phase_css: str
    phase_text: str
    wave: int
    waves: Sequence[WaveRow]
    overall: Markup
    gates: Sequence[GateRow]
    actions: Sequence[str]
    devices: Sequence[DeviceRow]
    devices_total: int
    history: Sequence[Transition]
    terminal: bool
    open_reverts: Sequence[DeviceRow] = ()
    """Stuck devices first, then reverting ones: what an operator can resolve."""


def _ref(ref: BundleRef | None) -> str:
    return "—" if ref is None else f"{ref.name} r{ref.release}"


def available_actions(rollout: Rollout) -> list[str]:
    """The operator actions the rollout's phase accepts (see :func:`refusal`)."""
    return [a for a in ACTIONS if refusal(rollout, _EVENTS[a](rollout.clock)) is None]


def rollout_page(rollout: Rollout, *, width: int = 560) -> RolloutPage:
    """The page of ``rollout`` (the machine's state as stored)."""
    devices = rollout.devices
    total = len(devices)
    overall = Counter(d.status for d in devices.values())
    waves = []
    gates_policy = rollout.spec.policy.gates
    before = 0
    for w in rollout.waves:
        counts = Counter(devices[i].status for i in w.devices if i in devices)
        if w.passed_at is not None:
            state = "passed"
        elif w.index == rollout.wave and w.started_at is not None:
            state = "current"
        else:
            state = "waiting"
        planned, before = w.target - before, w.target
        size = max(planned, len(w.devices), 1)
        bar = progress_bar(segments(counts), size, label=f"wave {w.index + 1}", width=width)
        shown = w.metrics or w.shadow
        spec = rollout.spec
        checks = gate_rows(shown, gates_policy, rollout.budget_ms, spec) if shown else []
        waves.append(
            WaveRow(w.index + 1, w.target, planned, state, w.started_at, w.passed_at, bar, checks)
        )
    marker = None
    if rollout.waves and rollout.phase not in (Phase.COMPLETED, Phase.ROLLED_BACK):
        current = rollout.waves[min(rollout.wave, len(rollout.waves) - 1)]
        marker = (f"wave {current.index + 1} target: {current.target}", current.target)
    bar = progress_bar(segments(overall), total, label="all devices", marker=marker, width=width)
    order = list(rollout.order)
    if len(order) > DEVICES_SHOWN:
        order = sorted(order, key=lambda i: _ATTENTION[devices[i].status])[:DEVICES_SHOWN]
    rows = [_row(devices[i]) for i in order]
    open_reverts = []
    if rollout.phase is Phase.ROLLING_BACK:
        opened = [i for i in rollout.order if devices[i].status in REVERT_OPEN]
        opened.sort(key=lambda i: devices[i].status is not DeviceStatus.STUCK)
        open_reverts = [_row(devices[i]) for i in opened[:DEVICES_SHOWN]]
    return RolloutPage(
        rollout=rollout,
        phase=rollout.phase.value,
        phase_css=PHASE_CSS[rollout.phase],
        phase_text=PHASE_TEXT[rollout.phase],
        wave=rollout.wave + 1,
        waves=waves,
        overall=bar,
        gates=(
            gate_rows(rollout.gate, gates_policy, rollout.budget_ms, rollout.spec)
            if rollout.gate
            else []
        ),
        actions=available_actions(rollout),
        devices=rows,
        devices_total=total,
        history=list(reversed(rollout.history)),
        terminal=rollout.phase in TERMINAL,
        open_reverts=open_reverts,
    )


def _row(d: DeviceState) -> DeviceRow:
    back = d.previous if d.shadow_only else revert_target(d)
    in_revert = d.status in (*REVERT_OPEN, DeviceStatus.ROLLED_BACK, DeviceStatus.ACCEPTED)
    return DeviceRow(
        d.device_id, None if d.wave is None else d.wave + 1, d.status.value, d.online,
        _ref(d.active), d.labels.get("site", ""), d.labels.get("line", ""), d.p99_ms,
        why=d.why, revert_to=_ref(back) if in_revert else "",
        deadline=d.deadline if d.status is DeviceStatus.REVERTING else None,
    )  # fmt: skip
