"""A decision's image: the JPEG thumbnail its device kept in its decision log and
uploaded after the decision (``[decision_log] thumbnails``, ``[uplink]
upload_thumbnails``), stored by :mod:`fleet_server.db.images`.

An image is shown only with the decision of the device that uploaded it, and it never
changes once stored (the first upload of a decision by its device is kept), so a page
may cache it. A decision is (device, id): its image's URL names the device
(``?device=``), so that an id another device also used never shows that one's image.
:func:`image_sizes_by_device` gives the sizes of a page's images in one query.
"""

from __future__ import annotations

import hashlib
import urllib.parse

from fleet_server.db._tx import Bind, reading
from fleet_server.db.store import ImageRecord, get_image, image_sizes, image_sizes_by_device
from fleet_server.review.errors import NoImage
from fleet_server.review.reviews import decision_row

__all__ = [
    "IMAGE_PATH",
    "ImageRecord",
    "decision_image",
    "etag",
    "image_sizes",
    "image_sizes_by_device",
    "image_url",
]

IMAGE_PATH = "/api/v1/decisions/{}/image"
"""The API's path of a decision's image (``fleet_server.api.decisions``)."""


def image_url(decision_id: str, device_id: str | None = None) -> str:
    """The path the API serves ``decision_id``'s image at (for ``<img src>``), of the
    decision of ``device_id`` when given."""
    path = IMAGE_PATH.format(urllib.parse.quote(decision_id, safe=""))
    if device_id is None:
        return path
    return f"{path}?{urllib.parse.urlencode({'device': device_id})}"


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
