"""The manifest's ``postprocess`` section: how a model's outputs become a result.

One model per kind, told apart by ``kind``; the agent's implementation is
:mod:`agent.pipeline.postprocess`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from agent.wire.base import WireModel

POSTPROCESS_KINDS = ("classification", "score", "detection")


class ClassificationPost(WireModel):
    """Top-k classes from one output of scores."""

    kind: Literal["classification"] = Field(description="Discriminator.")
    output: str | None = Field(None, description="Output name; None: the first output.")
    top_k: int = Field(5, ge=1, le=1000, description="How many classes to report.")
    softmax: bool = Field(False, description="Apply softmax to the output first (logits).")
    labels: list[str] | None = Field(None, description="Class names, by class index.")


class ScorePost(WireModel):
    """One score read from a named output."""

    kind: Literal["score"] = Field(description="Discriminator.")
    output: str | None = Field(None, description="Output name; None: the first output.")
    index: int = Field(0, ge=0, description="Flat index of the score in the output.")
    label: str | None = Field(None, description="What the score means (e.g. 'defect').")


class DetectionPost(WireModel):
    """Detections above a threshold, with non-maximum suppression."""

    kind: Literal["detection"] = Field(description="Discriminator.")
    format: Literal["boxes", "heatmap"] = Field(
        description=(
            "'boxes': rows [x1, y1, x2, y2, score(, class)]; 'heatmap': a probability map "
            "[1, 1, H, W] or [1, H, W] whose regions above threshold become boxes."
        )
    )
    output: str | None = Field(None, description="Output name; None: the first output.")
    threshold: float = Field(0.5, ge=0.0, le=1.0, description="Minimum score of a detection.")
    nms_iou: float = Field(
        0.5, ge=0.0, le=1.0, description="Boxes overlapping a better one above this IoU go."
    )
    max_detections: int = Field(100, ge=1, le=10000, description="Keep at most this many.")
    labels: list[str] | None = Field(
        None, description="Class names by class index ('heatmap': labels[0] names every region)."
    )
    min_area: float = Field(0.0, ge=0.0, description="Minimum box area, in frame pixels.")
    normalized: bool = Field(
        False, description="'boxes' only: coordinates are in [0, 1], not input pixels."
    )
    unclip_ratio: float = Field(
        0.0,
        ge=0.0,
        le=10.0,
        description=(
            "'heatmap' only: grow each region by area * ratio / perimeter pixels "
            "(DB text detectors shrink their regions; PP-OCR uses 1.5)."
        ),
    )


Postprocess = Annotated[ClassificationPost | ScorePost | DetectionPost, Field(discriminator="kind")]
