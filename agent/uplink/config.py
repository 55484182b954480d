"""The ``[uplink]`` section: reports to the fleet over MQTT with the device's identity."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from agent.enrollment.identity import IDENTITY_DIR
from agent.kernel.configbase import Section
from agent.uplink.outbox import DEFAULT_DROP_ORDER, full_drop_order
from agent.uplink.pacing import PacingSettings
from agent.wire.messages import MAX_DECISION_ROWS
from agent.wire.quality import MAX_DRIFT_HOURS


class UplinkConfig(Section):
    """Reported state, heartbeats, health, events and decision uploads to the fleet."""

    enabled: bool = Field(False, description="Report to the fleet (needs `edge-agent enroll`).")
    identity_dir: Path = Field(
        IDENTITY_DIR,
        description="The device identity written by `edge-agent enroll`; relative to the "
        "state directory.",
    )
    broker_host: str | None = Field(
        None,
        description="Override of the fleet broker's host (default: the one enrollment gave); "
        "for the device's one fleet session: uplink, directives and bundle fetches.",
    )
    broker_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Override of the fleet broker's TLS port (default: from enrollment).",
    )
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keepalive in seconds.")
    reconnect_max_s: int = Field(
        30, ge=1, le=3600, description="Longest wait between reconnection attempts."
    )
    heartbeat_interval_s: float = Field(
        1.0, gt=0, le=3600, description="Seconds between heartbeats."
    )
    heartbeat_qos: Literal[0, 1] = Field(
        0, description="MQTT QoS of heartbeats (0: no acknowledgement, half the traffic)."
    )
    health_interval_s: float = Field(
        10.0, gt=0, le=3600, description="Seconds between health reports."
    )
    decisions_batch: int = Field(
        200, ge=1, le=MAX_DECISION_ROWS, description="Most decision rows in one upload."
    )
    upload_thumbnails: bool = Field(
        True,
        description="Upload the JPEG thumbnail the decision log keeps of a decision "
        "([decision_log] thumbnails), after the decision, for the fleet's review pages.",
    )
    decisions_interval_s: float = Field(
        2.0, gt=0, le=3600, description="Seconds between looks for decisions to upload."
    )
    quality_interval_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Seconds between looks for model-quality data to upload: shadow "
        "comparisons, and drift buckets that are over (bucket end + 60 s) and changed "
        "since their last upload.",
    )
    quality_batch: int = Field(
        200,
        ge=1,
        le=MAX_DRIFT_HOURS,
        description="Most shadow comparisons or drift buckets in one upload (fewer when "
        "the payload would be over the size cap).",
    )
    ack_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="How long an outbox record waits for the broker's PUBACK before it is "
        "sent again.",
    )
    max_queued_messages: int = Field(
        1000,
        ge=10,
        le=100_000,
        description="Messages held in memory while unacknowledged or offline; past it a "
        "publish is refused and counted.",
    )

    outbox: Path = Field(
        Path("outbox.db"),
        description="The store-and-forward outbox (SQLite) of health reports, events and "
        "decision batches; relative to the state directory.",
    )
    outbox_max_mb: float = Field(
        64.0,
        gt=0,
        le=1_000_000,
        description="The outbox's share of the device's disk budget (MiB of records); past "
        "it records are dropped in drop_order, counted, and an alarm is raised.",
    )
    drop_order: list[str] = Field(
        list(DEFAULT_DROP_ORDER),
        description="Which records the outbox drops first when over its budget: an order "
        "of thumbnail, quality, health, event, decisions (default: thumbnails first, "
        "decisions last); an order without thumbnail drops thumbnails first, one without "
        "quality drops quality batches right after thumbnails (their rows stay in the "
        "decision log and are queued again).",
    )
    drain_rate_per_s: float = Field(
        200.0,
        gt=0,
        le=100_000,
        description="Most outbox records published a second (a decision batch is one), so "
        "that a long outage's backlog leaves room for live traffic.",
    )
    drain_window: int = Field(
        32, ge=1, le=1000, description="Most outbox records waiting for their PUBACK at once."
    )
    drain_pacing: Literal["headroom", "fixed"] = Field(
        "headroom",
        description="How the drain's rate follows the line: headroom paces it by the hot "
        "path's live e2e p99 against its idle p99 (AIMD, drain_rate_per_s its cap; the "
        "fixed rate while no live figure is known); fixed sends at drain_rate_per_s.",
    )
    drain_target_p99_ratio: float = Field(
        1.2,
        gt=1.0,
        le=10.0,
        description="Headroom pacing: the live e2e p99 the drain may cause, times the idle "
        "p99; above it the rate is cut (x0.7), at or under it the rate grows.",
    )
    drain_min_rate_per_s: float = Field(
        2.0,
        gt=0,
        le=100_000,
        description="Headroom pacing: the slowest the drain goes (records a second) while "
        "the line has no headroom, so that a backlog always ends.",
    )
    drain_increase_per_s: float = Field(
        5.0,
        gt=0,
        le=100_000,
        description="Headroom pacing: records a second added to the rate at each update "
        "with headroom, after the slow start (which doubles it) has ended.",
    )
    drain_pace_interval_s: float = Field(
        0.5,
        ge=0.05,
        le=60,
        description="Headroom pacing: seconds between two looks at the live p99.",
    )

    @field_validator("drop_order")
    @classmethod
    def _drop_order(cls, value: list[str]) -> list[str]:
        return list(full_drop_order(value))

    def pacing(self) -> PacingSettings:
        """The drain's pacing settings."""
        return PacingSettings(
            mode=self.drain_pacing,
            cap_per_s=self.drain_rate_per_s,
            min_per_s=min(self.drain_min_rate_per_s, self.drain_rate_per_s),
            target_ratio=self.drain_target_p99_ratio,
            increase_per_s=self.drain_increase_per_s,
        )

    def outbox_path(self, state_dir: Path) -> Path:
        """The outbox file, resolved against ``state_dir``."""
        return self.outbox if self.outbox.is_absolute() else state_dir / self.outbox

    def identity_path(self, state_dir: Path) -> Path:
        """The identity directory, resolved against ``state_dir``."""
        return (
            self.identity_dir if self.identity_dir.is_absolute() else state_dir / self.identity_dir
        )
