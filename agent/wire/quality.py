"""The model-quality messages: shadow comparisons and drift histograms.

A device that runs a candidate bundle in its *shadow* slot compares it with the live
model on a sampled share of the frames (:class:`ShadowRecord`, uploaded in a
:class:`ShadowBatch`) and sums the comparison in its health report
(:class:`ShadowSummary`, ``Health.shadow``). Every device keeps, per model version, line
and hour, fixed-bin histograms of what the model saw and said (:class:`DriftHour`,
uploaded in a :class:`DriftBatch` once the hour is over). Both batches go through the
outbox to :func:`agent.wire.topics.quality`, each record identified by the device and its
own key, so an hour uploaded twice is stored once.

The bin edges are part of the contract (:data:`DRIFT_BINS`): a histogram is a list of
counts, one per bin, and both sides read it against the same edges.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from agent.wire.base import WireModel
from agent.wire.envelope import Count, Finite, Message, RecordId, Timestamp

MAX_SHADOW_RECORDS = 500
"""The most shadow records one batch carries."""
MAX_DRIFT_HOURS = 200
"""The most drift hours one batch carries."""
MAX_CLASSES = 64
"""Top-class counts keep this many labels; the rest are summed under :data:`OTHER`."""
OTHER = "__other__"
HOUR_S = 3600
PERIODS_S = (10, 30, 60, 300, 600, 900, 1800, HOUR_S)
"""Bucket lengths a device may count in: an hour in production; shorter ones let a trial
line (or a test) see drift within minutes."""

DRIFT_BINS: dict[str, tuple[float, ...]] = {
    # score / confidence of the top item: deciles
    "score": (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0000001),
    # detections per frame: 0, 1, 2, 3, 4, 5-9, 10-19, 20+
    "detections": (0, 1, 2, 3, 4, 5, 10, 20, float("inf")),
    # box area as a fraction of the frame, log-spaced
    "box_area": (0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.2, 0.4, 0.7, 1.0000001),
    # mean luma 0..255
    "brightness": (*(float(16 * i) for i in range(16)), 256.0),
    # luma standard deviation 0..128 (and more)
    "contrast": (*(float(8 * i) for i in range(16)), float("inf")),
    # log10 of the variance of the Laplacian of the luma (focus), 0..6 (and more)
    "sharpness": (-1e9, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 1e9),
}
"""Bin edges of each numeric histogram: ``len(edges) - 1`` bins, a value v falls in bin
i when ``edges[i] <= v < edges[i + 1]`` (values below the first edge go to bin 0, above
the last to the last bin)."""


def bin_index(name: str, value: float) -> int:
    """The bin of ``value`` in the histogram ``name`` (clamped to the first and last)."""
    edges = DRIFT_BINS[name]
    last = len(edges) - 2
    for i in range(last + 1):
        if value < edges[i + 1]:
            return i
    return last


class ShadowSummary(WireModel):
    """``Health.shadow``: the shadow comparison since the candidate was installed."""

    bundle: str = Field(description="The candidate bundle's name.")
    version: str = Field(description="The candidate's version.")
    release: int | None = Field(None, ge=0, description="The candidate's release.")
    n: Count = Field(description="Sampled frames the candidate decided.")
    agree: Count = Field(description="Of those, how many got the live outcome.")
    skipped: Count = Field(0, description="Sampled frames skipped: the pool was busy.")
    agreement: Finite | None = Field(None, ge=0, le=1, description="agree / n (none at 0).")
    shadow_p50_ms: Finite | None = Field(None, ge=0, description="Candidate latency p50.")
    shadow_p99_ms: Finite | None = Field(None, ge=0, description="Candidate latency p99.")
    live_p99_ms: Finite | None = Field(None, ge=0, description="Live model latency p99.")

    @model_validator(mode="after")
    def _agree_le_n(self) -> ShadowSummary:
        if self.agree > self.n:
            raise ValueError(f"agree {self.agree} is above n {self.n}")
        return self


class ShadowSide(WireModel):
    """One model's side of a shadow comparison."""

    model_name: str = Field(description="Bundle (model) name.")
    model_version: str = Field(description="Version.")
    release: int | None = Field(None, ge=0, description="Release, when known.")
    outcome: str = Field(description="Outcome under the live pipeline's policy.")
    latency_ms: Finite = Field(
        ge=0,
        description="Worker time, dispatch to completion (preprocess + inference), ms; the "
        "queue wait is left out: a background request waits for live ones by design.",
    )
    outputs: dict[str, object] = Field(
        default_factory=dict, description="Post-processed outputs (label/score or detections)."
    )


class ShadowRecord(WireModel):
    """One sampled frame decided by both the live model and the candidate."""

    decision_id: RecordId = Field(description="The live decision this frame belongs to.")
    ts: Timestamp = Field(description="Unix time of the comparison.")
    source: str = Field(description="Camera or sensor.")
    line: str = Field(description="Production line.")
    live: ShadowSide = Field(description="The live model.")
    shadow: ShadowSide = Field(description="The candidate in the shadow slot.")
    agree: bool = Field(description="Both gave the same outcome.")
    iou_threshold: Finite = Field(0.5, ge=0, le=1, description="IoU for a box match.")
    matched: Count = Field(0, description="Detections matched (same label, IoU >= threshold).")
    unmatched_live: Count = Field(0, description="Live detections with no candidate match.")
    unmatched_shadow: Count = Field(0, description="Candidate detections with no live match.")
    thumbnail: str | None = Field(
        None, description="Thumbnail path on the device (kept when they disagree)."
    )


class ShadowBatch(Message):
    """Shadow records, oldest first."""

    kind: Literal["shadow"] = Field("shadow", description="Message kind.")
    records: Annotated[list[ShadowRecord], Field(min_length=1, max_length=MAX_SHADOW_RECORDS)]


class DriftHour(WireModel):
    """What one model version saw and said on one line in one hour (counts only).

    Identified by (device, model_name, model_version, line, source, hour).
    """

    model_name: str = Field(description="Bundle (model) name.")
    model_version: str = Field(description="Version.")
    line: str = Field(description="Production line.")
    source: str = Field(description="Camera or sensor.")
    hour: int = Field(
        ge=0, description="Start of the bucket (an hour), Unix seconds, a multiple of period_s."
    )
    period_s: int = Field(HOUR_S, description=f"Bucket length, seconds: one of {PERIODS_S}.")
    n: Count = Field(description="Decisions in the hour.")
    outcomes: dict[str, Count] = Field(default_factory=dict, description="Outcome -> count.")
    top_class: dict[str, Count] = Field(
        default_factory=dict, description=f"Top label -> count (at most {MAX_CLASSES} + other)."
    )
    hist: dict[str, list[Count]] = Field(
        default_factory=dict,
        description="Histogram name (a key of DRIFT_BINS) -> counts, one per bin.",
    )

    @model_validator(mode="after")
    def _check(self) -> DriftHour:
        if self.period_s not in PERIODS_S:
            raise ValueError(f"period_s {self.period_s} is not one of {PERIODS_S}")
        if self.hour % self.period_s:
            raise ValueError(f"hour {self.hour} is not a multiple of period_s {self.period_s}")
        if len(self.top_class) > MAX_CLASSES + 1:
            raise ValueError(f"top_class has {len(self.top_class)} labels (max {MAX_CLASSES})")
        for name, counts in self.hist.items():
            edges = DRIFT_BINS.get(name)
            if edges is None:
                raise ValueError(f"hist.{name}: unknown histogram (known: {', '.join(DRIFT_BINS)})")
            if len(counts) != len(edges) - 1:
                raise ValueError(f"hist.{name}: {len(counts)} bins, expected {len(edges) - 1}")
        return self

    def key(self) -> tuple[str, str, str, str, int]:
        return (self.model_name, self.model_version, self.line, self.source, self.hour)


class DriftBatch(Message):
    """Closed hours of drift histograms."""

    kind: Literal["drift"] = Field("drift", description="Message kind.")
    hours: Annotated[list[DriftHour], Field(min_length=1, max_length=MAX_DRIFT_HOURS)]
