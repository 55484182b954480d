"""Request and response bodies of the decision review endpoints
(:mod:`fleet_server.api.decisions`), and their conversion from
:mod:`fleet_server.review`'s types."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fleet_server.api.models import ApiModel
from fleet_server.review import (
    Accuracy,
    DecisionDetail,
    DecisionSummary,
    Label,
    OutcomeScore,
    Page,
    Review,
    ShadowComparison,
    ShadowSideView,
    Verdict,
    comparison_url,
    encode_cursor,
    image_url,
    merged,
)
from fleet_server.review.reviews import MAX_NOTE

IMAGE_NOTE = (
    "The thumbnail the device kept in its decision log and uploaded: the whole frame "
    "scaled down; boxes are in frame pixels (outputs.frame is the frame's size)."
)
NO_IMAGE_NOTE = (
    "No image uploaded: the device keeps thumbnails of the decisions its [decision_log] "
    "thumbnails setting names ('non-pass' by default) and uploads them unless [uplink] "
    "upload_thumbnails is off; one may also still be on its way."
)


class ReviewIn(BaseModel):
    """A review: confirm the device's outcome, or override it with the right one."""

    model_config = ConfigDict(extra="forbid")

    verdict: Verdict = Field(description="'confirm' or 'override'.")
    outcome: str | None = Field(
        None,
        max_length=200,
        description="The right outcome: needed to override (and other than the device's); "
        "to confirm, leave it out or give the device's own.",
    )
    note: str = Field("", max_length=MAX_NOTE, description="Why, for the record.")


class ReviewOut(ApiModel):
    """A review of a decision; the current one is the decision's ground-truth label."""

    seq: int = Field(description="Its place in the review log (the labels feed's cursor).")
    decided: str = Field(description="What the device decided.")
    verdict: str = Field(description="'confirm' or 'override'.")
    outcome: str = Field(description="The outcome the reviewer says is right.")
    note: str = Field(description="The reviewer's note.")
    reviewer: str = Field(description="Who reviewed (user name, or '@operator-token').")
    reviewed_at: float = Field(description="When (Unix seconds).")


def review_out(review: Review) -> ReviewOut:
    """The API form of a review."""
    return ReviewOut(**vars(review))


class DecisionRowOut(ApiModel):
    """One row of the decision table."""

    id: str = Field(description="The device's UUIDv7 of the decision.")
    ts: float = Field(description="Decision time (Unix seconds).")
    capture_time: float | None = Field(description="Capture time of the frame or reading.")
    device_id: str = Field(description="The deciding device.")
    site: str = Field(description="The device's site label ('' without one).")
    line: str = Field(description="The row's line, else the device's line label.")
    source: str = Field(description="Camera or sensor.")
    outcome: str = Field(description="What the device decided.")
    model_name: str = Field(description="The (first) model of the pipeline.")
    model_version: str = Field(description="Its version.")
    bundle_digest: str = Field(description="Digest of the bundle that decided.")
    top_score: float | None = Field(description="Best score of the model's outputs.")
    top_label: str | None = Field(description="Label of that score.")
    e2e_ms: float | None = Field(description="Capture to decision, ms.")
    station: str = Field(description="The station whose PLC trigger it answers ('' none).")
    part_id: str = Field(description="The part id the PLC passed ('' when none).")
    deadline_missed: bool = Field(
        description="The station's deadline passed first: the PLC got the fail-safe result."
    )
    reviewed: bool = Field(description="Someone reviewed it.")
    reviewed_outcome: str | None = Field(description="The outcome the current review set.")
    review: ReviewOut | None = Field(description="The current review.")
    image: str | None = Field(
        description="Path of the decision's image (a JPEG thumbnail of the frame), null "
        "when its device uploaded none."
    )
    path: str = Field(
        description="Path of this decision in the API: its id and its device (two devices "
        "may have used the same id; each path names one decision)."
    )


def row_out(row: DecisionSummary, has_image: bool = False) -> DecisionRowOut:
    """The API form of a list row."""
    fields = {k: v for k, v in vars(row).items() if k != "review"}
    r = row.review
    return DecisionRowOut(
        **fields,
        reviewed=r is not None,
        reviewed_outcome=None if r is None else r.outcome,
        review=None if r is None else review_out(r),
        image=image_url(row.id, row.device_id) if has_image else None,
        path=decision_path(row.id, row.device_id),
    )


def decision_path(decision_id: str, device_id: str) -> str:
    """The API path of the decision ``decision_id`` of ``device_id``."""
    query = urllib.parse.urlencode({"device": device_id})
    return f"/api/v1/decisions/{urllib.parse.quote(decision_id, safe='')}?{query}"


class DecisionPageOut(ApiModel):
    """A page of decisions, newest first (by decision time, then id)."""

    rows: list[DecisionRowOut] = Field(description="The decisions.")
    next_cursor: str | None = Field(
        description="Pass as cursor (with the same filters) for the next page; null on the last."
    )
    limit: int = Field(description="The page size asked for.")


def page_out(
    page: Page, limit: int, images: Mapping[tuple[str, str], tuple[int, int]] | None = None
) -> DecisionPageOut:
    """The API form of a page; ``images`` holds the (device id, decision id) of its
    decisions with an image."""
    cursor = None if page.next_cursor is None else encode_cursor(page.next_cursor)
    have = images or {}
    return DecisionPageOut(
        rows=[row_out(r, (r.device_id, r.id) in have) for r in page.rows],
        next_cursor=cursor,
        limit=limit,
    )


class BoxOut(ApiModel):
    """A box to draw on the frame, in frame pixels (x1, y1, x2, y2)."""

    box: list[float] = Field(description="x1, y1, x2, y2 in frame pixels.")
    score: float | None = Field(description="Its score.")
    label: str | None = Field(description="Its label.")
    kind: str = Field(description="'detection' (the first model) or 'crop' (the next one).")


def _boxes(outputs: Any) -> list[BoxOut]:
    if not isinstance(outputs, dict):
        return []
    out = []
    for key, kind in (("boxes", "detection"), ("crops", "crop")):
        entries = outputs.get(key)
        for entry in entries if isinstance(entries, list) else []:
            box = entry.get("box") if isinstance(entry, dict) else None
            if not (isinstance(box, list) and len(box) == 4):
                continue
            if not all(isinstance(v, (int, float)) for v in box):
                continue
            score, label = entry.get("score"), entry.get("label")
            out.append(
                BoxOut(
                    box=[float(v) for v in box],
                    score=float(score) if isinstance(score, (int, float)) else None,
                    label=label if isinstance(label, str) else None,
                    kind=kind,
                )
            )
    return out


class ShadowSideOut(ApiModel):
    """One model's side of a shadow comparison."""

    model_name: str = Field(description="Bundle (model) name.")
    model_version: str = Field(description="Its version.")
    release: int | None = Field(description="Its release, when known.")
    outcome: str = Field(description="Its outcome under the live pipeline's policy.")
    latency_ms: float | None = Field(description="Its inference latency (queue + infer), ms.")
    outputs: dict[str, Any] = Field(
        description="Its post-processed outputs (top_k / score, or boxes in frame pixels)."
    )


class ShadowOut(ApiModel):
    """What a candidate in the device's shadow slot said about the same frame (it never
    acted: the live model decided)."""

    ts: float = Field(description="When the device compared (Unix seconds).")
    line: str = Field(description="The line the device named.")
    agree: bool = Field(description="Both models gave the same outcome.")
    live: ShadowSideOut = Field(description="The live model (it decided).")
    candidate: ShadowSideOut = Field(description="The candidate in the shadow slot.")
    iou_threshold: float | None = Field(description="IoU a box match needed.")
    matched: int = Field(description="Detections matched (same label, IoU >= threshold).")
    unmatched_live: int = Field(description="Live detections with no candidate match.")
    unmatched_candidate: int = Field(description="Candidate detections with no live match.")
    image: str = Field(
        description="Path of a PNG with both models' outputs drawn (live in blue, the "
        "candidate in magenta, a legend naming both versions)."
    )


def _side_out(side: ShadowSideView) -> ShadowSideOut:
    return ShadowSideOut(**vars(side))


def shadow_out(shadow: ShadowComparison, decision_id: str, device_id: str) -> ShadowOut:
    """The API form of a decision's shadow comparison."""
    return ShadowOut(
        ts=shadow.ts,
        line=shadow.line,
        agree=shadow.agree,
        live=_side_out(shadow.live),
        candidate=_side_out(shadow.candidate),
        iou_threshold=shadow.iou_threshold,
        matched=shadow.matched,
        unmatched_live=shadow.unmatched_live,
        unmatched_candidate=shadow.unmatched_candidate,
        image=comparison_url(decision_id, device_id),
    )


class DecisionDetailOut(DecisionRowOut):
    """A decision in whole: the table row's fields and what the device recorded."""

    decision_time: float | None = Field(description="Decision time the device recorded.")
    backend: str | None = Field(description="Inference backend.")
    config_hash: str | None = Field(description="Hash of the device's decision config.")
    input_digest: str | None = Field(description="Digest of the model input.")
    outputs: dict[str, Any] = Field(description="Post-processed model outputs.")
    boxes: list[BoxOut] = Field(description="Boxes of the outputs, to draw on the image.")
    thresholds: dict[str, Any] = Field(description="Thresholds the policy applied.")
    latencies_ms: dict[str, Any] = Field(description="Per stage, ms.")
    thumbnail_on_device: str | None = Field(description="Thumbnail path on the device, if kept.")
    image_width: int | None = Field(description="The image's width in pixels (null: none).")
    image_height: int | None = Field(description="The image's height in pixels (null: none).")
    image_note: str = Field(description="What the image is, or why there is none.")
    device_labels: dict[str, str] = Field(description="The device's labels.")
    history: list[ReviewOut] = Field(description="Its reviews, newest first.")
    payload: dict[str, Any] = Field(description="The row as the device uploaded it.")
    shadow: ShadowOut | None = Field(
        None,
        description="The shadow comparison of this frame: a candidate's outcome and "
        "outputs (null: the frame was not sampled for a shadow).",
    )
    label_agrees_with: str | None = Field(
        None,
        description="Which model the current label agrees with: live, candidate, both or "
        "neither (null without a shadow comparison or a label).",
    )


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def detail_out(
    detail: DecisionDetail, image_size: tuple[int, int] | None = None
) -> DecisionDetailOut:
    """The API form of a decision in whole; ``image_size`` is its image's (width,
    height), None without one."""
    p = detail.payload
    decided_at = p.get("decision_time")
    thumb = _str(p.get("thumbnail"))
    width, height = image_size if image_size is not None else (None, None)
    return DecisionDetailOut(
        **row_out(detail.summary, image_size is not None).model_dump(),
        decision_time=float(decided_at) if isinstance(decided_at, (int, float)) else None,
        backend=_str(p.get("backend")),
        config_hash=_str(p.get("config_hash")),
        input_digest=_str(p.get("input_digest")),
        outputs=_dict(p.get("outputs")),
        boxes=_boxes(p.get("outputs")),
        thresholds=_dict(p.get("thresholds")),
        latencies_ms=_dict(p.get("latencies_ms")),
        thumbnail_on_device=thumb or None,
        image_width=width,
        image_height=height,
        image_note=NO_IMAGE_NOTE if image_size is None else IMAGE_NOTE,
        device_labels=detail.labels,
        history=[review_out(r) for r in detail.history],
        payload=p,
        shadow=None
        if detail.shadow is None
        else shadow_out(detail.shadow, detail.summary.id, detail.summary.device_id),
        label_agrees_with=detail.label_agrees_with,
    )


class ConfusionOut(ApiModel):
    """How often the device decided one outcome and the review set another (or the same)."""

    decided: str = Field(description="What the device decided.")
    reviewed: str = Field(description="What the review set.")
    count: int = Field(description="How many reviews.")


class OutcomeScoreOut(ApiModel):
    """Precision and recall of one outcome, each with its Wilson interval."""

    outcome: str = Field(description="The outcome.")
    correct: int = Field(description="Reviews where the device and the reviewer both said it.")
    decided: int = Field(description="Reviewed decisions the device called it.")
    labelled: int = Field(description="Reviewed decisions the reviewer labelled it.")
    precision: float | None = Field(
        description="correct / decided: of the device's calls of it, the share the reviewer "
        "confirmed (null when the device never called it)."
    )
    precision_lower: float = Field(description="Lower Wilson bound of precision.")
    precision_upper: float = Field(description="Upper Wilson bound of precision.")
    recall: float | None = Field(
        description="correct / labelled: of the decisions the reviewer labelled it, the "
        "share the device called it (null when the reviewer never labelled it)."
    )
    recall_lower: float = Field(description="Lower Wilson bound of recall.")
    recall_upper: float = Field(description="Upper Wilson bound of recall.")


def _outcome_out(score: OutcomeScore) -> OutcomeScoreOut:
    p, r = score.precision, score.recall
    return OutcomeScoreOut(
        outcome=score.outcome,
        correct=p.hits,
        decided=p.n,
        labelled=r.n,
        precision=p.value,
        precision_lower=p.lower,
        precision_upper=p.upper,
        recall=r.value,
        recall_lower=r.lower,
        recall_upper=r.upper,
    )


class AccuracyGroupOut(ApiModel):
    """Accuracy of one group of reviewed decisions."""

    key: dict[str, str] = Field(description="The group's values, by group key.")
    reviewed: int = Field(description="Reviewed decisions.")
    confirmed: int = Field(description="Reviews that confirmed the device.")
    overridden: int = Field(description="Reviews that changed the outcome.")
    accuracy: float = Field(description="confirmed / reviewed.")
    accuracy_lower: float = Field(
        description="Lower Wilson bound of accuracy at the answer's confidence."
    )
    accuracy_upper: float = Field(
        description="Upper Wilson bound of accuracy at the answer's confidence."
    )
    outcomes: list[OutcomeScoreOut] = Field(
        description="Precision and recall per outcome decided or labelled, by outcome."
    )
    confusion: list[ConfusionOut] = Field(description="Decided -> reviewed outcome counts.")


class AccuracyOut(ApiModel):
    """Accuracy per group, from the reviews (the ground-truth labels)."""

    group: list[str] = Field(description="The group keys.")
    confidence: float = Field(description="Confidence of every interval (0.95: 95 %).")
    groups: list[AccuracyGroupOut] = Field(description="One per group with reviews.")
    total: AccuracyGroupOut | None = Field(description="All groups together (null: none).")


def _group_out(acc: Accuracy) -> AccuracyGroupOut:
    bounds = acc.interval
    return AccuracyGroupOut(
        key=acc.key,
        reviewed=acc.reviewed,
        confirmed=acc.confirmed,
        overridden=acc.overridden,
        accuracy=acc.accuracy,
        accuracy_lower=bounds.lower,
        accuracy_upper=bounds.upper,
        outcomes=[_outcome_out(o) for o in acc.outcomes],
        confusion=[
            ConfusionOut(decided=d, reviewed=r, count=n)
            for (d, r), n in sorted(acc.confusion.items())
        ],
    )


def accuracy_out(group: list[str], groups: list[Accuracy], confidence: float) -> AccuracyOut:
    """The API form of accuracy per group (intervals at ``confidence``)."""
    total = merged(groups)
    return AccuracyOut(
        group=group,
        confidence=confidence,
        groups=[_group_out(a) for a in groups],
        total=None if total is None else _group_out(total),
    )


class LabelOut(ApiModel):
    """A ground-truth label: a decision's current review and what finds its input."""

    seq: int = Field(description="Cursor: ask with since=<the last seq you stored>.")
    decision_id: str = Field(description="The decision.")
    decision_ts: float = Field(description="Its decision time.")
    capture_time: float | None = Field(description="Capture time of its input.")
    device_id: str = Field(description="The deciding device.")
    line: str = Field(description="Its line when reviewed.")
    source: str = Field(description="Camera or sensor.")
    model_name: str = Field(description="Model that decided.")
    model_version: str = Field(description="Its version.")
    bundle_digest: str = Field(description="Bundle that decided.")
    input_digest: str = Field(description="Digest of the model input.")
    thumbnail_on_device: str | None = Field(description="Thumbnail path on the device.")
    decided: str = Field(description="What the device decided.")
    label: str = Field(description="The right outcome (the ground truth).")
    verdict: str = Field(description="'confirm' or 'override'.")
    note: str = Field(description="The reviewer's note.")
    reviewer: str = Field(description="Who reviewed.")
    reviewed_at: float = Field(description="When.")


class LabelsOut(ApiModel):
    """Labels set or changed after ``since``, oldest change first."""

    labels: list[LabelOut] = Field(description="Each decision once, with its newest label.")
    next_since: int = Field(description="Ask with this next (the last seq here, or since).")


def labels_out(labels: list[Label], since: int) -> LabelsOut:
    """The API form of a labels batch."""
    return LabelsOut(
        labels=[LabelOut(**vars(label)) for label in labels],
        next_since=labels[-1].seq if labels else since,
    )
