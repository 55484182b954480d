"""Decision review: what line managers see of the decisions devices uploaded, their
reviews (the ground-truth labels), accuracy from those labels and CSV export.

- :mod:`~fleet_server.review.filters`: filters, the keyset cursor, limits (pure).
- :mod:`~fleet_server.review.rows`: list rows, best score, a decision's line (pure).
- :mod:`~fleet_server.review.query`: the filtered, keyset-paginated list.
- :mod:`~fleet_server.review.reviews`: a decision in whole; confirming or overriding it.
- :mod:`~fleet_server.review.labels`: the labels feed and accuracy per group.
- :mod:`~fleet_server.review.export`: CSV of a filtered list, streamed.
- :mod:`~fleet_server.review.images`: a decision's image (the thumbnail its device
  uploaded).

docs/decision-review.md describes the whole; the HTTP endpoints are in
:mod:`fleet_server.api.decisions`.
"""

from __future__ import annotations

from fleet_server.review.errors import BadQuery, BadReview, NoImage, ReviewError, UnknownDecision
from fleet_server.review.export import COLUMNS, MAX_EXPORT_ROWS, check_export_size, export_csv
from fleet_server.review.filters import (
    DEFAULT_LIMIT,
    FILTER_PARAMS,
    MAX_LIMIT,
    Cursor,
    DecisionFilter,
    decode_cursor,
    encode_cursor,
    parse_filter,
)
from fleet_server.review.images import (
    IMAGE_PATH,
    ImageRecord,
    decision_image,
    etag,
    image_sizes,
    image_sizes_by_device,
    image_url,
)
from fleet_server.review.labels import (
    GROUP_KEYS,
    MAX_LABELS,
    Accuracy,
    Label,
    accuracy,
    labels_since,
    parse_group,
)
from fleet_server.review.query import Page, list_decisions
from fleet_server.review.reviews import (
    VERDICTS,
    DecisionDetail,
    Verdict,
    get_decision,
    save_review,
)
from fleet_server.review.rows import DecisionSummary, Review, line_of, top_result

__all__ = [
    "COLUMNS",
    "DEFAULT_LIMIT",
    "FILTER_PARAMS",
    "GROUP_KEYS",
    "IMAGE_PATH",
    "MAX_EXPORT_ROWS",
    "MAX_LABELS",
    "MAX_LIMIT",
    "VERDICTS",
    "Accuracy",
    "BadQuery",
    "BadReview",
    "Cursor",
    "DecisionDetail",
    "DecisionFilter",
    "DecisionSummary",
    "ImageRecord",
    "Label",
    "NoImage",
    "Page",
    "Review",
    "ReviewError",
    "UnknownDecision",
    "Verdict",
    "accuracy",
    "check_export_size",
    "decision_image",
    "decode_cursor",
    "encode_cursor",
    "etag",
    "export_csv",
    "get_decision",
    "image_sizes",
    "image_sizes_by_device",
    "image_url",
    "labels_since",
    "line_of",
    "list_decisions",
    "parse_filter",
    "parse_group",
    "save_review",
    "top_result",
]
