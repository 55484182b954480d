"""Rollouts and each device's place in one.

A rollout row holds what the operator asked for and the controller's serialized state.
Saving is compare-and-swap on ``revision``: a copy loaded before someone else saved is
refused, so two fleet-server processes can't overwrite each other's progress.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from fleet_server.db._tx import Bind, reading, upsert, writing
from fleet_server.db.errors import RolloutConflict, StorageError
from fleet_server.db.tables import rollout_devices, rollouts


@dataclass(frozen=True)
class RolloutRecord:
    """A stored rollout. ``revision`` is 0 for one never saved; saving returns the copy
    with the new revision and timestamps."""

    rollout_id: str
    bundle: str
    release: int
    version: str
    selector: dict[str, str]
    waves: list[Any]
    soak_s: float
    policy: dict[str, Any]
    state: str
    controller_state: dict[str, Any]
    revision: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass(frozen=True)
class RolloutDevice:
    """One device's wave and status in a rollout."""

    device_id: str
    wave: int
    status: str
    updated_at: float = 0.0


def _values(r: RolloutRecord) -> dict[str, Any]:
    return {
        "bundle": r.bundle,
        "release": r.release,
        "version": r.version,
        "selector": dict(r.selector),
        "waves": list(r.waves),
        "soak_s": r.soak_s,
        "policy": dict(r.policy),
        "state": r.state,
        "controller_state": dict(r.controller_state),
    }


def save_rollout(bind: Bind, rollout: RolloutRecord, *, now: float | None = None) -> RolloutRecord:
    """Create (``revision`` 0) or update the rollout; returns the stored copy.

    Raises:
        RolloutConflict: a new rollout's id exists, or the stored revision is not the
            one this copy was loaded at.
    """
    ts = time.time() if now is None else now
    t = rollouts
    with writing(bind) as conn:
        if rollout.revision == 0:
            stmt = (
                upsert(conn, t)
                .values(
                    rollout_id=rollout.rollout_id,
                    revision=1,
                    created_at=ts,
                    updated_at=ts,
                    **_values(rollout),
                )
                .on_conflict_do_nothing(index_elements=["rollout_id"])
                .returning(*t.c)
            )
            row = conn.execute(stmt).first()
            if row is None:
                raise RolloutConflict(rollout.rollout_id, 0, "a rollout with this id exists")
            return RolloutRecord(**row._asdict())
        stmt_u = (
            t.update()
            .where(t.c.rollout_id == rollout.rollout_id, t.c.revision == rollout.revision)
            .values(revision=t.c.revision + 1, updated_at=ts, **_values(rollout))
            .returning(*t.c)
        )
        row = conn.execute(stmt_u).first()
        if row is None:
            stored = conn.execute(
                sa.select(t.c.revision).where(t.c.rollout_id == rollout.rollout_id)
            ).scalar()
    if row is not None:
        return RolloutRecord(**row._asdict())
    reason = (
        "not stored"
        if stored is None
        else f"stored at revision {stored}, this copy is revision {rollout.revision}"
    )
    raise RolloutConflict(rollout.rollout_id, rollout.revision, reason)


def load_rollout(bind: Bind, rollout_id: str) -> RolloutRecord | None:
    """The stored rollout, or ``None``."""
    query = sa.select(rollouts).where(rollouts.c.rollout_id == rollout_id)
    with reading(bind) as conn:
        row = conn.execute(query).first()
    return None if row is None else RolloutRecord(**row._asdict())


def list_rollouts(bind: Bind, states: Collection[str] | None = None) -> list[RolloutRecord]:
    """The rollouts (in one of ``states`` if given), oldest first."""
    query = sa.select(rollouts).order_by(rollouts.c.created_at, rollouts.c.rollout_id)
    if states is not None:
        query = query.where(rollouts.c.state.in_(list(states)))
    with reading(bind) as conn:
        return [RolloutRecord(**row._asdict()) for row in conn.execute(query)]


def set_rollout_devices(
    bind: Bind, rollout_id: str, devices: Iterable[RolloutDevice], *, now: float | None = None
) -> None:
    """Set the wave and status of each device in the rollout (``updated_at`` = now).

    Raises:
        StorageError: the rollout is not stored.
    """
    ts = time.time() if now is None else now
    rows = sorted(
        (
            {"rollout_id": rollout_id, "device_id": d.device_id, "wave": d.wave,
             "status": d.status, "updated_at": ts}
            for d in devices
        ),
        key=lambda r: str(r["device_id"]),
    )  # fmt: skip
    if not rows:
        return
    with writing(bind) as conn:
        exists = conn.execute(
            sa.select(rollouts.c.rollout_id).where(rollouts.c.rollout_id == rollout_id)
        ).first()
        if exists is None:
            raise StorageError(f"rollout '{rollout_id}'", "not stored")
        stmt = upsert(conn, rollout_devices)
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["rollout_id", "device_id"],
                set_={
                    "wave": stmt.excluded.wave,
                    "status": stmt.excluded.status,
                    "updated_at": stmt.excluded.updated_at,
                },
            ),
            rows,
        )


def set_rollout_device_status(
    bind: Bind,
    rollout_id: str,
    device_id: str,
    *,
    wave: int,
    status: str,
    now: float | None = None,
) -> None:
    """Set one device's wave and status in the rollout.

    Raises:
        StorageError: the rollout is not stored.
    """
    set_rollout_devices(bind, rollout_id, [RolloutDevice(device_id, wave, status)], now=now)


def list_rollout_devices(bind: Bind, rollout_id: str) -> list[RolloutDevice]:
    """The devices of the rollout, by wave then id."""
    t = rollout_devices
    query = (
        sa.select(t.c.device_id, t.c.wave, t.c.status, t.c.updated_at)
        .where(t.c.rollout_id == rollout_id)
        .order_by(t.c.wave, t.c.device_id)
    )
    with reading(bind) as conn:
        return [RolloutDevice(**row._asdict()) for row in conn.execute(query)]


HOLD_CHUNK = 500
"""Device ids per query of :func:`rollouts_on_devices` (bound parameters per statement)."""


def rollouts_on_devices(
    bind: Bind, device_ids: Collection[str], states: Collection[str]
) -> list[tuple[str, str, str, str]]:
    """(rollout id, rollout state, device id, device status) of every device among
    ``device_ids`` in a rollout whose state is one of ``states``, by rollout then device."""
    ids = sorted(set(device_ids))
    t, r = rollout_devices, rollouts
    out: list[tuple[str, str, str, str]] = []
    with reading(bind) as conn:
        for i in range(0, len(ids), HOLD_CHUNK):
            query = (
                sa.select(t.c.rollout_id, r.c.state, t.c.device_id, t.c.status)
                .join(r, r.c.rollout_id == t.c.rollout_id)
                .where(r.c.state.in_(list(states)), t.c.device_id.in_(ids[i : i + HOLD_CHUNK]))
            )
            out += [(a, b, c, d) for a, b, c, d in conn.execute(query)]
    return sorted(out)
