"""A camera's clock mapped to the host's: offset and drift, and how far off the mapping is.

A GenICam camera stamps each frame with its own clock (the buffer's timestamp, in ns of
that clock). The host knows when each frame arrived (Aravis's system timestamp). A frame
can't arrive before it was taken, so ``arrival - camera`` is the offset between the two
clocks plus that frame's readout and transfer time; the smallest of these over a window
(the lower envelope) is the offset plus the fastest frame's transfer, and how it moves
from the window's older half to its newer half is the drift. Mapped through it, a frame's
camera time lands on the host clock where its exposure was, late by at most that fastest
transfer (a constant the host can't see without a clock latch or PTP, which this does not
use).

:attr:`ClockEstimate.error_ns` is what the mapping may be off by from one frame to the
next: how far the envelope's two halves disagree once the drift is taken out, and the
spread of the arrivals above it (a frame delayed in the network or the kernel).

Pure: no clock is read here; the caller gives both times.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

WINDOW = 256
"""Frames the envelope is taken over."""
MIN_DRIFT_SPAN_NS = 2_000_000_000
MIN_HALF = 16
"""The window must span this much camera time, with this many frames in each half,
before a drift is estimated (else 0)."""
REFIT_EVERY = 8
"""The mapping is fitted again every this many frames (the first ones: each)."""
MAX_DRIFT_PPM = 1000.0
"""A drift beyond this is a clock reset (a camera that restarted), not a drift: the
window starts over."""


@dataclass(frozen=True, slots=True)
class ClockEstimate:
    """The mapping now.

    Attributes:
        offset_ns: host time minus camera time at ``reference_ns`` (camera ns).
        drift_ppm: how much faster the host clock runs than the camera's, in parts per
            million.
        error_ns: how far a mapped time may be off from frame to frame (see the module).
        samples: frames in the window.
    """

    offset_ns: int = 0
    drift_ppm: float = 0.0
    error_ns: int = 0
    samples: int = 0
    reference_ns: int = 0


class TickClock:
    """Maps camera ns to host ns from the frames' (camera, arrival) pairs."""

    def __init__(self, window: int = WINDOW) -> None:
        self._pairs: deque[tuple[int, int]] = deque(maxlen=window)
        self._estimate = ClockEstimate()
        self._seen = 0
        self.resets = 0
        """Times the camera's clock went back or jumped (a restarted camera)."""

    def arrival(self, camera_ns: int, host_ns: int) -> None:
        """A frame stamped ``camera_ns`` by the camera arrived at ``host_ns``."""
        if self._pairs:
            last_cam, last_host = self._pairs[-1]
            elapsed = abs(host_ns - last_host)
            jump = abs((host_ns - last_host) - (camera_ns - last_cam))
            if camera_ns <= last_cam or jump > 1_000_000_000 + MAX_DRIFT_PPM * 1e-6 * elapsed:
                self._pairs.clear()
                self.resets += 1
        self._pairs.append((camera_ns, host_ns))
        self._seen += 1
        if len(self._pairs) < REFIT_EVERY * 2 or self._seen % REFIT_EVERY == 0:
            self._estimate = self._fit()

    def estimate(self) -> ClockEstimate:
        return self._estimate

    def to_host(self, camera_ns: int) -> int:
        """``camera_ns`` on the host clock (the camera time itself before any frame)."""
        e = self._estimate
        if not e.samples:
            return camera_ns
        return camera_ns + e.offset_ns + int((camera_ns - e.reference_ns) * e.drift_ppm * 1e-6)

    def _fit(self) -> ClockEstimate:
        pairs = list(self._pairs)
        ref = pairs[0][0]
        diffs = [(c - ref, h - c) for c, h in pairs]
        half = len(diffs) // 2
        drift = 0.0
        envelope_gap = 0.0
        if half >= MIN_HALF and diffs[-1][0] - diffs[0][0] >= MIN_DRIFT_SPAN_NS:
            x1, d1 = min(diffs[:half], key=lambda p: p[1])
            x2, d2 = min(diffs[half:], key=lambda p: p[1])
            if x2 > x1:
                drift = (d2 - d1) / (x2 - x1)
                if abs(drift) * 1e6 > MAX_DRIFT_PPM:
                    drift = 0.0
        residual = sorted(d - drift * x for x, d in diffs)
        offset = residual[0]
        if half >= 2:
            first = min(d - drift * x for x, d in diffs[:half])
            second = min(d - drift * x for x, d in diffs[half:])
            envelope_gap = abs(second - first)
        spread = residual[len(residual) // 2] - offset  # the median arrival above the envelope
        return ClockEstimate(
            offset_ns=int(offset),
            drift_ppm=drift * 1e6,
            error_ns=int(envelope_gap + spread),
            samples=len(diffs),
            reference_ns=ref,
        )
