"""Decision thumbnails: stored once per (decision id, device), shown only with the
decision of the same device (a device can't put its picture under another device's
decision, nor keep that device's own picture out)."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import sqlalchemy as sa

from fleet_server.db._tx import Bind, reading
from fleet_server.db.records import insert_new
from fleet_server.db.tables import decision_images, decisions


@dataclass(frozen=True)
class ImageRecord:
    """A decision's thumbnail: ``data`` is the image file (a JPEG)."""

    decision_id: str
    device_id: str
    ts: float
    content_type: str
    width: int
    height: int
    data: bytes


def insert_images(bind: Bind, rows: Iterable[ImageRecord], now: float | None = None) -> int:
    """Store the images not stored yet; returns how many were new."""
    received = time.time() if now is None else now
    return insert_new(
        bind,
        decision_images,
        (
            {
                "decision_id": r.decision_id,
                "device_id": r.device_id,
                "ts": r.ts,
                "content_type": r.content_type,
                "width": r.width,
                "height": r.height,
                "size": len(r.data),
                "data": r.data,
                "received_at": received,
            }
            for r in rows
        ),
    )


_SAME_DEVICE = sa.and_(
    decisions.c.id == decision_images.c.decision_id,
    decisions.c.device_id == decision_images.c.device_id,
)


def get_image(bind: Bind, decision_id: str, device_id: str | None = None) -> ImageRecord | None:
    """The image of a stored decision, by the device that made the decision; None if the
    decision or its image is not stored. Without ``device_id`` (ids are per device),
    the first device's by id when several devices used the id: callers that show an
    image name the device."""
    c = decision_images.c
    query = (
        sa.select(c.decision_id, c.device_id, c.ts, c.content_type, c.width, c.height, c.data)
        .select_from(decision_images.join(decisions, _SAME_DEVICE))
        .where(c.decision_id == decision_id)
        .order_by(c.device_id)
        .limit(1)
    )
    if device_id is not None:
        query = query.where(c.device_id == device_id)
    with reading(bind) as conn:
        row = conn.execute(query).first()
    if row is None:
        return None
    return ImageRecord(
        row.decision_id, row.device_id, row.ts, row.content_type, row.width, row.height,
        bytes(row.data),
    )  # fmt: skip


def image_sizes_by_device(
    bind: Bind, keys: Collection[tuple[str, str]]
) -> dict[tuple[str, str], tuple[int, int]]:
    """(width, height) of the images of these stored decisions, by (device id,
    decision id) (those without one left out)."""
    if not keys:
        return {}
    c = decision_images.c
    wanted = set(keys)
    ids = sorted({decision_id for _, decision_id in wanted})
    query = (
        sa.select(c.device_id, c.decision_id, c.width, c.height)
        .select_from(decision_images.join(decisions, _SAME_DEVICE))
        .where(c.decision_id.in_(ids))
    )
    with reading(bind) as conn:
        found = {(r.device_id, r.decision_id): (r.width, r.height) for r in conn.execute(query)}
    return {k: v for k, v in found.items() if k in wanted}


def image_sizes(bind: Bind, decision_ids: Collection[str]) -> dict[str, tuple[int, int]]:
    """(width, height) of the images of these stored decisions, by decision id (those
    without one left out). Ids are per device: when several devices used an id, this
    can't tell their images apart; :func:`image_sizes_by_device` can."""
    if not decision_ids:
        return {}
    c = decision_images.c
    query = (
        sa.select(c.decision_id, c.width, c.height)
        .select_from(decision_images.join(decisions, _SAME_DEVICE))
        .where(c.decision_id.in_(sorted(set(decision_ids))))
    )
    with reading(bind) as conn:
        return {r.decision_id: (r.width, r.height) for r in conn.execute(query)}
