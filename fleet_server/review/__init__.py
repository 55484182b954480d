"""Decision review: what line managers see of the decisions devices uploaded, their
reviews (the ground-truth labels), accuracy from those labels and CSV export.

- :mod:`~fleet_server.review.filters`: filters, the keyset cursor, limits (pure).
- :mod:`~fleet_server.review.rows`: list rows, best score, a decision's line (pure).
- :mod:`~fleet_server.review.query`: the filtered, keyset-paginated list.
- :mod:`~fleet_server.review.reviews`: a decision in whole; confirming or overriding it.
- :mod:`~fleet_server.review.labels`: the labels feed, accuracy per group and a model
  version's labelled accuracy for the rollout gates.
- :mod:`~fleet_server.review.scores`: accuracy, precision and recall with Wilson
  intervals (pure).
- :mod:`~fleet_server.review.export`: CSV of a filtered list, streamed.
- :mod:`~fleet_server.review.images`: a decision's image (the thumbnail its device
  uploaded), and both models' outputs drawn on it for a shadow comparison
  (:mod:`~fleet_server.review.overlay`).
- :mod:`~fleet_server.review.queue`: a filter's review queue (what is left, what is next).
- :mod:`~fleet_server.review.shadow`: a decision's shadow comparison (the candidate's
  outcome and outputs) and which model a label agrees with.

docs/decision-review.md describes the whole; the HTTP endpoints are in
:mod:`fleet_server.api.decisions`.
"""

from __future__ import annotations

from fleet_server.review.errors import (
    BadQuery,
    BadReview,
    NoImage,
    NoShadow,
    ReviewError,
    UnknownDecision,
)
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
    COMPARISON_PATH,
    IMAGE_PATH,
    ImageRecord,
    comparison_image,
    comparison_url,
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
    labelled_accuracy,
    labels_since,
    merged,
    parse_group,
)
from fleet_server.review.query import Page, list_decisions
from fleet_server.review.queue import MAX_COUNTED, QueuePlace, count_unreviewed, place
from fleet_server.review.reviews import (
    VERDICTS,
    DecisionDetail,
    Verdict,
    get_decision,
    save_review,
)
from fleet_server.review.rows import DecisionSummary, Review, line_of, top_result
from fleet_server.review.scores import (
    DEFAULT_CONFIDENCE,
    OutcomeScore,
    Proportion,
    check_confidence,
    outcome_scores,
    proportion,
)
from fleet_server.review.shadow import (
    RightModel,
    ShadowComparison,
    ShadowSideView,
    right_model,
    shadow_outcomes,
)

__all__ = [
    "COLUMNS",
    "COMPARISON_PATH",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_LIMIT",
    "FILTER_PARAMS",
    "GROUP_KEYS",
    "IMAGE_PATH",
    "MAX_COUNTED",
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
    "NoShadow",
    "OutcomeScore",
    "Page",
    "Proportion",
    "QueuePlace",
    "Review",
    "ReviewError",
    "RightModel",
    "ShadowComparison",
    "ShadowSideView",
    "UnknownDecision",
    "Verdict",
    "accuracy",
    "check_confidence",
    "check_export_size",
    "comparison_image",
    "comparison_url",
    "count_unreviewed",
    "decision_image",
    "decode_cursor",
    "encode_cursor",
    "etag",
    "export_csv",
    "get_decision",
    "image_sizes",
    "image_sizes_by_device",
    "image_url",
    "labelled_accuracy",
    "labels_since",
    "line_of",
    "list_decisions",
    "merged",
    "outcome_scores",
    "parse_filter",
    "parse_group",
    "place",
    "proportion",
    "right_model",
    "save_review",
    "shadow_outcomes",
    "top_result",
]
