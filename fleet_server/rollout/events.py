"""What goes into the rollout machine (events) and what comes out (commands).

Every event carries ``now`` (POSIX seconds): the machine never reads a clock. The I/O shell
turns :class:`AssignDirective` and :class:`RevertDirective` into signed, retained
directives, and :class:`Notify` into logs, events and operator messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from fleet_server.rollout.gates import LabelCounts

MODE_ACTIVE = "active"
MODE_SHADOW = "shadow"
RESOLVE_RETRY = "retry"
RESOLVE_ASSIGN = "assign"
RESOLVE_ACCEPT = "accept"
RESOLUTIONS = (RESOLVE_RETRY, RESOLVE_ASSIGN, RESOLVE_ACCEPT)
"""How an operator resolves a stuck (or reverting) device: send its revert again, send
it to a named release of the rollout's bundle, or accept what it runs."""


class InstallOutcome(str, Enum):
    """An install as the device's installer reports it (its journal status, mapped)."""

    RUNNING = "running"
    COMMITTED = "committed"
    """Also the installer's ``noop`` (the release was already committed)."""
    FAILED = "failed"
    """Also ``refused`` and ``rolled-back`` (the latter with ``auto_rollback``)."""


@dataclass(frozen=True)
class ShadowReport:
    """The candidate a device runs in its shadow slot and its comparison totals since it
    was installed (the health report's shadow summary). ``release`` may be unknown; the
    candidate is then matched by ``version``."""

    bundle: str
    release: int | None = None
    version: str | None = None
    n: int = 0
    agree: int = 0
    p99_ms: float | None = None


@dataclass(frozen=True)
class DeviceReport:
    """A device's reported state, as the ingest last saw it.

    ``active_*``: the bundle release it runs (None: unknown, the last known is kept).
    ``install``: the outcome of its latest install, which is about ``install_bundle``
    ``install_release`` (ignored unless that is the rollout's target); ``install_shadow``:
    that install was into the shadow slot. ``shadow``: what runs in the shadow slot, with
    its comparison totals (None: nothing, or not reported). ``auto_rollback``:
    that install was rolled back by the device after the switch. ``worker_crashes``,
    ``p99_ms`` and ``outcome_counts`` (decisions by outcome) are for the active bundle.
    ``install_at``: when that install began (the device's clock, bounded by ingest);
    ``install_reason``: the step and reason it gave when it failed.
    """

    device_id: str
    now: float
    online: bool = True
    active_bundle: str | None = None
    active_release: int | None = None
    install: InstallOutcome | None = None
    install_bundle: str | None = None
    install_release: int | None = None
    install_shadow: bool = False
    auto_rollback: bool = False
    worker_crashes: int = 0
    p99_ms: float | None = None
    outcome_counts: Mapping[str, int] = field(default_factory=dict)
    shadow: ShadowReport | None = None
    install_at: float | None = None
    install_reason: str = ""


@dataclass(frozen=True)
class RevertRefused:
    """The shell could not deliver a device's revert (e.g. the release it returns to is
    not published); ``reason`` says why. The device is ``stuck`` with it."""

    now: float
    device_id: str
    reason: str


@dataclass(frozen=True)
class LabelReport:
    """The review labels of the target version and of the versions it replaces, on the
    rollout's lines, as the shell last read them (for the accuracy gates)."""

    now: float
    counts: LabelCounts


@dataclass(frozen=True)
class Tick:
    """Time passes: timeouts and soaks are checked, shifts that ended release devices."""

    now: float


@dataclass(frozen=True)
class Approve:
    """An operator lets the next wave start (only while awaiting approval)."""

    now: float
    by: str = ""


@dataclass(frozen=True)
class Pause:
    """An operator stops assignments; installs already sent go on."""

    now: float
    reason: str = ""
    by: str = ""


@dataclass(frozen=True)
class Resume:
    """An operator continues a paused rollout (accepting devices that failed a gate)."""

    now: float
    by: str = ""


@dataclass(frozen=True)
class Cancel:
    """An operator ends the rollout; devices keep what they run."""

    now: float
    reason: str = ""
    by: str = ""


@dataclass(frozen=True)
class Rollback:
    """An operator reverts every device the rollout assigned to its previous bundle."""

    now: float
    reason: str = ""
    by: str = ""


@dataclass(frozen=True)
class Resolve:
    """An operator resolves one device of a rollout that is rolling back (it is ``stuck``
    or still ``reverting``): ``how`` is one of :data:`RESOLUTIONS`; ``release`` (for
    ``assign``) is the release of the rollout's bundle to send it to."""

    now: float
    device_id: str
    how: str
    release: int | None = None
    by: str = ""
    reason: str = ""


Event = (
    DeviceReport
    | LabelReport
    | RevertRefused
    | Tick
    | Approve
    | Pause
    | Resume
    | Cancel
    | Rollback
    | Resolve
)
Operator = Approve | Pause | Resume | Cancel | Rollback | Resolve


@dataclass(frozen=True)
class AssignDirective:
    """Send the device a directive for the target bundle release: ``mode`` ``active``
    (install and switch) or ``shadow`` (install into the shadow slot, run beside, never
    act)."""

    device_id: str
    bundle: str
    release: int
    mode: str = MODE_ACTIVE


@dataclass(frozen=True)
class RevertDirective:
    """Send the device back to the bundle it ran before (None: it ran none before).

    The device has the target committed by now, so the shell must express this as a
    rollback the installer accepts (the agent's rollback to its other slot), not as an
    install of a lower release, which rollback protection refuses.
    """

    device_id: str
    bundle: str | None
    release: int | None
    shadow_only: bool = False
    """The device never switched (it was in the shadow phase): only its shadow slot is
    emptied; it already runs what it returns to."""


@dataclass(frozen=True)
class Notify:
    """Something an operator should see: a phase change, a gate failure, a refusal.

    ``kind``: ``"phase"``, ``"gate_failed"``, ``"rejected"`` (an operator event that
    does not apply in this phase; nothing changed), ``"device_stuck"`` (a revert that
    cannot finish, with why) or ``"resolved"`` (an operator resolved a device).
    ``wave``: the current wave, from 1. ``by``: the operator who acted, where one did.
    """

    kind: str
    phase: str
    wave: int
    message: str
    by: str = ""


Command = AssignDirective | RevertDirective | Notify
