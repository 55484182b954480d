"""Latency histograms per stage, and counters, for one model.

HDR histograms (``hdrhistogram``) in microseconds, 3 significant digits, up to one
hour: percentiles stay exact to 0.1 % in the tail, which is the part that matters.

The pool's I/O thread records several stages per request, and ``hdrhistogram``'s
``record_value`` is pure Python (about 2 µs a value, 11 µs for a request's five stages,
measured). So a value is appended to a per-stage list (tens of nanoseconds) and the
lists are folded into the histograms in one vectorised step (:func:`record_array`) when
one fills up or a snapshot is taken: the same histograms, for a tenth of the cost.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

STAGES = (
    "submit",
    "queue_wait",
    "to_worker",
    "preprocess",
    "inference",
    "from_worker",
    "handback",
    "postprocess",
    "total",
)
"""A request's path, in order (ms in snapshots):

- ``submit``: the caller's reserve, input copy and checks, until it is queued;
- ``queue_wait``: queued until sent to a worker (or, inline, until its lane is free);
- ``to_worker``: sent until the worker starts it (pipe, the worker's wake-up, or the
  request ahead of it at a pipelined worker);
- ``preprocess`` and ``inference``: in the worker;
- ``from_worker``: the worker's answer until the pool's I/O thread has read it;
- ``handback``: read until the caller has it (its wait returns or its callback runs);
- ``postprocess``: the caller holding the outputs, until it releases the request;
- ``total``: from the request's ``t0`` (capture time) to its release.
"""
_FOLD_AT = 1024
PERCENTILES = (50.0, 95.0, 99.0, 99.9)

_MAX_US = 3_600_000_000


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, _MAX_US, 3)


def record_array(hist: HdrHistogram, values_us: Any) -> None:
    """Record many microsecond values at once, exactly as ``record_value`` would (values
    are clamped to 1 .. one hour)."""
    v = np.clip(np.asarray(values_us, dtype=np.int64), 1, _MAX_US)
    if not v.size:
        return
    bit_length = np.frexp((v | hist.sub_bucket_mask).astype(np.float64))[1].astype(np.int64)
    bucket = bit_length - hist.unit_magnitude - (hist.sub_bucket_half_count_magnitude + 1)
    sub = v >> (bucket + hist.unit_magnitude)
    index = (
        ((bucket + 1) << hist.sub_bucket_half_count_magnitude) + sub - hist.sub_bucket_half_count
    )
    counts = np.ctypeslib.as_array(hist.counts)
    counts += np.bincount(index, minlength=counts.size)[: counts.size].astype(counts.dtype)
    hist.total_count += int(v.size)
    hist.min_value = min(hist.min_value, int(v.min()))
    hist.max_value = max(hist.max_value, int(v.max()))


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
    _pending: dict[str, list[int]] = field(default_factory=lambda: {s: [] for s in STAGES})
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record_many(self, values: list[tuple[str, int]]) -> None:
        """Record one request's stage times (nanoseconds)."""
        with self._lock:
            pending = self._pending
            for stage, ns in values:
                bucket = pending[stage]
                bucket.append(ns)
                if len(bucket) >= _FOLD_AT:
                    self._fold(stage)

    def _fold(self, stage: str) -> None:
        """Move a stage's pending values into its histogram (lock held)."""
        bucket = self._pending[stage]
        if not bucket:
            return
        us = np.clip(np.asarray(bucket, dtype=np.int64) // 1000, 1, _MAX_US)
        bucket.clear()
        record_array(self.stages[stage], us)
        self.sums[stage] += int(us.sum())

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def reset(self) -> None:
        with self._lock:
            for h in self.stages.values():
                h.reset()
            for bucket in self._pending.values():
                bucket.clear()
            self.sums = dict.fromkeys(STAGES, 0)
            for k in self.counts:
                self.counts[k] = 0

    def snapshot(self) -> dict[str, Any]:
        """Stage summaries and counts. The histograms are copied under the lock (well
        under a millisecond) and summarised outside it, so the pool's hot path, which
        records under the same lock, never waits for the percentile walk."""
        with self._lock:
            for stage in STAGES:
                self._fold(stage)
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
