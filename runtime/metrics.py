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


def summarize(hist: HdrHistogram) -> dict[str, float]:
    """count, p50, p95, p99, p99.9 and max of a microsecond histogram, in ms."""
    count = int(hist.get_total_count())
    out: dict[str, float] = {"count": float(count)}
    for p in PERCENTILES:
        key = "p" + (f"{p:g}".replace(".", ""))
        out[key + "_ms"] = hist.get_value_at_percentile(p) / 1000.0 if count else 0.0
    out["max_ms"] = hist.get_max_value() / 1000.0 if count else 0.0
    out["mean_ms"] = hist.get_mean_value() / 1000.0 if count else 0.0
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
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record_many(self, values: list[tuple[str, int]]) -> None:
        with self._lock:
            for stage, ns in values:
                self.stages[stage].record_value(max(1, min(ns // 1000, _MAX_US)))

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def reset(self) -> None:
        with self._lock:
            for h in self.stages.values():
                h.reset()
            for k in self.counts:
                self.counts[k] = 0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "stages": {s: summarize(h) for s, h in self.stages.items()},
                "counts": dict(self.counts),
            }
