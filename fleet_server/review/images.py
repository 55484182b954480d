"""A decision's image: the JPEG thumbnail its device kept in its decision log and
uploaded after the decision (``[decision_log] thumbnails``, ``[uplink]
upload_thumbnails``), stored by :mod:`fleet_server.db.images`.

An image is shown only with the decision of the device that uploaded it, and it never
changes once stored (the first upload of a decision by its device is kept), so a page
may cache it.
:func:`image_sizes` gives the sizes of a page's images in one query.
"""

from __future__ import annotations

import hashlib
import urllib.parse

import sqlalchemy as sa

from fleet_server.db._tx import Bind, reading
from fleet_server.db.store import ImageRecord, get_image, image_sizes
from fleet_server.db.tables import decisions
from fleet_server.review.errors import NoImage, UnknownDecision

__all__ = ["IMAGE_PATH", "ImageRecord", "decision_image", "etag", "image_sizes", "image_url"]

IMAGE_PATH = "/api/v1/decisions/{}/image"
"""The API's path of a decision's image (``fleet_server.api.decisions``)."""


def image_url(decision_id: str) -> str:
    """The path the API serves ``decision_id``'s image at (for ``<img src>``)."""
    return IMAGE_PATH.format(urllib.parse.quote(decision_id, safe=""))


def decision_image(bind: Bind, decision_id: str) -> ImageRecord:
    """The stored image of a stored decision, uploaded by the decision's own device.

    Raises:
        UnknownDecision: no such decision.
        NoImage: the decision is stored, an image of it (by its device) is not.
    """
    record = get_image(bind, decision_id)
    if record is not None:
        return record
    with reading(bind) as conn:
        known = conn.execute(sa.select(decisions.c.id).where(decisions.c.id == decision_id)).first()
    if known is None:
        raise UnknownDecision(decision_id)
    raise NoImage(decision_id)


def etag(data: bytes) -> str:
    """A strong ETag of an image's bytes (quoted, as the header carries it)."""
    return '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
