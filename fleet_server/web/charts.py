"""Server-side SVG charts (pure): line charts over time, stacked bars over time and
horizontal progress bars, as markup the page embeds.

Each chart is readable without the page around it: a title, axes with ticks and units,
a legend that pairs every colour with a name and a number (the last value, or the
total), and an ``aria-label`` that says the same in words. Colours are CSS classes
(``c0``..``c7``, or named ones such as ``st-done``) styled by the console's stylesheet;
no inline styles, so the page's Content-Security-Policy needs no ``unsafe-inline``.
A series breaks where samples are missing for more than three sampling intervals, so
an outage reads as a gap rather than a straight line.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import tzinfo
from itertools import pairwise

from markupsafe import Markup, escape

from fleet_server import timefmt

PALETTE = 8
"""Series colours ``c0``..``c7`` (the Okabe-Ito set, told apart with colour blindness)."""
_CHAR_W = 6.6
"""Approximate width of one 11 px character, for laying out legends."""
_TIME_STEPS = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
_MAX_SPAN_S = 400 * 365 * 86400.0
"""A time axis longer than this gets no ticks (the range is not one of real times)."""


@dataclass(frozen=True)
class Series:
    """One line: ``points`` are (POSIX time, value), sorted by time."""

    name: str
    points: Sequence[tuple[float, float]]
    color: int = 0
    dashed: bool = False


@dataclass(frozen=True)
class Stack:
    """One category of a stacked bar chart: its count in each bucket."""

    name: str
    css: str
    counts: Sequence[int]


@dataclass(frozen=True)
class Segment:
    """One part of a progress bar."""

    label: str
    count: int
    css: str


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2f}".rstrip("0").rstrip(".")


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round values (1, 2 or 5 x 10^k apart) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        high = low + 1.0
    raw = (high - low) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(low / step) * step
    ticks: list[float] = []
    value = first
    while value < high + step * 0.999 and len(ticks) < 2 * count + 2:
        ticks.append(round(value, 10))
        value += step
    return ticks


def time_ticks(start: float, end: float, count: int = 6) -> list[float]:
    """Round instants (whole minutes, hours or days in UTC) across [start, end]; none
    when the range is not one of finite times (at most ``2 * count + 2`` ticks)."""
    if not (math.isfinite(start) and math.isfinite(end)) or end - start > _MAX_SPAN_S:
        return []
    span = max(end - start, 1.0)
    step = next(
        (s for s in _TIME_STEPS if span / s <= count), 86400 * math.ceil(span / 86400 / count)
    )
    first = math.ceil(start / step) * step
    n = min(int((end - first) // step) + 1, 2 * count + 2)
    return [first + i * step for i in range(max(0, n))]


def time_label(ts: float, span_s: float, tz: tzinfo | None = None) -> str:
    """``14:30`` (or ``Tue 14:30`` over spans longer than a day), in ``tz`` (local time);
    ``invalid time (...)`` for an instant no calendar holds."""
    return timefmt.stamp(ts, "%a %H:%M" if span_s > 86400 else "%H:%M", tz=tz)


def _within(points: Sequence[tuple[float, float]], f: _Frame) -> list[tuple[float, float]]:
    """The points inside the chart's time range with finite values (a device's clock
    may put a sample anywhere)."""
    return [(t, v) for t, v in points if f.x0 <= t <= f.x1 and math.isfinite(v)]


def _svg_open(width: int, height: int, label: str, css: str = "chart") -> str:
    return (
        f'<svg class="{css}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(label)}</title>"
    )


def _text(x: float, y: float, text: str, css: str = "", anchor: str = "start") -> str:
    cls = f' class="{css}"' if css else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{cls}>{escape(text)}</text>'


def _runs(points: Sequence[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """The points split where a gap is over three median sampling intervals."""
    if len(points) < 3:
        return [list(points)] if points else []
    steps = [b[0] - a[0] for a, b in pairwise(points) if b[0] > a[0]]
    limit = 3 * statistics.median(steps) if steps else math.inf
    runs: list[list[tuple[float, float]]] = [[points[0]]]
    for prev, point in pairwise(points):
        if point[0] - prev[0] > limit:
            runs.append([])
        runs[-1].append(point)
    return runs


@dataclass(frozen=True)
class _Frame:
    left: float
    top: float
    width: float
    height: float
    x0: float
    x1: float
    y0: float
    y1: float

    def x(self, t: float) -> float:
        return self.left + (t - self.x0) / (self.x1 - self.x0 or 1) * self.width

    def y(self, v: float) -> float:
        return self.top + self.height - (v - self.y0) / (self.y1 - self.y0 or 1) * self.height


def _axes(f: _Frame, yticks: Sequence[float], unit: str, tz: tzinfo | None) -> list[str]:
    out = []
    for v in yticks:
        y = f.y(v)
        out.append(
            f'<line class="grid" x1="{f.left}" x2="{f.left + f.width}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        out.append(_text(f.left - 6, y + 4, _fmt(v), "tick", "end"))
    span = f.x1 - f.x0
    for t in time_ticks(f.x0, f.x1):
        x = f.x(t)
        bottom = f.top + f.height
        out.append(
            f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}"/>'
        )
        out.append(_text(x, bottom + 16, time_label(t, span, tz), "tick", "middle"))
    out.append(
        f'<line class="axis" x1="{f.left}" x2="{f.left}" y1="{f.top}" y2="{f.top + f.height}"/>'
        f'<line class="axis" x1="{f.left}" x2="{f.left + f.width}" y1="{f.top + f.height}" '
        f'y2="{f.top + f.height}"/>'
    )
    out.append(_text(8, f.top - 12, unit, "unit"))
    return out


def _legend(
    items: Sequence[tuple[str, str, bool]], top: float, width: int
) -> tuple[list[str], float]:
    """(markup, height) of legend entries (text, css class, dashed), wrapped to ``width``."""
    out, x, y = [], 8.0, top
    for text, css, dashed in items:
        w = 24 + len(text) * _CHAR_W + 14
        if x + w > width and x > 8:
            x, y = 8.0, y + 18
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        out.append(
            f'<line class="{css}" x1="{x:.1f}" x2="{x + 18:.1f}" y1="{y - 4:.1f}" '
            f'y2="{y - 4:.1f}" stroke-width="3"{dash}/>'
        )
        out.append(_text(x + 24, y, text, "legend"))
        x += w
    return out, (y - top) + 18


def line_chart(
    *,
    title: str,
    unit: str,
    series: Sequence[Series],
    start: float,
    end: float,
    threshold: tuple[str, float] | None = None,
    tz: tzinfo | None = None,
    width: int = 640,
    height: int = 200,
) -> Markup:
    """Values over time; the legend gives each series' last value. ``threshold`` draws
    a labelled dashed line (a budget, a limit)."""
    frame = _Frame(0, 0, 1, 1, start, max(end, start + 1), 0, 1)
    series = [Series(s.name, _within(s.points, frame), s.color, s.dashed) for s in series]
    values = [v for s in series for _, v in s.points]
    if threshold is not None:
        values.append(threshold[1])
    high = max(values, default=1.0)
    low = min(0.0, min(values, default=0.0))
    yticks = nice_ticks(low, high if high > low else low + 1)
    f = _Frame(52, 40, width - 66, height - 70, start, max(end, start + 1), yticks[0], yticks[-1])
    legend_items = []
    for s in series:
        last = f"{_fmt(s.points[-1][1])} {unit}" if s.points else "no data"
        legend_items.append((f"{s.name}: {last}", f"c{s.color % PALETTE}", s.dashed))
    legend, legend_h = _legend(legend_items, height + 4, width)
    total_h = int(height + legend_h + 4)
    summary = "; ".join(t for t, _, _ in legend_items) or "no data"
    parts = [
        _svg_open(width, total_h, f"{title} ({unit}): {summary}"),
        _text(8, 16, title, "title"),
    ]
    parts += _axes(f, yticks, unit, tz)
    if not values or not any(s.points for s in series):
        parts.append(
            _text(
                f.left + f.width / 2,
                f.top + f.height / 2,
                "no data in this range",
                "empty",
                "middle",
            )
        )
    if threshold is not None:
        y = f.y(threshold[1])
        parts.append(
            f'<line class="limit" x1="{f.left}" x2="{f.left + f.width}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        parts.append(_text(f.left + f.width - 4, y - 4, threshold[0], "limit-label", "end"))
    for s in series:
        css = f"line c{s.color % PALETTE}" + (" dashed" if s.dashed else "")
        for run in _runs(s.points):
            if len(run) == 1:
                t, v = run[0]
                parts.append(f'<circle class="{css}" cx="{f.x(t):.1f}" cy="{f.y(v):.1f}" r="2"/>')
                continue
            pts = " ".join(f"{f.x(t):.1f},{f.y(v):.1f}" for t, v in run)
            parts.append(f'<polyline class="{css}" points="{pts}"/>')
    parts += legend
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 (every text above went through escape())


def stacked_bars(
    *,
    title: str,
    unit: str,
    edges: Sequence[float],
    stacks: Sequence[Stack],
    tz: tzinfo | None = None,
    width: int = 640,
    height: int = 200,
) -> Markup:
    """Counts per time bucket (``edges``: bucket boundaries, one more than counts),
    stacked by category; the legend gives each category's total."""
    buckets = max(0, len(edges) - 1)
    sums = [sum(s.counts[i] for s in stacks if i < len(s.counts)) for i in range(buckets)]
    yticks = nice_ticks(0, max(sums, default=0) or 1)
    start, end = (edges[0], edges[-1]) if buckets else (0.0, 1.0)
    f = _Frame(52, 40, width - 66, height - 70, start, end, 0, yticks[-1])
    totals = [(s, sum(s.counts)) for s in stacks]
    items = [(f"{s.name}: {n:,}", s.css, False) for s, n in totals]
    legend, legend_h = _legend(items, height + 4, width)
    total_h = int(height + legend_h + 4)
    summary = "; ".join(t for t, _, _ in items) or "none"
    parts = [_svg_open(width, total_h, f"{title}: {summary}"), _text(8, 16, title, "title")]
    parts += _axes(f, yticks, unit, tz)
    if not any(sums):
        parts.append(
            _text(
                f.left + f.width / 2,
                f.top + f.height / 2,
                f"no {unit} in this range",
                "empty",
                "middle",
            )
        )
    for i in range(buckets):
        x0, x1 = f.x(edges[i]), f.x(edges[i + 1])
        w = max(1.0, (x1 - x0) * 0.85)
        base = 0
        for s in stacks:
            n = s.counts[i] if i < len(s.counts) else 0
            if n <= 0:
                continue
            y_top, y_bottom = f.y(base + n), f.y(base)
            h = max(0.5, y_bottom - y_top)
            parts.append(
                f'<rect class="bar {s.css}" x="{x0:.1f}" y="{y_top:.1f}" width="{w:.1f}" '
                f'height="{h:.1f}"><title>{escape(s.name)}: {n}</title></rect>'
            )
            base += n
    parts += legend
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 (every text above went through escape())


def progress_bar(
    segments: Sequence[Segment],
    total: int,
    *,
    label: str,
    marker: tuple[str, int] | None = None,
    width: int = 640,
    height: int = 22,
) -> Markup:
    """A horizontal bar of ``total`` split into ``segments`` (each with its count as text
    when it fits); ``marker`` draws a labelled tick at a count (a wave's target)."""
    shown = [s for s in segments if s.count > 0]
    words = ", ".join(f"{s.label} {s.count}" for s in shown) or "nothing yet"
    text_h = 16
    full_h = height + text_h + (14 if marker else 0)
    parts = [_svg_open(width, full_h, f"{label}: {words} of {total}", "chart bar-chart")]
    top = 14 if marker else 0
    parts.append(f'<rect class="track" x="0" y="{top}" width="{width}" height="{height}"/>')
    x = 0.0
    scale = width / total if total > 0 else 0.0
    for s in shown:
        w = s.count * scale
        parts.append(
            f'<rect class="seg {s.css}" x="{x:.1f}" y="{top}" width="{w:.1f}" height="{height}">'
            f"<title>{escape(s.label)}: {s.count}</title></rect>"
        )
        text = f"{s.count}"
        if w >= len(text) * _CHAR_W + 6:
            parts.append(_text(x + w / 2, top + height / 2 + 4, text, "seg-label", "middle"))
        x += w
    if marker is not None and total > 0:
        mx = min(width - 1.0, marker[1] * scale)
        parts.append(
            f'<line class="marker" x1="{mx:.1f}" x2="{mx:.1f}" y1="0" y2="{top + height}"/>'
        )
        anchor = "end" if mx > width / 2 else "start"
        parts.append(_text(mx + (-3 if anchor == "end" else 3), 10, marker[0], "tick", anchor))
    parts.append(_text(0, top + height + 13, f"{words} (of {total})", "legend"))
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 (every text above went through escape())
