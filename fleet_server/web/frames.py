"""A decision's boxes drawn on its frame, as SVG (pure).

Decision uploads carry no pixels (the device keeps its thumbnails in its own decision
log), so the frame is drawn empty, sized to hold every box (at least 640 x 480), and
each box is outlined with its label and score; a crop of a second model is dashed.
The list's thumbnail is the same drawing, small.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

MIN_W, MIN_H = 640, 480
MAX_BOXES = 50


@dataclass(frozen=True)
class Box:
    """One box in frame pixels."""

    x1: float
    y1: float
    x2: float
    y2: float
    label: str
    score: float | None
    crop: bool = False


def _num(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def boxes_of(outputs: Any) -> list[Box]:
    """The boxes of a decision's post-processed ``outputs`` (``boxes``, then ``crops``)."""
    if not isinstance(outputs, Mapping):
        return []
    out: list[Box] = []
    for key, crop in (("boxes", False), ("crops", True)):
        entries = outputs.get(key)
        for e in entries if isinstance(entries, list) else []:
            box = e.get("box") if isinstance(e, Mapping) else None
            if not isinstance(box, list) or len(box) != 4:
                continue
            values = [_num(v) for v in box]
            if any(v is None for v in values):
                continue
            x1, y1, x2, y2 = (v or 0.0 for v in values)
            label = e.get("label")
            out.append(
                Box(min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2),
                    label if isinstance(label, str) else "", _num(e.get("score")), crop)
            )  # fmt: skip
    return out[:MAX_BOXES]


def frame_size(boxes: Sequence[Box]) -> tuple[int, int]:
    """An empty frame that holds every box, at least :data:`MIN_W` x :data:`MIN_H`."""
    w = max([MIN_W, *(math.ceil(b.x2) for b in boxes)])
    h = max([MIN_H, *(math.ceil(b.y2) for b in boxes)])
    return w, h


def frame_svg(boxes: Sequence[Box], *, width: int = 640, label: str = "frame") -> Markup:
    """The boxes on an empty frame, ``width`` pixels wide on the page."""
    fw, fh = frame_size(boxes)
    height = round(width * fh / fw)
    words = "; ".join(
        f"{b.label or 'box'} {b.score:.2f}" if b.score is not None else b.label or "box"
        for b in boxes
    )
    aria = f"{label}: {len(boxes)} box{'' if len(boxes) == 1 else 'es'}" + (
        f" ({words})" if words else ""
    )
    stroke = max(1.0, fw / width * 2)
    font = max(10.0, fw / width * 12)
    parts = [
        f'<svg class="frame" viewBox="0 0 {fw} {fh}" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(aria)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(aria)}</title>"
        f'<rect class="frame-bg" x="0" y="0" width="{fw}" height="{fh}"/>'
    ]
    for i, b in enumerate(boxes):
        css = f"box c{i % 8}" + (" crop" if b.crop else "")
        parts.append(
            f'<rect class="{css}" x="{b.x1:.1f}" y="{b.y1:.1f}" width="{b.x2 - b.x1:.1f}" '
            f'height="{b.y2 - b.y1:.1f}" stroke-width="{stroke:.1f}"/>'
        )
        if width >= 200:
            text = (b.label or "box") + (f" {b.score:.2f}" if b.score is not None else "")
            y = b.y1 - stroke * 2 if b.y1 > font * 1.5 else b.y2 + font
            parts.append(
                f'<text class="box-label" x="{b.x1:.1f}" y="{y:.1f}" font-size="{font:.0f}">'
                f"{escape(text)}</text>"
            )
    if not boxes and width >= 200:
        parts.append(
            f'<text class="box-label" x="{fw / 2:.0f}" y="{fh / 2:.0f}" text-anchor="middle" '
            f'font-size="{font:.0f}">no boxes in the outputs</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 (every text above went through escape())
