"""Counting what each model version saw and said, per bucket (pure: no I/O, no clock).

:class:`DriftAccumulator` takes one decision at a time (its fields and, for an image
input, the frame) and adds it to the in-memory :class:`HourCounts` of its key
(model name, model version, line, source, bucket start): ``n``, outcome counts, top-class
counts (at most :data:`agent.wire.quality.MAX_CLASSES` labels, the rest under
:data:`agent.wire.quality.OTHER`) and the fixed-bin histograms of
:data:`agent.wire.quality.DRIFT_BINS`: ``score`` (the top item's score), ``detections``
(count per frame) and ``box_area`` (each listed box's area over the frame's) for
detections, and ``brightness``/``contrast``/``sharpness`` of an image
(:mod:`agent.drift.inputs`). :mod:`agent.drift.store` adds the counts to the decision
log's ``drift_hours`` rows.

A decision's ``outputs`` is the post-processed summary the pipeline logs: a
classification's ``top_k`` list, a score's ``score``, a detection's ``count`` and
``boxes`` (best first) with the ``frame`` size, or a plain ``label``/``score``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.drift.inputs import input_stats
from agent.wire.quality import DRIFT_BINS, HOUR_S, MAX_CLASSES, OTHER, bin_index

Key = tuple[str, str, str, str, int]
"""(model_name, model_version, line, source, bucket start): a drift_hours row's key."""


@dataclass
class HourCounts:
    """The counts of one key: what a drift_hours row holds."""

    n: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    top_class: dict[str, int] = field(default_factory=dict)
    hist: dict[str, list[int]] = field(default_factory=dict)

    def count(self, name: str, value: float) -> None:
        """One value into histogram ``name`` (made on first use)."""
        counts = self.hist.get(name)
        if counts is None:
            counts = self.hist[name] = [0] * (len(DRIFT_BINS[name]) - 1)
        counts[bin_index(name, value)] += 1

    def add_class(self, label: str, k: int = 1) -> None:
        """``k`` more of ``label``; a label past the first :data:`MAX_CLASSES` goes to
        :data:`OTHER`."""
        top = self.top_class
        if label not in top and (label == OTHER or len(top) - (OTHER in top) >= MAX_CLASSES):
            label = OTHER
        top[label] = top.get(label, 0) + k

    def merge(self, other: HourCounts) -> None:
        """Add ``other``'s counts to these (a histogram of another length is refused)."""
        self.n += other.n
        for outcome, k in other.outcomes.items():
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + k
        for label, k in other.top_class.items():
            self.add_class(label, k)
        for name, counts in other.hist.items():
            mine = self.hist.get(name)
            if mine is None:
                self.hist[name] = list(counts)
                continue
            if len(mine) != len(counts):
                raise ValueError(f"hist.{name}: {len(counts)} bins, expected {len(mine)}")
            for i, k in enumerate(counts):
                mine[i] += k


@dataclass(frozen=True)
class Seen:
    """What one decision's outputs say, as drift counts it."""

    label: str | None = None
    score: float | None = None
    detections: int | None = None
    box_areas: tuple[float, ...] = ()


def bucket(t: float, period_s: int) -> int:
    """The start of the bucket of Unix time ``t``.

    Raises:
        ValueError: ``t`` is not a finite time at or after the epoch.
    """
    if not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0):
        raise ValueError(f"decision time {t!r} is not a Unix time")
    return int(t // period_s) * period_s


def read_outputs(outputs: Mapping[str, Any], frame_wh: tuple[int, int] | None = None) -> Seen:
    """The top label, top score, detection count and box areas in ``outputs`` (see the
    module docstring); what is missing or not a number is left out. ``frame_wh`` is the
    frame's (width, height) when ``outputs`` names none."""
    if not isinstance(outputs, Mapping):
        return Seen()
    boxes = outputs.get("boxes")
    count = _int(outputs.get("count"))
    if isinstance(boxes, list) or count is not None:
        return _detections(outputs, boxes if isinstance(boxes, list) else [], count, frame_wh)
    top_k = outputs.get("top_k")
    if isinstance(top_k, list) and top_k and isinstance(top_k[0], Mapping):
        return Seen(label=_label(top_k[0].get("label")), score=_num(top_k[0].get("score")))
    return Seen(label=_label(outputs.get("label")), score=_num(outputs.get("score")))


def _detections(
    outputs: Mapping[str, Any],
    boxes: list[Any],
    count: int | None,
    frame_wh: tuple[int, int] | None,
) -> Seen:
    frame = outputs.get("frame")
    wh = frame_wh
    if isinstance(frame, Mapping):
        w, h = _num(frame.get("width")), _num(frame.get("height"))
        if w and h and w > 0 and h > 0:
            wh = (int(w), int(h))
    areas: list[float] = []
    label: str | None = None
    score: float | None = None
    for i, item in enumerate(boxes):
        if not isinstance(item, Mapping):
            continue
        if i == 0:  # best first
            label, score = _label(item.get("label")), _num(item.get("score"))
        box = item.get("box")
        if wh is None or not isinstance(box, list) or len(box) != 4:
            continue
        x1, y1, x2, y2 = (_num(v) for v in box)
        if x1 is None or y1 is None or x2 is None or y2 is None:
            continue
        area = max(0.0, x2 - x1) * max(0.0, y2 - y1) / (wh[0] * wh[1])
        areas.append(min(1.0, area))
    n = count if count is not None else len(boxes)
    return Seen(label=label, score=score, detections=n, box_areas=tuple(areas))


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _label(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)[:200]


class DriftAccumulator:
    """In-memory counts per key since the last :meth:`take` (not thread-safe: one
    thread, the decision log's writer, uses it)."""

    def __init__(self, period_s: int = HOUR_S, *, image_stats: bool = True) -> None:
        self.period_s = period_s
        self.image_stats = image_stats
        self.rows: dict[Key, HourCounts] = {}
        self.pending = 0
        """Decisions added since the last take."""

    def add(
        self,
        *,
        model_name: str,
        model_version: str,
        line: str,
        source: str,
        decision_time: float,
        outcome: str,
        outputs: Mapping[str, Any],
        frame: Any = None,
    ) -> None:
        """Count one decision; ``frame`` is its input image (None: not an image).

        Raises:
            ValueError: the decision time is not a Unix time, or the frame is not an
                image (:class:`agent.drift.inputs.FrameError`); nothing was counted.
        """
        key = (model_name, model_version, line, source, bucket(decision_time, self.period_s))
        stats = input_stats(frame) if frame is not None and self.image_stats else None
        shape = getattr(frame, "shape", None)
        frame_wh = (int(shape[1]), int(shape[0])) if shape is not None else None
        seen = read_outputs(outputs, frame_wh)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = HourCounts()
        row.n += 1
        row.outcomes[outcome] = row.outcomes.get(outcome, 0) + 1
        if seen.label is not None:
            row.add_class(seen.label)
        if seen.score is not None:
            row.count("score", seen.score)
        if seen.detections is not None:
            row.count("detections", seen.detections)
        for area in seen.box_areas:
            row.count("box_area", area)
        if stats is not None:
            row.count("brightness", stats.brightness)
            row.count("contrast", stats.contrast)
            row.count("sharpness", stats.sharpness)
        self.pending += 1

    def take(self) -> dict[Key, HourCounts]:
        """The counts since the last take; the accumulator starts again from none."""
        rows, self.rows = self.rows, {}
        self.pending = 0
        return rows

    def put_back(self, rows: Iterable[tuple[Key, HourCounts]]) -> None:
        """Add counts taken but not stored (the store failed) back, to try again."""
        for key, counts in rows:
            mine = self.rows.get(key)
            if mine is None:
                self.rows[key] = counts
            else:
                mine.merge(counts)
            self.pending += counts.n
