"""A new rollout from a spec and the devices the registry knows (pure)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleet_server.rollout.errors import RolloutError
from fleet_server.rollout.spec import ALL, RolloutSpec, matches, resolve_waves
from fleet_server.rollout.state import BundleRef, DeviceState, Phase, Rollout, Transition, Wave
from fleet_server.rollout.state import DeviceStatus as S


@dataclass(frozen=True)
class DeviceInfo:
    """A device as the registry knows it when the rollout is created."""

    device_id: str
    labels: Mapping[str, str]
    online: bool = True
    active: BundleRef | None = None
    p99_ms: float | None = None
    outcome_counts: Mapping[str, int] = field(default_factory=dict)


def plan(
    rollout_id: str,
    spec: RolloutSpec,
    release: int,
    devices: Iterable[DeviceInfo],
    now: float,
    budget_ms: float | None = None,
) -> Rollout:
    """A new rollout (phase ``planned``) of ``spec.bundle`` ``release`` to the selected
    devices; ``budget_ms`` is the bundle's latency budget (None: no budget check).

    Devices already running the target are done from the start and in no wave; the waves
    are resolved against the others. The assignment order is a stable hash of rollout id
    and device id, so each rollout picks different canaries, the same ones on replay.

    Raises:
        RolloutError: the selector matches no device, or a device id is empty or repeated.
    """
    if not rollout_id:
        raise RolloutError("rollout_id", "empty")
    target = BundleRef(spec.bundle, release)
    states: dict[str, DeviceState] = {}
    for info in devices:
        if not matches(spec.selector, info.labels):
            continue
        if not info.device_id or info.device_id in states:
            raise RolloutError("devices", f"device id {info.device_id!r} empty or repeated")
        done = info.active == target
        status = S.DONE if done else (S.PENDING if info.online else S.OFFLINE)
        states[info.device_id] = DeviceState(
            device_id=info.device_id,
            labels=dict(info.labels),
            status=status,
            online=info.online,
            previous=None if done else info.active,
            active=info.active,
            settled_at=now if done else None,
            base_p99_ms=info.p99_ms,
            base_outcomes=dict(info.outcome_counts),
        )
    if not states:
        raise RolloutError("selector", f"{spec.selector or ALL} matches no device")
    needing = sum(1 for d in states.values() if d.status is not S.DONE)
    waves = tuple(Wave(i, t) for i, t in enumerate(resolve_waves(spec.waves, needing)))
    order = tuple(sorted(states, key=lambda d: (_rank(rollout_id, d), d)))
    return Rollout(
        rollout_id=rollout_id,
        spec=spec,
        target=target,
        budget_ms=budget_ms,
        created_at=now,
        devices=states,
        order=order,
        waves=waves,
        wave=0,
        phase=Phase.PLANNED,
        since=now,
        deadline=now,
        clock=now,
        history=(Transition(now, Phase.PLANNED, 1, "created"),),
    )


def _rank(rollout_id: str, device_id: str) -> str:
    return hashlib.sha256(f"{rollout_id}\0{device_id}".encode()).hexdigest()
