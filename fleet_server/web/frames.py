"""A decision's boxes drawn over its image, or on an empty frame without one (pure: markup
from numbers).

The boxes of a decision's ``outputs`` (``boxes``, and a chained model's ``crops``) are
x1, y1, x2, y2 in frame pixels, and ``outputs["frame"]`` is the frame's size. The image a
device uploads is the whole frame scaled down, aspect kept (a thumbnail of at most 320
pixels a side by default), so the boxes are scaled by shown size / frame size and drawn
as an SVG laid over an ``<img>`` of the same size; a page's stylesheet stacks the two
(the console's CSP allows no inline style). Without the frame's size, the image's own
size stands for it and the page says "frame size unknown". Without an image, the frame is
drawn empty, sized by ``outputs["frame"]`` or else to hold every box (at least 640 x 480),
saying "no image uploaded". Each box is outlined with its label and score; a crop is
dashed. The list's thumbnail is the same drawing, small and without box labels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from markupsafe import Markup, escape

MIN_W, MIN_H = 640, 480
MAX_BOXES = 50
DETAIL = (640, 480)
"""The box a decision page fits its drawing in (CSS pixels), aspect kept."""
THUMB = (112, 84)
"""The box a list row fits its thumbnail in."""
TEXT_MIN_W = 200
"""Narrower drawings carry no box labels (they would not be legible), only, on an empty
frame, a small "no image uploaded"."""
NO_IMAGE = "no image uploaded"
NO_FRAME_SIZE = "frame size unknown"


@dataclass(frozen=True)
class Box:
    """One box in frame pixels (or, once scaled, in the drawing's)."""

    x1: float
    y1: float
    x2: float
    y2: float
    label: str
    score: float | None
    crop: bool = False


@dataclass(frozen=True)
class Picture:
    """A decision's stored image: where the browser gets it, and its size in pixels."""

    url: str
    width: int
    height: int


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


def frame_of(outputs: Any) -> tuple[int, int] | None:
    """The frame's (width, height) the device recorded in ``outputs["frame"]``; None
    when it is missing or not two positive sizes."""
    frame = outputs.get("frame") if isinstance(outputs, Mapping) else None
    if not isinstance(frame, Mapping):
        return None
    w, h = _num(frame.get("width")), _num(frame.get("height"))
    if w is None or h is None or w < 1 or h < 1:
        return None
    return round(w), round(h)


def frame_size(boxes: Sequence[Box]) -> tuple[int, int]:
    """An empty frame that holds every box, at least :data:`MIN_W` x :data:`MIN_H`."""
    w = max([MIN_W, *(math.ceil(b.x2) for b in boxes)])
    h = max([MIN_H, *(math.ceil(b.y2) for b in boxes)])
    return w, h


def fit(size: tuple[int, int], within: tuple[int, int]) -> tuple[int, int]:
    """``size`` scaled (up or down, aspect kept) to the largest that fits ``within``."""
    w, h = size
    scale = min(within[0] / w, within[1] / h)
    return max(1, round(w * scale)), max(1, round(h * scale))


def scale_boxes(boxes: Sequence[Box], frame: tuple[int, int], shown: tuple[int, int]) -> list[Box]:
    """``boxes`` in frame pixels of a ``frame`` (width, height) moved to a drawing of
    ``shown`` size: x by shown width / frame width, y by shown height / frame height."""
    sx, sy = shown[0] / frame[0], shown[1] / frame[1]
    return [replace(b, x1=b.x1 * sx, y1=b.y1 * sy, x2=b.x2 * sx, y2=b.y2 * sy) for b in boxes]


def _aria(label: str, boxes: Sequence[Box], where: str) -> str:
    words = "; ".join(
        f"{b.label or 'box'} {b.score:.2f}" if b.score is not None else b.label or "box"
        for b in boxes
    )
    n = len(boxes)
    return (
        f"{label}: {n} box{'' if n == 1 else 'es'}"
        + (f" ({words})" if words else "")
        + (f", {where}" if where else "")
    )


LABEL_CHAR_W = 0.62
"""A label character's width in font sizes (what placing labels apart assumes)."""


def label_y(
    placed: list[tuple[float, float, float, float]],
    x: float,
    y: float,
    width: float,
    font: float,
    height: float,
) -> float:
    """The baseline of a label at ``x`` (wanted at ``y``) moved down, a line at a time,
    until it overlaps none of the labels ``placed`` so far (boxes at one place would print
    their labels over each other); the label's box is added to ``placed``."""
    top = y - font
    for _ in range(len(placed) + 1):
        if not any(
            x < px + pw and px < x + width and top < py + ph and py < top + font
            for px, py, pw, ph in placed
        ):
            break
        top += font + 2
    top = min(top, max(0.0, height - font))
    placed.append((x, top, width, font))
    return top + font


def _svg(
    boxes: Sequence[Box], shown: tuple[int, int], aria: str, *, over: bool, empty_text: str
) -> str:
    """The boxes (already in the drawing's pixels) as an SVG of ``shown`` size."""
    w, h = shown
    text = w >= TEXT_MIN_W
    stroke = 2.0 if text else 1.5
    font = 12
    css = "frame over" if over else "frame"
    parts = [
        f'<svg class="{css}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        f'aria-label="{escape(aria)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(aria)}</title>"
    ]
    if not over:
        parts.append(f'<rect class="frame-bg" x="0" y="0" width="{w}" height="{h}"/>')
    placed: list[tuple[float, float, float, float]] = []
    for i, b in enumerate(boxes):
        kind = f"box c{i % 8}" + (" crop" if b.crop else "")
        parts.append(
            f'<rect class="{kind}" x="{b.x1:.1f}" y="{b.y1:.1f}" width="{b.x2 - b.x1:.1f}" '
            f'height="{b.y2 - b.y1:.1f}" stroke-width="{stroke:.1f}"/>'
        )
        if text:
            words = (b.label or "box") + (f" {b.score:.2f}" if b.score is not None else "")
            y = b.y1 - stroke * 2 if b.y1 > font * 1.5 else b.y2 + font
            y = label_y(placed, b.x1, y, len(words) * font * LABEL_CHAR_W, font, h)
            parts.append(
                f'<text class="box-label" x="{b.x1:.1f}" y="{y:.1f}" font-size="{font}">'
                f"{escape(words)}</text>"
            )
    if empty_text:
        parts.append(
            f'<text class="box-label" x="{w / 2:.0f}" y="{h / 2:.0f}" text-anchor="middle" '
            f'font-size="{font if text else 10}">{escape(empty_text)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def draw(
    boxes: Sequence[Box],
    *,
    image: Picture | None = None,
    frame: tuple[int, int] | None = None,
    within: tuple[int, int] = DETAIL,
    label: str = "frame",
    lazy: bool = True,
) -> Markup:
    """The boxes over ``image`` (or on an empty frame without one), fitted ``within``.

    ``frame`` is the frame's size the boxes are in (``outputs["frame"]``); without it the
    image's own size stands for it (or, without an image, :func:`frame_size`).
    """
    if image is None:
        source = frame or frame_size(boxes)
        shown = fit(source, within)
        small = shown[0] < TEXT_MIN_W
        empty = NO_IMAGE if boxes or small else f"{NO_IMAGE} · no boxes in the outputs"
        aria = _aria(label, boxes, NO_IMAGE)
        svg = _svg(scale_boxes(boxes, source, shown), shown, aria, over=False, empty_text=empty)
        return Markup(svg)  # noqa: S704 (every text in it went through escape())
    source = frame or (image.width, image.height)
    shown = fit((image.width, image.height), within)
    where = f"on the uploaded image ({image.width} x {image.height})" + (
        "" if frame else f"; {NO_FRAME_SIZE}"
    )
    aria = _aria(label, boxes, where)
    svg = _svg(scale_boxes(boxes, source, shown), shown, aria, over=True, empty_text="")
    loading = ' loading="lazy"' if lazy else ""
    return Markup(  # noqa: S704 (the URL and every text went through escape())
        f'<span class="shot"><img src="{escape(image.url)}" width="{shown[0]}" '
        f'height="{shown[1]}" alt=""{loading} decoding="async">{svg}</span>'
    )
