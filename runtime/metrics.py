"""Latency histograms per stage, and counters, for one model.

HDR histograms (``hdrhistogram``) in microseconds, 3 significant digits, up to one
hour: percentiles stay exact to 0.1 % in the tail, which is the part that matters.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

STAGES = (
    "queue_wait",
    "to_worker",
    "preprocess",
    "inference",
    "from_worker",
    "postprocess",
    "total",
)
PERCENTILES = (50.0, 95.0, 99.0, 99.9)

_MAX_US = 3_600_000_000


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, _MAX_US, 3)


def summarize(hist: HdrHistogram, sum_us: float | None = None) -> dict[str, float]:
    """count, p50, p95, p99, p99.9, max and mean of a microsecond histogram, in ms.

    The percentiles come from one pass over the buckets; the mean from ``sum_us`` when
    the caller kept the sum (hdrhistogram's own mean walks every bucket in Python, tens of
    milliseconds).
    """
    count = int(hist.get_total_count())
    out: dict[str, float] = {"count": float(count)}
    values = hist.get_percentile_to_value_dict(list(PERCENTILES)) if count else {}
    for p in PERCENTILES:
        key = "p" + (f"{p:g}".replace(".", ""))
        out[key + "_ms"] = values.get(p, 0) / 1000.0
    out["max_ms"] = hist.get_max_value() / 1000.0 if count else 0.0
    if not count:
        out["mean_ms"] = 0.0
    elif sum_us is not None:
        out["mean_ms"] = sum_us / count / 1000.0
    else:
        out["mean_ms"] = hist.get_mean_value() / 1000.0
    return out


@dataclass
class ModelMetrics:
    """Everything the pool measures for one model. Thread-safe."""

    stages: dict[str, HdrHistogram] = field(
        default_factory=lambda: {s: new_histogram() for s in STAGES}
    )
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("submitted", "completed", "refused", "expired", "failed", "crashed"), 0
        )
    )
    sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record_many(self, values: list[tuple[str, int]]) -> None:
        with self._lock:
            for stage, ns in values:
                us = max(1, min(ns // 1000, _MAX_US))
                self.stages[stage].record_value(us)
                self.sums[stage] += us

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def reset(self) -> None:
        with self._lock:
            for h in self.stages.values():
                h.reset()
            self.sums = dict.fromkeys(STAGES, 0)
            for k in self.counts:
                self.counts[k] = 0

    def snapshot(self) -> dict[str, Any]:
        """Stage summaries and counts. The histograms are copied under the lock (well
        under a millisecond) and summarised outside it, so the pool's hot path, which
        records under the same lock, never waits for the percentile walk."""
        with self._lock:
            copies = {}
            for stage, hist in self.stages.items():
                copy = new_histogram()
                copy.add(hist)
                copies[stage] = copy
            sums = dict(self.sums)
            counts = dict(self.counts)
        return {
            "stages": {s: summarize(h, sums.get(s)) for s, h in copies.items()},
            "counts": counts,
        }
