"""Shaping stored decisions for a reader: the best score of a row's outputs, the line a
decision counts for, and the review attached to it; pure functions, no database."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Review:
    """The current review of a decision: its ground-truth label.

    Attributes:
        seq: the review's place in the review log (the labels feed's cursor).
        decided: the outcome the device decided.
        verdict: ``confirm`` or ``override``.
        outcome: the outcome the reviewer says is right (the label).
        note: the reviewer's note ('' for none).
        reviewer: who reviewed (a user name, or ``@operator-token``).
        reviewed_at: when (Unix seconds).
    """

    seq: int
    decided: str
    verdict: str
    outcome: str
    note: str
    reviewer: str
    reviewed_at: float


@dataclass(frozen=True)
class DecisionSummary:
    """One row of the decision list (and of the CSV export).

    Attributes:
        id: the device's UUIDv7 of the decision.
        ts: decision time (Unix seconds).
        capture_time: capture time of the frame or reading (None if the row has none).
        device_id: the deciding device.
        site: the device's ``site`` label ('' without one).
        line: the line the decision counts for (:func:`line_of`).
        source: camera or sensor.
        outcome: what the device decided.
        model_name: the (first) model of the pipeline.
        model_version: its version.
        bundle_digest: digest of the bundle that decided ('' if the row has none).
        top_score: the best score of the outputs (:func:`top_result`), if any.
        top_label: the label of that score, if any.
        e2e_ms: capture to decision, ms, if recorded.
        review: the current review, or None.
        station: the station whose PLC trigger it answers ('' for a free-running
            pipeline).
        part_id: the part id the PLC passed ('' when none).
        deadline_missed: the station's deadline passed first: the PLC got the station's
            fail-safe result, not this decision's.
    """

    id: str
    ts: float
    capture_time: float | None
    device_id: str
    site: str
    line: str
    source: str
    outcome: str
    model_name: str
    model_version: str
    bundle_digest: str
    top_score: float | None
    top_label: str | None
    e2e_ms: float | None
    review: Review | None
    station: str = ""
    part_id: str = ""
    deadline_missed: bool = False


def line_of(payload: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    """The line a decision counts for: the ``line`` the device wrote into the row, or,
    when it wrote none (a camera configured without a line), the device's ``line``
    label; '' when neither says."""
    line = payload.get("line")
    if isinstance(line, str) and line:
        return line
    return labels.get("line", "")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _first_scored(entries: Any) -> tuple[float, str | None] | None:
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        return None
    score = _number(entries[0].get("score"))
    if score is None:
        return None
    label = entries[0].get("label")
    return score, label if isinstance(label, str) else None


def top_result(outputs: Any) -> tuple[float | None, str | None]:
    """The primary model's best score and its label, from a row's ``outputs``: a
    classification's first ``top_k`` entry, a score model's ``score``, or a detector's
    first (best) box; ``(None, None)`` when the outputs hold none of these."""
    if not isinstance(outputs, dict):
        return None, None
    for key in ("top_k", "boxes"):
        found = _first_scored(outputs.get(key))
        if found is not None:
            return found
    return _number(outputs.get("score")), None


def summarize(
    row: Mapping[Any, Any], labels: Mapping[str, str], review: Review | None
) -> DecisionSummary:
    """The list row of a stored decision (``row``: the ``decisions`` columns) whose
    device has ``labels``. The station fields come from their columns (the fleet's
    copy of what the row said, filtered on), not from the payload."""
    payload: Mapping[str, Any] = row["payload"] or {}
    score, label = top_result(payload.get("outputs"))
    digest = payload.get("bundle_digest")
    return DecisionSummary(
        id=row["id"],
        ts=row["ts"],
        capture_time=_number(payload.get("capture_time")),
        device_id=row["device_id"],
        site=labels.get("site", ""),
        line=line_of(payload, labels),
        source=row["source"],
        outcome=row["outcome"],
        model_name=row["model_name"],
        model_version=row["model_version"],
        bundle_digest=digest if isinstance(digest, str) else "",
        top_score=score,
        top_label=label,
        e2e_ms=_number(payload.get("e2e_ms")),
        review=review,
        station=row["station"],
        part_id=row["part_id"],
        deadline_missed=bool(row["deadline_missed"]),
    )
