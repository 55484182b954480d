"""A device's health reports as chart series (pure).

Each health report (the agent's ``Health`` message as stored) gives one point per
camera (fps, drops), per model (p50, p99, queue depth), per temperature zone, and one for
CPU, memory and disk. Over a long range the points are put in at most
:data:`MAX_POINTS` time buckets: the mean of a bucket for rates and levels, its maximum
for tail latency, queue depth, temperature and counters, so a spike is never averaged
away.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet_server.web.charts import PALETTE, Series

MAX_POINTS = 240
"""Points per series drawn; more samples are bucketed."""

Agg = Callable[[Sequence[float]], float]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


@dataclass(frozen=True)
class ChartData:
    """One chart's title, unit and series."""

    key: str
    title: str
    unit: str
    series: list[Series] = field(default_factory=list)
    note: str = ""


def _num(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def bucket(
    points: Sequence[tuple[float, float]], start: float, end: float, agg: Agg, n: int = MAX_POINTS
) -> list[tuple[float, float]]:
    """``points`` (sorted by time) as at most ``n`` points: each bucket of the range
    [start, end] that holds samples becomes one point at its samples' mean time."""
    if len(points) <= n or end <= start:
        return list(points)
    width = (end - start) / n
    groups: dict[int, list[tuple[float, float]]] = {}
    for t, v in points:
        groups.setdefault(min(n - 1, max(0, int((t - start) / width))), []).append((t, v))
    return [(_mean([t for t, _ in g]), agg([v for _, v in g])) for _, g in sorted(groups.items())]


class _Collector:
    """Points by (chart, series) within [start, end]: a report dated outside the range
    (a device clock far off) is left out rather than drawn at an edge."""

    def __init__(self, start: float, end: float) -> None:
        self.points: dict[tuple[str, str], list[tuple[float, float]]] = {}
        self.start = start
        self.end = end

    def add(self, chart: str, name: str, ts: float, value: Any) -> None:
        v = _num(value)
        t = _num(ts)
        if v is not None and t is not None and self.start <= t <= self.end:
            self.points.setdefault((chart, name), []).append((ts, v))

    def each(self, chart: str, ts: float, values: Any, suffix: str = "") -> None:
        if isinstance(values, Mapping):
            for k, v in values.items():
                self.add(chart, f"{k}{suffix}", ts, v)

    def names(self, chart: str) -> list[str]:
        return sorted(name for c, name in self.points if c == chart)


_CHARTS: tuple[tuple[str, str, str, Agg], ...] = (
    ("fps", "Frames per second, per camera", "fps", _mean),
    ("latency", "Inference latency, per model (p99 solid, p50 dashed)", "ms", max),
    ("queue", "Queue depth, per model", "requests", max),
    ("drops", "Dropped frames since agent start, per cause", "frames", max),
    ("cpu", "CPU", "%", _mean),
    ("memory", "Agent memory", "MB", max),
    ("temperature", "Temperature, per zone", "°C", max),
    ("disk", "Data disk", "MB", _mean),
)


def health_charts(
    reports: Iterable[tuple[float, Mapping[str, Any]]], start: float, end: float
) -> list[ChartData]:
    """The device page's charts from its health reports (ts, payload), oldest first."""
    c = _Collector(start, end)
    for ts, h in reports:
        c.each("fps", ts, h.get("fps"))
        latency = h.get("latency_ms")
        if isinstance(latency, Mapping):
            for model, p in latency.items():
                if isinstance(p, Mapping):
                    c.add("latency", f"{model} p99", ts, p.get("p99"))
                    c.add("latency", f"{model} p50", ts, p.get("p50"))
        c.each("queue", ts, h.get("queue_depth"))
        c.each("drops", ts, h.get("drops"))
        c.add("cpu", "CPU", ts, h.get("cpu_percent"))
        c.add("memory", "resident", ts, h.get("memory_mb"))
        c.each("temperature", ts, h.get("temperature_c"))
        c.add("disk", "free", ts, h.get("disk_free_mb"))
        c.add("disk", "used", ts, h.get("disk_used_mb"))
    out = []
    for key, title, unit, agg in _CHARTS:
        names = c.names(key)
        note = ""
        if key == "latency":
            models = sorted({n.rsplit(" ", 1)[0] for n in names})
            if len(models) > PALETTE:
                note = f"showing {PALETTE} of {len(models)} models"
            series = []
            for i, model in enumerate(models[:PALETTE]):
                for suffix, dashed in ((" p99", False), (" p50", True)):
                    pts = c.points.get((key, model + suffix), [])
                    if pts:
                        how = agg if not dashed else _mean
                        series.append(
                            Series(model + suffix, bucket(pts, start, end, how), i, dashed)
                        )
        else:
            if len(names) > PALETTE:
                note = f"showing {PALETTE} of {len(names)}"
            series = [
                Series(n, bucket(c.points[(key, n)], start, end, agg), i)
                for i, n in enumerate(names[:PALETTE])
            ]
        out.append(ChartData(key, title, unit, series, note))
    return out
