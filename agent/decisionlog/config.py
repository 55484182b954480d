"""Configuration of the decision log: where it lives, how it batches, what it keeps."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agent.kernel.configbase import MAX_MB, MAX_QUEUE, Section

ThumbnailMode = Literal["non-pass", "all", "none"]


class DecisionLogConfig(Section):
    """The decision log: one SQLite row per decision, thumbnails beside it."""

    path: str = Field(
        "decisions.db",
        min_length=1,
        description="The SQLite file, relative to the agent's state directory.",
    )
    thumbnails: ThumbnailMode = Field(
        "non-pass",
        description=(
            "Which decisions keep a JPEG thumbnail: 'non-pass' (every outcome but 'pass'), "
            "'all' or 'none'."
        ),
    )
    pass_sample: float = Field(
        0.0,
        ge=0,
        le=1,
        description=(
            "With thumbnails = 'non-pass': the random share (0..1) of 'pass' decisions "
            "that keep a thumbnail too, so that line managers can label passes and "
            "accuracy is not measured on rejects only; uploaded like the others. "
            "0 (the default) keeps none."
        ),
    )
    thumbnail_max_side: int = Field(
        320, ge=16, le=4096, description="Longest side of a thumbnail in pixels."
    )
    thumbnail_max_bytes: int = Field(
        48_000,
        ge=1_000,
        le=16 * 1024 * 1024,
        description="Largest JPEG kept; the quality is stepped down until it fits.",
    )
    jpeg_quality: int = Field(85, ge=10, le=100, description="First JPEG quality tried.")
    batch_size: int = Field(
        256, ge=1, le=100_000, description="Rows committed in one transaction at most."
    )
    flush_interval_s: float = Field(
        0.2,
        gt=0,
        le=60,
        description="Longest a queued row waits before its batch is committed.",
    )
    queue_bound: int = Field(
        20_000,
        ge=1,
        le=MAX_QUEUE,
        description="Records that may wait for the writer; more are dropped and counted.",
    )
    append_timeout_s: float = Field(
        0.002,
        ge=0,
        le=1,
        description="Longest append() waits for room in a full queue before it drops.",
    )
    thumbnail_queue_mb: float = Field(
        64,
        gt=0,
        le=4096,
        description=(
            "Bytes of images that may wait for the writer; a record over it is logged "
            "without its thumbnail (counted as thumbnails_dropped)."
        ),
    )
    budget_mb: float = Field(
        512,
        gt=0,
        le=MAX_MB,
        description="Disk budget of database, WAL and thumbnails together, in MiB.",
    )
    max_age_days: float = Field(
        30, gt=0, le=36_500, description="Uploaded decisions older than this are deleted."
    )
    retention_interval_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="How often the writer thread applies the age and budget limits.",
    )
