"""The device registry: one row per enrolled device, its labels, state and health.

``labels`` and ``profile`` are the fleet's: set at enrollment and by operators, and the
only ones rollout selectors (:func:`list_devices`) and signed directives use. What a
device reports of itself is kept in ``reported_labels`` and ``reported_profile``
(:func:`set_reported`), shown beside, never used to select or sign. ``last_seen`` is
the server's receive time of the newest sign of life, never a device's clock.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from fleet_server.db._tx import Bind, reading, upsert, writing
from fleet_server.db.errors import StorageError
from fleet_server.db.tables import devices

PROFILE_KEY = "profile"
"""The selector key that matches the hardware profile instead of a label."""


@dataclass(frozen=True)
class Device:
    """A device as the registry knows it (timestamps in Unix seconds)."""

    device_id: str
    labels: dict[str, str]
    profile: str
    enrolled_at: float
    agent_version: str | None = None
    last_seen: float | None = None
    online: bool = False
    active_bundle: str | None = None
    active_release: int | None = None
    previous_bundle: str | None = None
    previous_release: int | None = None
    health: dict[str, Any] | None = None
    cert_serial: str | None = None
    revoked: bool = False
    reported_profile: str | None = None
    """The profile the device last reported (not used for anything but showing)."""
    reported_labels: dict[str, str] | None = None
    """The labels the device last reported (not used for anything but showing)."""
    shard: str | None = None
    """The broker shard given at enrollment (None: the main broker)."""
    active_version: str | None = None
    """The active bundle's version, as reported (None: not reported)."""
    active_digest: str | None = None
    """The active bundle's digest, as reported (also the bundle it was set up with)."""
    previous_version: str | None = None
    previous_digest: str | None = None


def _check_labels(device_id: str, labels: Mapping[str, str]) -> dict[str, str]:
    bad = [k for k, v in labels.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise StorageError(f"device '{device_id}'", f"labels must map str to str: {bad!r}")
    return dict(labels)


def upsert_device(
    bind: Bind,
    device_id: str,
    *,
    now: float | None = None,
    labels: Mapping[str, str] | None = None,
    profile: str | None = None,
    agent_version: str | None = None,
    active_bundle: str | None = None,
    active_release: int | None = None,
    previous_bundle: str | None = None,
    previous_release: int | None = None,
    health: Mapping[str, Any] | None = None,
    cert_serial: str | None = None,
    revoked: bool | None = None,
    shard: str | None = None,
) -> None:
    """Create the device or update it; a field left ``None`` keeps its stored value
    (``shard``: the broker shard enrollment gave it).

    A new device gets ``enrolled_at = now`` and empty labels and profile unless given.

    Raises:
        StorageError: labels are not a str -> str mapping.
    """
    given: dict[str, Any] = {
        "labels": None if labels is None else _check_labels(device_id, labels),
        "profile": profile,
        "agent_version": agent_version,
        "active_bundle": active_bundle,
        "active_release": active_release,
        "previous_bundle": previous_bundle,
        "previous_release": previous_release,
        "health": None if health is None else dict(health),
        "cert_serial": cert_serial,
        "revoked": revoked,
        "shard": shard,
    }
    changes = {k: v for k, v in given.items() if v is not None}
    row = {
        "device_id": device_id,
        "labels": {},
        "profile": "",
        "enrolled_at": time.time() if now is None else now,
        "online": False,
        "revoked": False,
        **changes,
    }
    with writing(bind) as conn:
        stmt = upsert(conn, devices).values(row)
        if changes:
            conn.execute(stmt.on_conflict_do_update(index_elements=["device_id"], set_=changes))
        else:
            conn.execute(stmt.on_conflict_do_nothing(index_elements=["device_id"]))


def set_reported(
    bind: Bind, device_id: str, *, profile: str | None, labels: Mapping[str, Any] | None
) -> None:
    """Keep what the device reported of its profile and labels (a ``None`` keeps the
    value held); the fleet's ``profile`` and ``labels`` are not touched."""
    values: dict[str, Any] = {}
    if profile is not None:
        values["reported_profile"] = profile
    if labels is not None:
        values["reported_labels"] = dict(labels)
    if not values:
        return
    with writing(bind) as conn:
        conn.execute(devices.update().where(devices.c.device_id == device_id).values(values))


def _device(row: sa.Row[Any]) -> Device:
    return Device(**row._asdict())


def get_device(bind: Bind, device_id: str) -> Device | None:
    """The device, or ``None`` if it is not registered."""
    with reading(bind) as conn:
        row = conn.execute(sa.select(devices).where(devices.c.device_id == device_id)).first()
    return None if row is None else _device(row)


def list_devices(
    bind: Bind, selector: Mapping[str, str] | None = None, *, include_revoked: bool = True
) -> list[Device]:
    """The devices matching every ``key=value`` of ``selector``, ordered by id.

    ``profile`` matches the hardware profile, any other key a label; an empty or
    missing selector matches every device.
    """
    query = sa.select(devices).order_by(devices.c.device_id)
    for key, value in (selector or {}).items():
        if key == PROFILE_KEY:
            query = query.where(devices.c.profile == value)
        else:
            query = query.where(devices.c.labels[key].as_string() == value)
    if not include_revoked:
        query = query.where(devices.c.revoked.is_(False))
    with reading(bind) as conn:
        return [_device(row) for row in conn.execute(query)]


def _seen_update(online: bool | None) -> sa.Update:
    ts = sa.bindparam("ts", type_=sa.Double)
    later = sa.case(
        (sa.or_(devices.c.last_seen.is_(None), devices.c.last_seen < ts), ts),
        else_=devices.c.last_seen,
    )
    values: dict[str, Any] = {"last_seen": later}
    if online is not None:
        values["online"] = online
    return (
        devices.update()
        .where(devices.c.device_id == sa.bindparam("id", type_=sa.Text))
        .values(values)
    )


def mark_seen(bind: Bind, device_id: str, ts: float, online: bool) -> bool:
    """Record a sign of life (or, ``online=False``, a goodbye) from the device.

    ``last_seen`` only moves forward; ``online`` takes the value given. Returns whether
    the device is registered.
    """
    with writing(bind) as conn:
        result = conn.execute(_seen_update(online), {"id": device_id, "ts": ts})
    return result.rowcount == 1


def touch_devices(bind: Bind, last_seen: Mapping[str, float]) -> int:
    """Move ``last_seen`` forward for many devices at once (one ingest batch) and mark
    them online; returns how many are registered."""
    if not last_seen:
        return 0
    params = [{"id": d, "ts": ts} for d, ts in sorted(last_seen.items())]
    with writing(bind) as conn:
        result = conn.execute(_seen_update(True), params)
    return int(result.rowcount)
