"""The running totals of one shadow candidate, for the health report
(:class:`agent.wire.quality.ShadowSummary`).

One :class:`ShadowStats` per candidate (bundle name, version, release, digest), shared by
every pipeline that runs it, so the totals are pooled; it outlives reloads, and is seeded
from the rows already in the decision log (:meth:`ShadowStats.seed`), so the totals run
"since the candidate was installed" across restarts too (``skipped`` excepted: it is not
stored). Latencies are HDR histograms in microseconds (runtime/metrics.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from agent.shadow.compare import Comparison
from agent.wire.quality import ShadowSummary
from runtime.metrics import new_histogram, record_array, summarize


@dataclass(frozen=True)
class ShadowKey:
    """Which candidate: the shadow bundle's name, version, release and digest."""

    bundle: str
    version: str
    release: int | None
    digest: str


class ShadowStats:
    """Cumulative counters and latency histograms of one candidate. Thread-safe."""

    def __init__(self, key: ShadowKey) -> None:
        self.key = key
        self._lock = threading.Lock()
        self.n = 0
        self.agree = 0
        self.skipped = 0
        self.errors = 0
        self.matched = 0
        self.unmatched_live = 0
        self.unmatched_shadow = 0
        self.seeded = 0
        """Comparisons read back from the decision log at start (counted in ``n``)."""
        self._shadow = new_histogram()
        self._live = new_histogram()

    def record(self, c: Comparison, shadow_ms: float, live_ms: float) -> None:
        """One compared frame and the two models' latencies."""
        with self._lock:
            self.n += 1
            self.agree += int(c.agree)
            self.matched += c.boxes.matched
            self.unmatched_live += c.boxes.unmatched_live
            self.unmatched_shadow += c.boxes.unmatched_shadow
            self._shadow.record_value(_us(shadow_ms))
            self._live.record_value(_us(live_ms))

    def skip(self, n: int = 1) -> None:
        """A sampled frame the candidate did not get (the pool was busy, or the shadow
        thread still had the frame before)."""
        with self._lock:
            self.skipped += n

    def error(self) -> None:
        """A sampled frame whose inference or post-processing failed."""
        with self._lock:
            self.errors += 1

    def seed(self, rows: Iterable[tuple[float, float, int]]) -> int:
        """Add comparisons stored before: ``(shadow_ms, live_ms, agree)`` each. Returns
        how many."""
        shadow: list[int] = []
        live: list[int] = []
        agree = 0
        for s_ms, l_ms, ok in rows:
            shadow.append(_us(s_ms))
            live.append(_us(l_ms))
            agree += int(bool(ok))
        with self._lock:
            record_array(self._shadow, shadow)
            record_array(self._live, live)
            self.n += len(shadow)
            self.agree += agree
            self.seeded += len(shadow)
        return len(shadow)

    def summary(self) -> ShadowSummary:
        with self._lock:
            n, agree, skipped = self.n, self.agree, self.skipped
            shadow = summarize(self._shadow) if n else None
            live = summarize(self._live) if n else None
        return ShadowSummary(
            bundle=self.key.bundle,
            version=self.key.version,
            release=self.key.release,
            n=n,
            agree=agree,
            skipped=skipped,
            agreement=round(agree / n, 6) if n else None,
            shadow_p50_ms=shadow["p50_ms"] if shadow else None,
            shadow_p99_ms=shadow["p99_ms"] if shadow else None,
            live_p99_ms=live["p99_ms"] if live else None,
        )

    def counters(self) -> dict[str, int]:
        """The counters (for metrics and stats)."""
        with self._lock:
            return {
                "n": self.n,
                "agree": self.agree,
                "skipped": self.skipped,
                "errors": self.errors,
                "matched": self.matched,
                "unmatched_live": self.unmatched_live,
                "unmatched_shadow": self.unmatched_shadow,
            }


def _us(ms: float) -> int:
    return max(1, round(ms * 1000))


def health_summary(stats: Iterable[ShadowStats]) -> ShadowSummary | None:
    """The one summary the health report carries: of the candidates running now, the one
    with the most compared frames (one candidate per device is the normal case; the
    pipelines that run the same candidate share its totals). None when none runs."""
    best: ShadowStats | None = None
    best_n = -1
    for s in sorted(stats, key=lambda s: (s.key.bundle, s.key.version, s.key.digest)):
        n = s.counters()["n"] + s.counters()["skipped"]
        if n > best_n:
            best, best_n = s, n
    return best.summary() if best is not None else None
