"""A rollout's state as immutable data: phase, waves, and one record per selected device.

:mod:`fleet_server.rollout.machine` computes the next state from this and an event;
:mod:`fleet_server.rollout.serialize` stores it as JSON. Times are POSIX seconds (float).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from fleet_server.rollout.gates import LabelCounts, Metrics
from fleet_server.rollout.spec import RolloutSpec

HISTORY = 200
"""Phase changes kept in :attr:`Rollout.history` (the oldest are dropped)."""


class Phase(str, Enum):
    """Where a rollout is (docs/rollouts.md has the table of events and timeouts)."""

    PLANNED = "planned"
    ASSIGNING = "assigning"
    SHADOW = "shadow"
    SOAKING = "soaking"
    AWAITING_APPROVAL = "awaiting_approval"
    FINISHING = "finishing"
    PAUSED = "paused"
    ROLLING_BACK = "rolling_back"
    COMPLETED = "completed"
    COMPLETED_PARTIAL = "completed_partial"
    CANCELLED = "cancelled"
    ROLLED_BACK = "rolled_back"


TERMINAL = frozenset({Phase.COMPLETED, Phase.COMPLETED_PARTIAL, Phase.CANCELLED, Phase.ROLLED_BACK})
"""No timeout, no assignment; only Rollback (from all but rolled_back) leaves them."""
ACTIVE = frozenset(
    {Phase.ASSIGNING, Phase.SHADOW, Phase.SOAKING, Phase.AWAITING_APPROVAL, Phase.FINISHING}
)
"""Phases of a running wave: devices are assigned and the gates are watched."""


class DeviceStatus(str, Enum):
    """One selected device's progress in the rollout."""

    PENDING = "pending"
    """Not assigned yet (its wave has not come, or a shift holds it)."""
    OFFLINE = "offline"
    """Not assigned yet and offline: assigned when it is back (never counted as failed)."""
    SHADOW_ASSIGNED = "shadow-assigned"
    """Sent the shadow directive; the target not seen running in its shadow slot yet."""
    SHADOWING = "shadowing"
    """Runs the target in its shadow slot (beside its bundle, never acting); waits for
    the wave's shadow verdict, then gets the switch directive (``assigned``)."""
    ASSIGNED = "assigned"
    """Sent the directive; no install reported yet."""
    INSTALLING = "installing"
    """Reports an install of the target in progress."""
    DONE = "done"
    """Runs the target (also: already did, or got it some other way)."""
    FAILED = "failed"
    """The install failed or the device rolled the target back by itself."""
    REVERTING = "reverting"
    """Sent a revert to its previous bundle (or the release an operator named); not
    confirmed yet. Has a deadline: past it, the device is ``stuck``."""
    STUCK = "stuck"
    """A revert that cannot finish: the fleet could not deliver it, the device reported
    why it failed, no bundle was known to return to, or its deadline passed. ``why``
    says which; it waits for an operator (retry, assign a named release, accept)."""
    ROLLED_BACK = "rolled-back"
    """Reports its previous bundle (or the release an operator named) after a revert."""
    ACCEPTED = "accepted"
    """A stuck device an operator accepted as it is (``why`` names who)."""


UNASSIGNED = frozenset({DeviceStatus.PENDING, DeviceStatus.OFFLINE})
REVERT_OPEN = frozenset({DeviceStatus.REVERTING, DeviceStatus.STUCK})
"""A revert not finished: the rollout stays ``rolling_back`` while any device is in one."""
UNSETTLED = frozenset({DeviceStatus.ASSIGNED, DeviceStatus.INSTALLING})
SHADOW = frozenset({DeviceStatus.SHADOW_ASSIGNED, DeviceStatus.SHADOWING})
"""Assigned to the wave's shadow phase: the target runs (or is being put) beside, never
switched to; these devices feed the shadow gate, not the health gates."""


@dataclass(frozen=True)
class BundleRef:
    """A bundle release: what a directive names and a device reports as active."""

    name: str
    release: int


@dataclass(frozen=True)
class DeviceState:
    """One selected device. ``p99_ms``/``outcomes``/``worker_crashes`` are under the
    target; ``base_*`` under ``previous`` (what it ran before, and what a revert restores).
    """

    device_id: str
    labels: Mapping[str, str]
    status: DeviceStatus
    online: bool
    previous: BundleRef | None
    active: BundleRef | None
    wave: int | None = None
    """Index of the wave that assigned it (None: never assigned by this rollout)."""
    assigned_at: float | None = None
    settled_at: float | None = None
    install_failed: bool = False
    auto_rollback: bool = False
    worker_crashes: int = 0
    p99_ms: float | None = None
    outcomes: Mapping[str, int] = field(default_factory=dict)
    base_p99_ms: float | None = None
    base_outcomes: Mapping[str, int] = field(default_factory=dict)
    waived: bool = False
    """Accepted by an operator's resume after it failed a gate: it no longer feeds them."""
    reports: int = 0
    last_report_at: float | None = None
    shadow_n: int = 0
    """Sampled frames the target decided in the shadow slot (the device's running total)."""
    shadow_agree: int = 0
    """Of those, how many got the live model's outcome."""
    shadow_p99_ms: float | None = None
    """The target's p99 latency in the shadow slot."""
    revert_to: BundleRef | None = None
    """What a revert returns it to: ``previous``, or the release an operator named."""
    shadow_only: bool = False
    """Reverted while in the shadow phase: it never switched, only the shadow slot is
    emptied (confirmed once it reports ``previous`` active)."""
    reverted_at: float | None = None
    """When the (latest) revert was sent."""
    deadline: float | None = None
    """A reverting device's deadline: not confirmed by then, it is ``stuck``."""
    why: str = ""
    """Why a device is ``stuck``, or who accepted it."""


@dataclass(frozen=True)
class Wave:
    """One wave: the cumulative number of assigned devices it reaches, and who it got."""

    index: int
    target: int
    devices: tuple[str, ...] = ()
    started_at: float | None = None
    passed_at: float | None = None
    metrics: Metrics = field(default_factory=dict)
    shadow_passed_at: float | None = None
    """When the wave's shadow phase passed (None: not yet, or the rollout has none); a
    device the wave assigns after it gets the switch directive at once."""
    shadow: Metrics = field(default_factory=dict)
    """The wave's last shadow gate metrics (shown with the gate's for the whole wave)."""


@dataclass(frozen=True)
class Transition:
    """A phase change, for the status display."""

    at: float
    phase: Phase
    wave: int
    reason: str


@dataclass(frozen=True)
class Rollout:
    """The whole state of one rollout; the machine returns a new one for every event."""

    rollout_id: str
    spec: RolloutSpec
    target: BundleRef
    budget_ms: float | None
    created_at: float
    devices: Mapping[str, DeviceState]
    order: tuple[str, ...]
    """Assignment order: devices sorted by a hash of rollout id and device id."""
    waves: tuple[Wave, ...]
    wave: int
    """Index of the current wave."""
    phase: Phase
    since: float
    deadline: float | None
    """When the phase times out (None only in terminal phases)."""
    clock: float
    """The latest time seen; an event dated earlier is taken as happening now."""
    reason: str = ""
    resume_to: Phase | None = None
    gate: Metrics = field(default_factory=dict)
    failed_devices: tuple[str, ...] = ()
    ignored_reports: int = 0
    history: tuple[Transition, ...] = ()
    labels: LabelCounts | None = None
    """The review labels the accuracy gates judge (None: none read yet)."""

    def count(self, *statuses: DeviceStatus) -> int:
        """How many devices are in any of ``statuses``."""
        return sum(1 for d in self.devices.values() if d.status in statuses)

    def assigned(self) -> int:
        """How many devices the rollout has assigned (in any wave)."""
        return sum(1 for d in self.devices.values() if d.wave is not None)
