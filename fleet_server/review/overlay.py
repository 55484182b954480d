"""Both models' outputs drawn on a decision's image, for the review of a shadow
disagreement (pure: pixels and numbers in, a PNG out; OpenCV).

The live model's boxes and labels are drawn in :data:`LIVE_BGR`, the candidate's in
:data:`CANDIDATE_BGR`, and a legend band under the image names both versions with
their outcomes and, for a classifier or a score model, their top label and score as
text. Boxes are x1, y1, x2, y2 in frame pixels (``outputs["frame"]`` is the frame's
size; without it the image's own size stands for it) and are scaled to the image.
Without an image (the device kept no thumbnail of the frame) they are drawn on a grey
frame. A small thumbnail is scaled up to :data:`MIN_WIDTH` first so the text is
legible. PNG, not JPEG: the colours stay exact (a reader can tell the two models apart
by pixel, and so can the tests).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

LIVE_BGR = (255, 144, 30)
"""The live model's colour (blue, #1e90ff), BGR."""
CANDIDATE_BGR = (255, 0, 255)
"""The candidate's colour (magenta, #ff00ff), BGR."""
LIVE_HEX, CANDIDATE_HEX = "#1e90ff", "#ff00ff"
"""The same colours for a page's legend."""
MIN_WIDTH = 480
"""A narrower image is scaled up to this width before drawing."""
MAX_SIDE = 1280
"""A larger image is scaled down to fit this (the drawing stays cheap)."""
EMPTY_FRAME = (640, 480)
"""The grey frame without an image or a frame size."""
MAX_BOXES = 50
"""Boxes drawn per model."""
MAX_TEXT = 60
"""Characters of one text drawn."""
GREY = (96, 96, 96)
LEGEND_BG = (24, 24, 24)
FONT = cv2.FONT_HERSHEY_SIMPLEX
LINE_H = 20
LEGEND_H = LINE_H * 2 + 12
"""Height of the legend band under the image."""
SWATCH = ((6, 9), (20, 21))
"""The live model's colour swatch in the legend band (corners); the candidate's is
:data:`LINE_H` lower."""


@dataclass(frozen=True)
class Side:
    """One model to draw: ``title`` names it (e.g. ``live surface-check 1.0.0``),
    ``outcome`` is what it decided, ``outputs`` its post-processed outputs."""

    title: str
    outcome: str
    outputs: Mapping[str, Any]


def _num(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def ascii_text(text: str) -> str:
    """``text`` as OpenCV's fonts can draw it: printable ASCII (others as ``?``), at
    most :data:`MAX_TEXT` characters."""
    clean = "".join(c if 32 <= ord(c) < 127 else "?" for c in text)
    return clean if len(clean) <= MAX_TEXT else clean[: MAX_TEXT - 3] + "..."


def boxes(outputs: Mapping[str, Any]) -> list[tuple[float, float, float, float, str]]:
    """The boxes of ``outputs`` (``boxes``, then ``crops``) as (x1, y1, x2, y2, text)."""
    out = []
    for key in ("boxes", "crops"):
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
            score = _num(e.get("score"))
            text = (label if isinstance(label, str) else "box") + (
                f" {score:.2f}" if score is not None else ""
            )
            out.append((min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2), text))
    return out[:MAX_BOXES]


def summary(outputs: Mapping[str, Any]) -> str:
    """The outputs in a few words: a classifier's top label and score, a score model's
    score, a detector's box count."""
    top = outputs.get("top_k")
    if isinstance(top, list) and top and isinstance(top[0], Mapping):
        label, score = top[0].get("label"), _num(top[0].get("score"))
        words = label if isinstance(label, str) else "?"
        return words + (f" {score:.2f}" if score is not None else "")
    found = boxes(outputs)
    if found or isinstance(outputs.get("boxes"), list):
        return f"{len(found)} box{'' if len(found) == 1 else 'es'}"
    score = _num(outputs.get("score"))
    return "" if score is None else f"score {score:.2f}"


def frame_of(*outputs: Mapping[str, Any]) -> tuple[int, int] | None:
    """The first positive ``frame`` (width, height) among ``outputs``."""
    for o in outputs:
        frame = o.get("frame")
        if isinstance(frame, Mapping):
            w, h = _num(frame.get("width")), _num(frame.get("height"))
            if w is not None and h is not None and w >= 1 and h >= 1:
                return round(w), round(h)
    return None


def _canvas(image: np.ndarray | None, frame: tuple[int, int] | None) -> np.ndarray:
    if image is None:
        w, h = frame or EMPTY_FRAME
        scale = min(EMPTY_FRAME[0] / w, EMPTY_FRAME[1] / h)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        return np.full((size[1], size[0], 3), GREY, dtype=np.uint8)
    h, w = image.shape[:2]
    up = max(MIN_WIDTH / w, 1.0)
    scale = up * min(1.0, MAX_SIDE / (max(w, h) * up))
    if scale == 1.0:
        same: np.ndarray = image.copy()
        return same
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    resized: np.ndarray = cv2.resize(image, size, interpolation=cv2.INTER_LINEAR)
    return resized


def _draw_side(
    canvas: np.ndarray,
    side: Side,
    scale: tuple[float, float],
    colour: tuple[int, int, int],
    *,
    thickness: int,
    above: bool,
) -> None:
    h = canvas.shape[0]
    for x1, y1, x2, y2, text in boxes(side.outputs):
        p1 = (round(x1 * scale[0]), round(y1 * scale[1]))
        p2 = (round(x2 * scale[0]), round(y2 * scale[1]))
        cv2.rectangle(canvas, p1, p2, colour, thickness, cv2.LINE_8)
        y = p1[1] - 4 if above and p1[1] > LINE_H else min(p2[1] + 14, h - 2)
        cv2.putText(canvas, ascii_text(text), (max(0, p1[0]), y), FONT, 0.45, colour, 1,
                    cv2.LINE_AA)  # fmt: skip


def legend_lines(live: Side, candidate: Side) -> list[str]:
    """The legend's two lines: each model's title, outcome and outputs in a few words
    (e.g. ``candidate surface-check 1.1.0: pass (ok 0.88)``), as drawn."""
    lines = []
    for side in (live, candidate):
        words = f"{side.title}: {side.outcome}"
        said = summary(side.outputs)
        lines.append(ascii_text(words + (f" ({said})" if said else "")))
    return lines


def _legend(width: int, live: Side, candidate: Side) -> np.ndarray:
    """A band of the legend: a swatch of each model's colour and its line."""
    band = np.full((LEGEND_H, width, 3), LEGEND_BG, dtype=np.uint8)
    colours = (LIVE_BGR, CANDIDATE_BGR)
    for i, (text, colour) in enumerate(zip(legend_lines(live, candidate), colours, strict=True)):
        (x1, y1), (x2, y2) = SWATCH
        down = LINE_H * i
        cv2.rectangle(band, (x1, y1 + down), (x2, y2 + down), colour, -1)
        cv2.putText(band, text, (26, 20 + down), FONT, 0.45, colour, 1, cv2.LINE_AA)
    return band


def draw_comparison(image: np.ndarray | None, live: Side, candidate: Side) -> np.ndarray:
    """``image`` (BGR; None: a grey frame) with both models' boxes and a legend band
    under it naming both, as a new BGR array."""
    frame = frame_of(live.outputs, candidate.outputs)
    canvas = _canvas(image, frame)
    h, w = canvas.shape[:2]
    if frame is None:
        frame = (image.shape[1], image.shape[0]) if image is not None else (w, h)
    scale = (w / frame[0], h / frame[1])
    _draw_side(canvas, live, scale, LIVE_BGR, thickness=3, above=True)
    _draw_side(canvas, candidate, scale, CANDIDATE_BGR, thickness=1, above=False)
    return np.vstack([canvas, _legend(w, live, candidate)])


def decode(data: bytes) -> np.ndarray | None:
    """A stored image's pixels (BGR), or None when the bytes are no image OpenCV reads."""
    if not data:
        return None
    pixels = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    return pixels if isinstance(pixels, np.ndarray) and pixels.size else None


def encode_png(pixels: np.ndarray) -> bytes:
    """``pixels`` (BGR) as PNG bytes.

    Raises:
        ValueError: OpenCV could not encode them.
    """
    ok, buf = cv2.imencode(".png", pixels)
    if not ok:
        raise ValueError("the comparison image could not be encoded as PNG")
    return bytes(buf.tobytes())


def comparison_png(data: bytes | None, live: Side, candidate: Side) -> bytes:
    """The PNG of both models' outputs on the stored image ``data`` (None, or bytes that
    are no image: on a grey frame)."""
    image = decode(data) if data is not None else None
    return encode_png(draw_comparison(image, live, candidate))
