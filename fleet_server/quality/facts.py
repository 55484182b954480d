"""The fleet's facts a device's quality records are checked against before they are
stored (docs/adr/0018-shadow-gate-from-stored-records.md): the line it is enrolled on,
and the model versions the fleet recorded for it.

- :func:`enrolled_lines`: a device's line is its ``line`` label in the registry (set at
  enrollment or by an operator), never the line its records name.
- :func:`recorded_version`: a model version is the device's when the fleet recorded it
  as its active, previous or shadow bundle (its reported states, kept as ``state``
  events, and its newest health's shadow summary), or when a rollout holding the device
  targets that version. A decision row or a drift bucket the device uploaded is its own
  word and makes nothing known.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from fleet_server.db.tables import devices, events, rollout_devices, rollouts

STATE_EVENT = "state"
"""Kind of the events that keep a device's reported states (see the ingest sink)."""
STATES_READ = 200
"""The most (newest) reported states of a device read for its versions."""
_SLOTS = ("active", "previous", "shadow")


def enrolled_lines(conn: Connection, device_ids: Collection[str]) -> dict[str, str | None]:
    """The enrolled line of each of ``device_ids`` (None: not registered, or no line)."""
    found: dict[str, str | None] = dict.fromkeys(device_ids)
    if not device_ids:
        return found
    query = sa.select(devices.c.device_id, devices.c.labels).where(
        devices.c.device_id.in_(sorted(device_ids))
    )
    for device_id, labels in conn.execute(query):
        line = labels.get("line") if isinstance(labels, dict) else None
        found[device_id] = line if isinstance(line, str) and line else None
    return found


def _names(bundle: Any, name: str, version: str) -> bool:
    return (
        isinstance(bundle, dict)
        and bundle.get("name") == name
        and (bundle.get("version") == version)
    )


def recorded_version(conn: Connection, device_id: str, name: str, version: str) -> bool:
    """Whether the fleet recorded ``name`` ``version`` as ``device_id``'s (see the
    module docstring)."""
    states = (
        sa.select(events.c.payload)
        .where(events.c.device_id == device_id, events.c.kind == STATE_EVENT)
        .order_by(events.c.ts.desc())
        .limit(STATES_READ)
    )
    for (payload,) in conn.execute(states):
        if isinstance(payload, dict) and any(_names(payload.get(s), name, version) for s in _SLOTS):
            return True
    health = conn.execute(
        sa.select(devices.c.health).where(devices.c.device_id == device_id)
    ).scalar_one_or_none()
    shadow = health.get("shadow") if isinstance(health, dict) else None
    if isinstance(shadow, dict) and _names(
        {"name": shadow.get("bundle"), "version": shadow.get("version")}, name, version
    ):
        return True
    assigned = (
        sa.select(sa.literal(1))
        .select_from(
            rollout_devices.join(rollouts, rollouts.c.rollout_id == rollout_devices.c.rollout_id)
        )
        .where(
            rollout_devices.c.device_id == device_id,
            rollouts.c.bundle == name,
            rollouts.c.version == version,
        )
        .limit(1)
    )
    return conn.execute(assigned).first() is not None
