"""Device clocks are data, bounded: every time a device writes into a record must lie
within ``[now - max_past_s, now + max_future_s]`` of the server's clock when the record
is received.

The decision: a record with a time outside the bounds is quarantined (with a reason
naming the field, its value and the bound), never stored with a corrected time: the
time is what makes it findable (lists, gates, reviews are all ordered by it), and a
guess would be silently wrong. The future bound is small (a day by default: a clock
a little ahead is common, one months ahead is broken or hostile); the past bound is
long (five years by default), because a device that was offline keeps its decisions in
its outbox and uploads them late. Beside every stored device time the server keeps its
own receive time (``received_at``), and a device's ``last_seen`` moves by receive time
only, so no device time decides how fresh a device looks.

Pure: no I/O; the caller passes ``now``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent.wire.messages import (
    DecisionRow,
    Event,
    Health,
    Heartbeat,
    ReportedState,
    Telemetry,
    ThumbnailUpload,
)

DEFAULT_MAX_FUTURE_S = 86_400.0
DEFAULT_MAX_PAST_S = 5 * 365 * 86_400.0


class ClockSkew(ValueError):
    """A device time out of bounds.

    Attributes:
        field: the record's field (``ts``, ``decision_time`` ...).
        value: the time the device wrote.
    """

    def __init__(self, field: str, value: float, reason: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field} {value!r} {reason}")


@dataclass(frozen=True)
class ClockBounds:
    """How far from the server's clock a device time may be, seconds."""

    max_future_s: float = DEFAULT_MAX_FUTURE_S
    max_past_s: float = DEFAULT_MAX_PAST_S

    def check(self, field: str, value: float, now: float) -> None:
        """Raises:
        ClockSkew: ``value`` is not finite, later than ``now + max_future_s`` or
            earlier than ``now - max_past_s``."""
        if not math.isfinite(value):
            raise ClockSkew(field, value, "is not a finite time")
        if value > now + self.max_future_s:
            raise ClockSkew(
                field,
                value,
                f"is {value - now:.6g} s ahead of the server's clock "
                f"(max_clock_skew_s {self.max_future_s:g})",
            )
        if value < now - self.max_past_s:
            raise ClockSkew(
                field,
                value,
                f"is {now - value:.6g} s behind the server's clock "
                f"(max_clock_age_s {self.max_past_s:g})",
            )


Timed = Heartbeat | Health | Telemetry | DecisionRow | ThumbnailUpload | Event | ReportedState


def times_of(record: Timed) -> list[tuple[str, float]]:
    """The device times of a record, by field name."""
    if isinstance(record, DecisionRow):
        return [("capture_time", record.capture_time), ("decision_time", record.decision_time)]
    if isinstance(record, ThumbnailUpload):
        return [("decision_time", record.decision_time)]
    if isinstance(record, ReportedState):
        return [] if record.ts is None else [("ts", record.ts)]
    return [("ts", record.ts)]


def check_record(bounds: ClockBounds, record: Timed, now: float) -> None:
    """Raises:
    ClockSkew: naming the first of the record's times that is out of bounds."""
    for field, value in times_of(record):
        bounds.check(field, value, now)
