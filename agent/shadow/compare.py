"""Comparing the candidate's result with the live one on the same frame. Pure: no I/O.

The outcomes (each model's result decided by the LIVE pipeline's policy) agree or not;
for detections, boxes are matched greedily: all pairs with the same label and an IoU at
least the threshold, best IoU first, each box in at most one pair. A live box left over is
``unmatched_live``, a candidate box left over ``unmatched_shadow``. Classification and
score results have no boxes: all three counts are 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.pipeline.postprocess import Detection, Result

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class BoxMatch:
    """How two lists of detections pair up."""

    matched: int
    unmatched_live: int
    unmatched_shadow: int


@dataclass(frozen=True)
class Comparison:
    """The verdict on one frame: whether the outcomes agree, and the box match."""

    agree: bool
    live_outcome: str
    shadow_outcome: str
    boxes: BoxMatch


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two (x1, y1, x2, y2) boxes; 0 for two empty boxes."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, w) * max(0.0, h)
    area_a = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1])
    area_b = max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])
    union = area_a + area_b - inter
    return inter / union if union > 0 else 0.0


def match_detections(
    live: Sequence[Detection], shadow: Sequence[Detection], iou_threshold: float
) -> BoxMatch:
    """Greedy one-to-one matching by IoU (best first) of boxes with the same label.

    Raises:
        ValueError: ``iou_threshold`` is outside 0..1.
    """
    if not 0.0 <= iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must be 0..1, got {iou_threshold}")
    pairs = [
        (v, i, j)
        for i, a in enumerate(live)
        for j, b in enumerate(shadow)
        if a.label == b.label and (v := iou(a.box, b.box)) >= iou_threshold and v > 0
    ]
    pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
    used_live: set[int] = set()
    used_shadow: set[int] = set()
    for _, i, j in pairs:
        if i in used_live or j in used_shadow:
            continue
        used_live.add(i)
        used_shadow.add(j)
    n = len(used_live)
    return BoxMatch(n, len(live) - n, len(shadow) - n)


def compare(
    live: Result,
    live_outcome: str,
    shadow: Result,
    shadow_outcome: str,
    iou_threshold: float = 0.5,
) -> Comparison:
    """Compare one frame's two results: agreement of the outcomes, and for detections the
    box match (:func:`match_detections`).

    Raises:
        ValueError: ``iou_threshold`` is outside 0..1.
    """
    boxes = match_detections(live.detections, shadow.detections, iou_threshold)
    return Comparison(live_outcome == shadow_outcome, live_outcome, shadow_outcome, boxes)
