"""How fast the outbox drains while the line decides (:class:`Pacer`): AIMD on the live
e2e p99 the hot path publishes (:class:`agent.livelatency.LiveLoad`) against its idle p99.

Each update (the drain calls it every ``drain_pace_interval_s``):

- no live figure (no load source, or too few decisions in the window): the operator's
  fixed rate, ``drain_rate_per_s``;
- the live p99 above ``target_ratio`` x the idle p99: the rate times
  :data:`DECREASE` (never below ``min_per_s``), and slow start ends;
- at or under it, while the drain was held back by its rate: the rate doubles (slow
  start, until the first decrease) or grows by ``increase_per_s``; never above the cap,
  ``drain_rate_per_s``;
- the drain had nothing to send for a whole window: the p99 of that window is the idle
  p99 (a moving average of such windows), and the next backlog starts again from
  ``min_per_s`` in slow start.

The idle p99 is the drain's own figure from quiet windows when it has seen
:data:`QUIET_WINDOWS`, else the load's ``baseline_p99_ms`` (the window's lower quartile
of recent p99s); with neither, the rate holds.

Pure: no clock, no socket, no thread; the caller feeds it and applies the rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agent.livelatency import LiveLoad

DECREASE = 0.7
"""Factor applied to the rate when the live p99 is over the target."""
QUIET_WINDOWS = 3
"""Quiet windows seen before the drain trusts its own idle p99 over the load's estimate."""
BASELINE_ALPHA = 0.2
"""Weight of a new quiet window in the idle p99's moving average."""

Mode = Literal["headroom", "fixed"]


@dataclass(frozen=True)
class PacingSettings:
    """What the pacer is given (from ``[uplink]``).

    Attributes:
        mode: ``headroom`` paces by the live p99; ``fixed`` always sends at ``cap_per_s``.
        cap_per_s: ``drain_rate_per_s``, the operator's hard cap.
        min_per_s: the slowest the drain goes while the line has no headroom.
        target_ratio: the live p99 allowed, times the idle p99.
        increase_per_s: added to the rate on an update with headroom (after slow start).
    """

    mode: Mode = "headroom"
    cap_per_s: float = 200.0
    min_per_s: float = 2.0
    target_ratio: float = 1.2
    increase_per_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.min_per_s <= self.cap_per_s:
            raise ValueError(f"min rate {self.min_per_s} must be in (0, cap {self.cap_per_s}]")
        if self.target_ratio <= 1.0 or self.increase_per_s <= 0:
            raise ValueError(
                f"target ratio ({self.target_ratio}) must be > 1 and increase "
                f"({self.increase_per_s}) > 0"
            )


class Pacer:
    """The drain's rate, updated from the live load (see the module docstring)."""

    def __init__(self, settings: PacingSettings) -> None:
        self.settings = settings
        self.paced_per_s = settings.min_per_s
        """The AIMD rate (what the drain sends at while a live figure is known)."""
        self.rate_per_s = settings.cap_per_s if settings.mode == "fixed" else settings.min_per_s
        """The rate in force after the last update."""
        self.slow_start = True
        self.idle_p99_ms: float | None = None
        self.quiet_windows = 0
        self.last: LiveLoad | None = None
        self.reason = "fixed" if settings.mode == "fixed" else "start"
        self.increases = 0
        self.decreases = 0

    def baseline_ms(self) -> float | None:
        """The idle p99 the live p99 is held against (None: not known yet)."""
        if self.idle_p99_ms is not None and self.quiet_windows >= QUIET_WINDOWS:
            return self.idle_p99_ms
        if self.last is not None and self.last.baseline_p99_ms is not None:
            return self.last.baseline_p99_ms
        return self.idle_p99_ms

    def update(self, load: LiveLoad | None, *, quiet: bool, limited: bool) -> float:
        """The rate to send at from now on.

        Args:
            load: the hot path's live latency now; None when it is not known.
            quiet: the drain sent nothing during the load's window.
            limited: the drain had records waiting that its rate held back since the
                last update.
        """
        s = self.settings
        self.last = load
        if s.mode == "fixed":
            return self._set(s.cap_per_s, "fixed")
        if load is None or load.p99_ms is None:
            return self._set(s.cap_per_s, "no live figure: fixed rate")
        reason = self._paced(load.p99_ms, quiet=quiet, limited=limited)
        return self._set(self.paced_per_s, reason)

    def _paced(self, p99_ms: float, *, quiet: bool, limited: bool) -> str:
        """Update :attr:`paced_per_s` from a live p99; why, in words."""
        s = self.settings
        if quiet:
            self._learn_idle(p99_ms)
            self.paced_per_s, self.slow_start = s.min_per_s, True
            return "idle"
        baseline = self.baseline_ms()
        if baseline is None:
            return "no idle p99 yet: holding"
        if p99_ms > s.target_ratio * baseline:
            self.paced_per_s = max(s.min_per_s, self.paced_per_s * DECREASE)
            self.slow_start = False
            self.decreases += 1
            return "over target: decrease"
        if not limited:
            return "headroom, not rate-bound: holding"
        grown = self.paced_per_s * 2 if self.slow_start else self.paced_per_s + s.increase_per_s
        self.paced_per_s = min(s.cap_per_s, grown)
        self.increases += 1
        return "headroom: increase"

    def _learn_idle(self, p99_ms: float) -> None:
        if self.idle_p99_ms is None:
            self.idle_p99_ms = p99_ms
        else:
            self.idle_p99_ms += BASELINE_ALPHA * (p99_ms - self.idle_p99_ms)
        self.quiet_windows += 1

    def _set(self, rate: float, reason: str) -> float:
        self.rate_per_s, self.reason = rate, reason
        return rate

    def stats(self) -> dict[str, Any]:
        """The pacing's state for the uplink's stats (JSON-able)."""
        last = self.last
        baseline = self.baseline_ms()
        return {
            "mode": self.settings.mode,
            "rate_per_s": round(self.rate_per_s, 2),
            "cap_per_s": self.settings.cap_per_s,
            "reason": self.reason,
            "live_p99_ms": None if last is None or last.p99_ms is None else round(last.p99_ms, 3),
            "baseline_p99_ms": None if baseline is None else round(baseline, 3),
            "target_ratio": self.settings.target_ratio,
            "increases": self.increases,
            "decreases": self.decreases,
        }
