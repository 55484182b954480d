"""Drift per (model version, line): the current window's histograms against a reference
window's, judged by PSI and Jensen-Shannon distance. Pure: no I/O (the job that reads
the buckets, keeps the verdicts and emits events is :mod:`fleet_server.quality.drift_job`).

Devices upload drift buckets (:class:`agent.wire.quality.DriftHour`, stored as
:class:`fleet_server.quality.store.DriftRow`): per model version, line, source and
bucket (an hour, or ``period_s`` seconds), counts of outcomes, top classes and fixed-bin
histograms. For one (model_name, model_version, line) the buckets of every device and
source are summed (:class:`Counts`), and two windows are compared:

- **reference**: the ``reference_hours`` after the first bucket of that version on that
  line (when it reached the line), or a window an operator pinned;
- **current**: the last ``window_hours`` of data (up to the newest bucket, never past
  now), starting no earlier than the reference's end (the two never overlap: a version
  is not compared with itself while its reference fills).

A bucket belongs to a window when its start does. Each histogram (:data:`NUMERIC`,
plus ``outcomes`` and ``top_class`` over the union of their labels) present on both
sides gets a PSI and a JS distance. A window pair is *judged* only when each side
counts at least ``min_count`` decisions; it is *drifted* when judged and any histogram's
PSI is above ``psi_threshold`` or its JS distance above ``js_threshold``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.wire.quality import DRIFT_BINS
from fleet_server.quality.stats import js_distance, psi
from fleet_server.quality.store import DriftRow

HOUR_S = 3600.0
NUMERIC = ("score", "detections", "box_area", "brightness", "contrast", "sharpness")
"""The fixed-bin histograms compared (bins: :data:`agent.wire.quality.DRIFT_BINS`)."""
CATEGORICAL = ("outcomes", "top_class")
"""The label counts compared, over the union of both sides' labels."""
HISTOGRAMS = (*NUMERIC, *CATEGORICAL)

Key = tuple[str, str, str]
"""(model_name, model_version, line)."""


@dataclass(frozen=True)
class DriftSettings:
    """How drift is judged (fleet.toml ``[drift]``: :class:`fleet_server.config.DriftSection`)."""

    reference_hours: float = 24.0
    window_hours: float = 24.0
    min_count: int = 500
    psi_threshold: float = 0.25
    js_threshold: float = 0.2

    @classmethod
    def of(cls, section: Any) -> DriftSettings:
        """The settings of a ``[drift]`` section (any object with these attributes)."""
        return cls(
            reference_hours=float(section.reference_hours),
            window_hours=float(section.window_hours),
            min_count=int(section.min_count),
            psi_threshold=float(section.psi_threshold),
            js_threshold=float(section.js_threshold),
        )


@dataclass
class Counts:
    """Summed counts of some buckets."""

    n: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    top_class: Counter[str] = field(default_factory=Counter)
    hist: dict[str, list[int]] = field(default_factory=dict)
    buckets: int = 0
    devices: set[str] = field(default_factory=set)
    period_s: int = 0

    def add(self, row: DriftRow) -> None:
        """Add one device's bucket (a histogram whose bins don't match DRIFT_BINS, from
        another version of the contract, is left out)."""
        self.n += row.n
        self.outcomes.update(row.outcomes)
        self.top_class.update(row.top_class)
        for name, counts in row.hist.items():
            edges = DRIFT_BINS.get(name)
            if edges is None or len(counts) != len(edges) - 1:
                continue
            held = self.hist.setdefault(name, [0] * len(counts))
            for i, c in enumerate(counts):
                held[i] += c
        self.buckets += 1
        self.devices.add(row.device_id)
        self.period_s = max(self.period_s, row.period_s)


@dataclass(frozen=True)
class Window:
    """A time window ``[start, end)`` (Unix s) and how many decisions it holds."""

    start: float
    end: float
    n: int = 0
    pinned: bool = False

    def holds(self, bucket_start: float) -> bool:
        return self.start <= bucket_start < self.end

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "n": self.n, "pinned": self.pinned}


@dataclass(frozen=True)
class HistogramDrift:
    """One histogram's comparison: ``psi`` and ``js`` are None when a side is empty."""

    name: str
    reference_n: int
    current_n: int
    psi: float | None
    js: float | None
    over: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "psi": self.psi,
            "js": self.js,
            "reference_n": self.reference_n,
            "current_n": self.current_n,
            "over": self.over,
        }


@dataclass(frozen=True)
class DriftReport:
    """The verdict for one (model version, line)."""

    model_name: str
    model_version: str
    line: str
    reference: Window
    current: Window
    judged: bool
    drifted: bool
    reason: str
    histograms: dict[str, HistogramDrift]
    devices: int = 0

    @property
    def key(self) -> Key:
        return (self.model_name, self.model_version, self.line)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the API's item, the status table's ``result``)."""
        return {
            "model_name": self.model_name,
            "model_version": self.model_version,
            "line": self.line,
            "reference": self.reference.to_dict(),
            "current": self.current.to_dict(),
            "judged": self.judged,
            "drifted": self.drifted,
            "reason": self.reason,
            "devices": self.devices,
            "histograms": {k: v.to_dict() for k, v in self.histograms.items()},
        }


def _sides(name: str, reference: Counts, current: Counts) -> tuple[list[int], list[int]] | None:
    """Both sides' counts of histogram ``name`` over the same bins (None: on neither)."""
    if name in CATEGORICAL:
        ref_labels, cur_labels = getattr(reference, name), getattr(current, name)
        labels = sorted(set(ref_labels) | set(cur_labels))
        if not labels:
            return None
        return [ref_labels[k] for k in labels], [cur_labels[k] for k in labels]
    ref, cur = reference.hist.get(name), current.hist.get(name)
    if ref is None and cur is None:
        return None
    empty = [0] * (len(DRIFT_BINS[name]) - 1)
    return (ref or empty), (cur or empty)


def compare(
    reference: Counts, current: Counts, settings: DriftSettings
) -> dict[str, HistogramDrift]:
    """PSI and JS distance of every histogram present on either side (None on both
    when a side has no count in it)."""
    out: dict[str, HistogramDrift] = {}
    for name in HISTOGRAMS:
        sides = _sides(name, reference, current)
        if sides is None:
            continue
        r, c = sides
        r_n, c_n = sum(r), sum(c)
        if not r_n or not c_n:
            out[name] = HistogramDrift(name, r_n, c_n, None, None, False)
            continue
        p, j = psi(r, c), js_distance(r, c)
        over = p > settings.psi_threshold or j > settings.js_threshold
        out[name] = HistogramDrift(name, r_n, c_n, round(p, 6), round(j, 6), over)
    return out


def merge(rows: Iterable[DriftRow]) -> dict[Key, dict[int, Counts]]:
    """The rows summed per (model_name, model_version, line) and bucket start."""
    merged: dict[Key, dict[int, Counts]] = {}
    for row in rows:
        key = (row.model_name, row.model_version, row.line)
        merged.setdefault(key, {}).setdefault(row.hour, Counts()).add(row)
    return merged


def reference_window(
    first_bucket: float, settings: DriftSettings, pin: tuple[float, float] | None = None
) -> Window:
    """The reference: the pinned window, or ``reference_hours`` from the first bucket."""
    if pin is not None:
        return Window(pin[0], pin[1], pinned=True)
    return Window(first_bucket, first_bucket + settings.reference_hours * HOUR_S)


def current_window(
    reference: Window, settings: DriftSettings, now: float, newest: float | None = None
) -> Window:
    """The last ``window_hours`` of data: up to the newest bucket (its start ``newest``;
    never past ``now``), from the reference's end at the earliest (empty, start == end,
    while the reference is still filling).

    Ending at the newest bucket, not at ``now``, keeps the window full although devices
    upload a bucket only once it is over: a line whose devices stopped keeps the verdict
    of its last data, which the window's dates show.
    """
    end = now if newest is None else min(now, newest + 1)
    start = max(end - settings.window_hours * HOUR_S, reference.end)
    return Window(min(start, end), end)


def sum_window(buckets: Mapping[int, Counts], window: Window) -> Counts:
    """The buckets whose start is in ``window``, summed."""
    total = Counts()
    for start, counts in buckets.items():
        if window.holds(start):
            total.n += counts.n
            total.outcomes.update(counts.outcomes)
            total.top_class.update(counts.top_class)
            for name, h in counts.hist.items():
                held = total.hist.setdefault(name, [0] * len(h))
                for i, c in enumerate(h):
                    held[i] += c
            total.buckets += counts.buckets
            total.devices |= counts.devices
            total.period_s = max(total.period_s, counts.period_s)
    return total


def judge(
    key: Key,
    reference: Window,
    current: Window,
    ref_counts: Counts,
    cur_counts: Counts,
    settings: DriftSettings,
) -> DriftReport:
    """The verdict for ``key`` from the two windows' sums."""
    ref = Window(reference.start, reference.end, ref_counts.n, reference.pinned)
    cur = Window(current.start, current.end, cur_counts.n)
    devices = len(ref_counts.devices | cur_counts.devices)
    if ref.n < settings.min_count or cur.n < settings.min_count:
        reason = (
            f"not judged: {ref.n} decisions in the reference window and {cur.n} in the "
            f"current one (min_count {settings.min_count} on each side)"
        )
        return DriftReport(*key, ref, cur, False, False, reason, {}, devices)
    histograms = compare(ref_counts, cur_counts, settings)
    over = [h for h in histograms.values() if h.over]
    if over:
        reason = "drifted: " + "; ".join(_over_text(h, settings) for h in over)
        return DriftReport(*key, ref, cur, True, True, reason, histograms, devices)
    scored = [h for h in histograms.values() if h.psi is not None]
    if scored:
        top = max(scored, key=lambda h: h.psi or 0.0)
        reason = (
            f"within thresholds: largest PSI {top.psi:.3f} ({top.name}), "
            f"thresholds PSI {settings.psi_threshold:g} and JS {settings.js_threshold:g}"
        )
    else:
        reason = "within thresholds: no histogram on both sides"
    return DriftReport(*key, ref, cur, True, False, reason, histograms, devices)


def _over_text(h: HistogramDrift, settings: DriftSettings) -> str:
    parts = []
    if h.psi is not None and h.psi > settings.psi_threshold:
        parts.append(f"PSI {h.psi:.3f} > {settings.psi_threshold:g}")
    if h.js is not None and h.js > settings.js_threshold:
        parts.append(f"JS {h.js:.3f} > {settings.js_threshold:g}")
    return f"{h.name}: {', '.join(parts)}"


def evaluate(
    key: Key,
    buckets: Mapping[int, Counts],
    settings: DriftSettings,
    now: float,
    pin: tuple[float, float] | None = None,
) -> DriftReport:
    """The verdict for ``key`` from its merged buckets (all those of the key, or at
    least those of both windows and the first one)."""
    if not buckets:
        raise ValueError(f"no drift buckets for {key}")
    reference = reference_window(float(min(buckets)), settings, pin)
    current = current_window(reference, settings, now, float(max(buckets)))
    return judge(
        key,
        reference,
        current,
        sum_window(buckets, reference),
        sum_window(buckets, current),
        settings,
    )


def trend(
    buckets: Mapping[int, Counts],
    reference: Window,
    settings: DriftSettings,
    *,
    points: int = 120,
) -> list[tuple[float, float | None, str]]:
    """For the chart: at the end of each bucket after the reference (the last
    ``points``), the largest PSI of the trailing ``window_hours`` against the reference
    and its histogram (None while that window counts under ``min_count``)."""
    ref_counts = sum_window(buckets, reference)
    starts = sorted(s for s in buckets if s >= reference.end)[-points:]
    out: list[tuple[float, float | None, str]] = []
    for start in starts:
        end = start + (buckets[start].period_s or HOUR_S)
        window = Window(max(end - settings.window_hours * HOUR_S, reference.end), end)
        cur = sum_window(buckets, window)
        if ref_counts.n < settings.min_count or cur.n < settings.min_count:
            out.append((end, None, ""))
            continue
        scored = [h for h in compare(ref_counts, cur, settings).values() if h.psi is not None]
        top = max(scored, key=lambda h: h.psi or 0.0, default=None)
        out.append((end, None if top is None else top.psi, "" if top is None else top.name))
    return out
