"""JSON views of stored rollouts, in the shape :class:`fleet_server.api.models.RolloutOut`
documents (for the rollout service to answer with)."""

from __future__ import annotations

from typing import Any

from fleet_server.db.store import RolloutRecord
from fleet_server.rollout import DeviceStatus, Rollout, from_dict

HISTORY_SHOWN = 20
"""Phase changes included in a view, newest last."""


def rollout_view(record: RolloutRecord, *, devices: bool = True) -> dict[str, Any]:
    """The rollout as the API answers it; ``devices=False`` leaves out the per-device list.

    Raises:
        RolloutError: the stored controller state is not a valid rollout.
    """
    rollout: Rollout = from_dict(record.controller_state)
    counts = {s.value: rollout.count(s) for s in DeviceStatus}
    view: dict[str, Any] = {
        "rollout_id": record.rollout_id,
        "bundle": record.bundle,
        "version": record.version,
        "release": record.release,
        "phase": rollout.phase.value,
        "wave": rollout.wave + 1 if rollout.waves else 0,
        "waves": len(rollout.waves),
        "reason": rollout.reason,
        "selector": dict(record.selector),
        "soak_s": record.soak_s,
        "counts": {k: v for k, v in counts.items() if v},
        "total": len(rollout.devices),
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "history": [
            {"at": t.at, "phase": t.phase.value, "wave": t.wave, "reason": t.reason}
            for t in rollout.history[-HISTORY_SHOWN:]
        ],
    }
    if devices:
        view["devices"] = [
            {
                "device_id": d.device_id,
                "status": d.status.value,
                "wave": None if d.wave is None else d.wave + 1,
                "online": d.online,
                "active": None if d.active is None else f"{d.active.name}@{d.active.release}",
            }
            for d in (rollout.devices[i] for i in rollout.order)
        ]
    return view
