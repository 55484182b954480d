"""The ``[drift]`` section: what the decision log's writer counts of each decision for the
fleet's drift check (bucket length, input statistics, how often counts reach the disk)."""

from __future__ import annotations

from pydantic import Field, field_validator

from agent.kernel.configbase import Section
from agent.wire.quality import HOUR_S, PERIODS_S


class DriftConfig(Section):
    """Per model version, line, source and bucket (an hour by default): outcome, top-class,
    score, detection, box-size and input-statistics histograms (counts only), uploaded once
    the bucket is over."""

    enabled: bool = Field(True, description="Count drift histograms of every decision.")
    period_s: int = Field(
        HOUR_S,
        description=f"Bucket length in seconds, one of {', '.join(map(str, PERIODS_S))} (an "
        "hour in production; shorter buckets let a trial line or a test see drift within "
        "minutes). A changed period starts new buckets.",
    )
    image_stats: bool = Field(
        True,
        description="Measure brightness, contrast and sharpness of image inputs (a 64x64 "
        "gray downscale of the frame, on the decision log's writer thread).",
    )
    frame_queue_mb: float = Field(
        32.0,
        gt=0,
        le=4096,
        description="Bytes of frames that may wait for the writer only for their input "
        "statistics (decisions that keep no thumbnail); a frame over it is counted without "
        "them (drift_frames_skipped).",
    )
    flush_interval_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="Longest the counts stay in memory before they are added to the "
        "decision log's drift_hours table.",
    )
    flush_decisions: int = Field(
        2000,
        ge=1,
        le=1_000_000,
        description="Counted decisions after which the counts are added to drift_hours "
        "before flush_interval_s is up.",
    )

    @field_validator("period_s")
    @classmethod
    def _period(cls, value: int) -> int:
        if value not in PERIODS_S:
            raise ValueError(f"must be one of {', '.join(map(str, PERIODS_S))}, got {value}")
        return value
