"""The hot path's live latency, as the jobs that must yield to it read it
(:class:`LatencyWindow`): each decision's end-to-end milliseconds go into a bounded ring,
and :meth:`LatencyWindow.snapshot` gives the p99 over the last window and an estimate of
the idle p99 as a small frozen :class:`LiveLoad`.

Recording is O(1) and takes no lock: one ``deque.append`` of a (time, ms) pair, atomic
under the GIL, so any number of pipeline threads record without contention. The reader
copies the ring (one C call, also atomic) and does the sorting on its own thread. The
outbox's drain paces itself by it (:mod:`agent.uplink.pacing`); in the one-process agent
the drain calls :meth:`LatencyWindow.snapshot` directly, across processes the snapshot
(``dataclasses.asdict``) crosses the control channel.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_WINDOW_S = 1.0
DEFAULT_CAPACITY = 8192
"""Decisions kept: a window of a second at up to 8,000 decisions/s."""
MIN_COUNT = 10
"""Fewer decisions than this in a window give no p99 (too few to say)."""
HISTORY = 60
"""Windows whose p99 the idle estimate looks back over."""
BASELINE_QUANTILE = 0.25


@dataclass(frozen=True)
class LiveLoad:
    """The hot path's live latency at one moment (JSON-able with ``dataclasses.asdict``).

    Attributes:
        p99_ms: e2e p99 over the last ``window_s``; None when fewer than
            :data:`MIN_COUNT` decisions were made in it.
        baseline_p99_ms: an estimate of the idle p99: the lower quartile of the p99s of
            the last :data:`HISTORY` windows (None before the first full window). Those
            with a better figure (the drain knows when it was quiet) use their own.
        count: decisions in the last window.
        window_s: the window's length.
    """

    p99_ms: float | None
    baseline_p99_ms: float | None
    count: int
    window_s: float


LoadSource = Callable[[], "LiveLoad | None"]
"""Where a job that yields to the hot path reads its live load (None: not known now)."""


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values`` (not empty), which it sorts."""
    values.sort()
    rank = max(1, math.ceil(q * len(values)))
    return values[min(rank, len(values)) - 1]


class LatencyWindow:
    """Each decision's e2e latency, the last ``capacity`` of them (see the module
    docstring). :meth:`record` on the hot path, :meth:`snapshot` anywhere else.

    Args:
        window_s: the window a snapshot's p99 is over.
        capacity: decisions kept at most (older ones fall out of a busy window).
        clock: monotonic seconds (tests give their own).
    """

    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        capacity: int = DEFAULT_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s <= 0 or capacity < 1:
            raise ValueError(f"window_s ({window_s}) must be > 0 and capacity ({capacity}) >= 1")
        self.window_s = window_s
        self.clock = clock
        self._ring: deque[tuple[float, float]] = deque(maxlen=capacity)
        self._history: deque[float] = deque(maxlen=HISTORY)
        self._history_mark: float | None = None

    def record(self, e2e_ms: float) -> None:
        """One decision's capture-to-decision milliseconds (hot path: O(1), no lock)."""
        self._ring.append((self.clock(), e2e_ms))

    def snapshot(self) -> LiveLoad:
        """The p99 over the last window and the idle estimate (see :class:`LiveLoad`)."""
        now = self.clock()
        since = now - self.window_s
        values = [ms for t, ms in list(self._ring) if t >= since]
        p99 = quantile(values, 0.99) if len(values) >= MIN_COUNT else None
        if self._history_mark is None:
            self._history_mark = now
        elif now - self._history_mark >= self.window_s:  # one figure per window, no overlap
            self._history_mark = now
            if p99 is not None:
                self._history.append(p99)
        baseline = quantile(list(self._history), BASELINE_QUANTILE) if self._history else None
        return LiveLoad(p99, baseline, len(values), self.window_s)
