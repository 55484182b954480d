"""A rollout as the operator sees it: plain JSON-ready data for the CLI and the API."""

from __future__ import annotations

from typing import Any

from fleet_server.db.store import RolloutRecord
from fleet_server.rollout.reports import revert_target
from fleet_server.rollout.state import BundleRef, DeviceState, Rollout
from fleet_server.rollout.state import DeviceStatus as S


def _ref(ref: BundleRef | None) -> dict[str, Any] | None:
    return None if ref is None else {"name": ref.name, "release": ref.release}


def _revert_to(d: DeviceState) -> dict[str, Any] | None:
    """What a revert returns the device to (None: it is in no revert)."""
    if d.status not in (S.REVERTING, S.STUCK, S.ROLLED_BACK, S.ACCEPTED):
        return None
    return _ref(d.previous if d.shadow_only else revert_target(d))


def view(record: RolloutRecord, r: Rollout, *, full: bool) -> dict[str, Any]:
    """Phase, wave, reason, gate metrics, counts and the stuck devices with why; with
    ``full`` also every device (in assignment order: what a revert returns it to, its
    deadline, why it is stuck or who accepted it), each wave's metrics and the phase
    history."""
    counts: dict[str, int] = {}
    for d in r.devices.values():
        counts[d.status.value] = counts.get(d.status.value, 0) + 1
    view: dict[str, Any] = {
        "rollout_id": r.rollout_id,
        "bundle": r.target.name,
        "version": r.spec.version,
        "release": r.target.release,
        "selector": dict(r.spec.selector),
        "waves": len(r.waves),
        "wave_steps": list(r.spec.waves),
        "wave_targets": [w.target for w in r.waves],
        "soak_s": r.spec.soak_s,
        "shadow_s": r.spec.shadow_s,
        "shadow_min": r.spec.shadow_min,
        "min_agreement": r.spec.min_agreement,
        "phase": r.phase.value,
        "wave": r.wave + 1,
        "reason": r.reason,
        "since": r.since,
        "deadline": r.deadline,
        "gate": dict(r.gate),
        "failed_devices": list(r.failed_devices),
        "stuck": [
            {"device_id": d.device_id, "why": d.why}
            for d in (r.devices[i] for i in r.order)
            if d.status is S.STUCK
        ],
        "counts": counts,
        "revision": record.revision,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }
    if full:
        view["devices"] = [
            {
                "device_id": d.device_id,
                "status": d.status.value,
                "wave": None if d.wave is None else d.wave + 1,
                "online": d.online,
                "active": _ref(d.active),
                "previous": _ref(d.previous),
                "p99_ms": d.p99_ms,
                "worker_crashes": d.worker_crashes,
                "shadow_n": d.shadow_n,
                "shadow_agree": d.shadow_agree,
                "shadow_p99_ms": d.shadow_p99_ms,
                "revert_to": _revert_to(d),
                "revert_deadline": d.deadline,
                "why": d.why,
            }
            for d in (r.devices[i] for i in r.order)
        ]
        view["wave_metrics"] = [dict(w.metrics) for w in r.waves]
        view["history"] = [
            {"at": t.at, "phase": t.phase.value, "wave": t.wave, "reason": t.reason}
            for t in r.history
        ]
    return view
