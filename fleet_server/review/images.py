"""A decision's image: the JPEG thumbnail its device kept in its decision log and
uploaded after the decision (``[decision_log] thumbnails``, ``[uplink]
upload_thumbnails``), stored by :mod:`fleet_server.db.images`.

An image is shown only with the decision of the device that uploaded it, and it never
changes once stored (the first upload of a decision by its device is kept), so a page
may cache it. A decision is (device, id): its image's URL names the device
(``?device=``), so that an id another device also used never shows that one's image.
:func:`image_sizes_by_device` gives the sizes of a page's images in one query.

A decision a candidate in the device's shadow slot also decided has a second picture:
:func:`comparison_image`, both models' outputs drawn on the image in two colours with a
legend naming both versions (:mod:`fleet_server.review.overlay`), served as PNG at
:data:`COMPARISON_PATH`. It can change once (the thumbnail may arrive after the shadow
record), so a page revalidates it by its ETag.
"""

from __future__ import annotations

import hashlib
import urllib.parse

from fleet_server.db._tx import Bind, reading
from fleet_server.db.store import ImageRecord, get_image, image_sizes, image_sizes_by_device
from fleet_server.review.errors import NoImage, NoShadow
from fleet_server.review.overlay import Side, comparison_png
from fleet_server.review.reviews import decision_row
from fleet_server.review.shadow import ShadowComparison, shadow_comparison

__all__ = [
    "COMPARISON_PATH",
    "IMAGE_PATH",
    "ImageRecord",
    "comparison_image",
    "comparison_url",
    "decision_image",
    "etag",
    "image_sizes",
    "image_sizes_by_device",
    "image_url",
]

IMAGE_PATH = "/api/v1/decisions/{}/image"
"""The API's path of a decision's image (``fleet_server.api.decisions``)."""
COMPARISON_PATH = "/api/v1/decisions/{}/comparison.png"
"""The API's path of a decision's live-versus-candidate drawing."""


def image_url(decision_id: str, device_id: str | None = None) -> str:
    """The path the API serves ``decision_id``'s image at (for ``<img src>``), of the
    decision of ``device_id`` when given."""
    path = IMAGE_PATH.format(urllib.parse.quote(decision_id, safe=""))
    if device_id is None:
        return path
    return f"{path}?{urllib.parse.urlencode({'device': device_id})}"


def comparison_url(decision_id: str, device_id: str) -> str:
    """The path the API serves the live-versus-candidate drawing of ``decision_id`` of
    ``device_id`` at."""
    path = COMPARISON_PATH.format(urllib.parse.quote(decision_id, safe=""))
    return f"{path}?{urllib.parse.urlencode({'device': device_id})}"


def sides(shadow: ShadowComparison, outcome: str, outputs: object) -> tuple[Side, Side]:
    """The two models to draw: the live decision (its ``outcome`` and ``outputs`` as
    stored with the decision; the shadow record's copy when those are missing) and the
    candidate."""
    live, cand = shadow.live, shadow.candidate
    live_outputs = outputs if isinstance(outputs, dict) else live.outputs
    return (
        Side(f"live {live.model_name} {live.model_version}", outcome, live_outputs),
        Side(f"candidate {cand.model_name} {cand.model_version}", cand.outcome, cand.outputs),
    )


def comparison_image(bind: Bind, decision_id: str, device_id: str | None = None) -> bytes:
    """The PNG of both models' outputs on the decision's image (on a grey frame when its
    device uploaded none).

    Raises:
        UnknownDecision: no such decision (of ``device_id``, when given).
        BadQuery: no device given and several devices used the id.
        NoShadow: no shadow record of the decision is stored.
    """
    with reading(bind) as conn:
        row = decision_row(conn, decision_id, device_id)
        shadow = shadow_comparison(conn, str(row.device_id), decision_id)
    if shadow is None:
        raise NoShadow(decision_id)
    record = get_image(bind, decision_id, str(row.device_id))
    payload = row.payload or {}
    live, candidate = sides(shadow, str(row.outcome), payload.get("outputs"))
    return comparison_png(None if record is None else record.data, live, candidate)


def decision_image(bind: Bind, decision_id: str, device_id: str | None = None) -> ImageRecord:
    """The stored image of a stored decision, uploaded by the decision's own device.

    Raises:
        UnknownDecision: no such decision (of ``device_id``, when given).
        BadQuery: no device given and several devices used the id.
        NoImage: the decision is stored, an image of it (by its device) is not.
    """
    with reading(bind) as conn:
        row = decision_row(conn, decision_id, device_id)
    record = get_image(bind, decision_id, str(row.device_id))
    if record is None:
        raise NoImage(decision_id)
    return record


def etag(data: bytes) -> str:
    """A strong ETag of an image's bytes (quoted, as the header carries it)."""
    return '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
