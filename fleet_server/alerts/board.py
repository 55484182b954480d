"""What the console shows of the alerts in its menu, held in memory: the alerts firing
by severity, refreshed by the alerts service on every replica (a page reads it without
a query)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

SEVERITY_ORDER = ("critical", "warning", "info")


@dataclass
class AlertBoard:
    """Alerts firing by severity, and when they were counted."""

    firing: dict[str, int] = field(default_factory=dict)
    updated_at: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def set(self, counts: dict[str, int], now: float) -> None:
        """Replace the counts."""
        with self._lock:
            self.firing = dict(counts)
            self.updated_at = now

    def counts(self) -> dict[str, int]:
        """A copy of the counts by severity."""
        with self._lock:
            return dict(self.firing)

    def badge(self) -> tuple[int, str]:
        """(alerts firing, the worst severity among them; "" when none)."""
        counts = self.counts()
        worst = next((s for s in SEVERITY_ORDER if counts.get(s)), "")
        return sum(counts.values()), worst


__all__ = ["AlertBoard"]
