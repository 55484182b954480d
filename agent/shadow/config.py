"""The ``[shadow]`` section: how a candidate in a bundle's shadow slot runs beside the
live model (sampled share, frame-rate cap, the IoU that matches two detections)."""

from __future__ import annotations

from pydantic import Field

from agent.kernel.configbase import Section

MAX_SHADOW_FPS = 1000.0


class ShadowConfig(Section):
    """A candidate installed as a shadow runs on a sampled share of each pipeline's live
    frames, at background priority and after the live decision; it never acts."""

    enabled: bool = Field(
        True,
        description="Run a bundle's shadow candidate when one is installed (false: the "
        "shadow slot is ignored).",
    )
    sample: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Share of each pipeline's live frames offered to the shadow, 0..1.",
    )
    max_fps: float = Field(
        5.0,
        gt=0,
        le=MAX_SHADOW_FPS,
        description="At most this many shadow frames a second per pipeline.",
    )
    iou_threshold: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Two detections with the same label match when their IoU is at least "
        "this, 0..1.",
    )
