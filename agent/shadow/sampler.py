"""Which live frames a pipeline offers to its shadow: a random share, capped in frames
per second. Pure apart from the random numbers it is given (seed one for tests).

The cap is a token bucket of one frame, refilled at ``max_fps``: frames are never sent in
a burst, and a second with sampled frames to spare still sends at most ``max_fps``.
"""

from __future__ import annotations

import random


class Sampler:
    """``take(now_s)`` says whether the frame decided at ``now_s`` (monotonic seconds) goes
    to the shadow; O(1), no lock (one pipeline's decider thread calls it).

    Raises (constructor):
        ValueError: ``share`` outside 0..1 or ``max_fps`` not above 0.
    """

    def __init__(self, share: float, max_fps: float, rng: random.Random | None = None) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"shadow sample share must be 0..1, got {share}")
        if not max_fps > 0:
            raise ValueError(f"shadow max_fps must be above 0, got {max_fps}")
        self.share = share
        self.max_fps = max_fps
        self._rng = rng or random.Random()  # noqa: S311 - sampling, not secrets
        self._tokens = 1.0
        self._last: float | None = None
        self.offered = 0
        """Frames seen."""
        self.sampled = 0
        """Frames taken (in the share and within the cap)."""
        self.capped = 0
        """Frames in the share refused by the cap."""

    def take(self, now_s: float) -> bool:
        self.offered += 1
        if self._last is not None:
            self._tokens = min(1.0, self._tokens + (now_s - self._last) * self.max_fps)
        self._last = now_s
        if self.share <= 0.0 or (self.share < 1.0 and self._rng.random() >= self.share):
            return False
        if self._tokens < 1.0:
            self.capped += 1
            return False
        self._tokens -= 1.0
        self.sampled += 1
        return True
