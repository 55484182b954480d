"""Synthetic decision thumbnails for the review bench and the tests: a grey part on a
dark conveyor belt, with a dark scratch inside each defect box, as the JPEG a device's
decision log keeps (the whole frame scaled down, longest side 320 pixels by default).

Deterministic: the same boxes, frame and seed give the same bytes. Small: a few KB each.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

MAX_SIDE = 320
"""The decision log's default thumbnail size (``[decision_log] thumbnail_max_side``)."""
QUALITY = 80
BELT = (64, 62, 58)
PART = (176, 178, 181)
SCRATCH = (38, 36, 40)
_BELT_PITCH = 7
_MARGIN = 0.12
"""Around the defect boxes, the part extends this share of the frame's shorter side."""


def _part_rect(
    boxes: Sequence[Sequence[float]], w: int, h: int, rng: random.Random
) -> tuple[int, int, int, int]:
    """Where the part lies (thumbnail pixels): around every box, or mid-belt without one
    (or when the boxes lie off the frame)."""
    m = _MARGIN * min(w, h)
    if boxes:
        x1 = max(2, int(min(b[0] for b in boxes) - m))
        y1 = max(2, int(min(b[1] for b in boxes) - m))
        x2 = min(w - 3, int(max(b[2] for b in boxes) + m))
        y2 = min(h - 3, int(max(b[3] for b in boxes) + m))
        if x2 - x1 >= 8 and y2 - y1 >= 8:
            return x1, y1, x2, y2
    cx = w / 2 + rng.uniform(-0.1, 0.1) * w
    cy = h / 2 + rng.uniform(-0.05, 0.05) * h
    half_w, half_h = w * rng.uniform(0.22, 0.3), h * rng.uniform(0.25, 0.32)
    return int(cx - half_w), int(cy - half_h), int(cx + half_w), int(cy + half_h)


def _hole(img: Any, part: tuple[int, int, int, int], boxes: Sequence[Sequence[float]]) -> None:
    """A mounting hole in a corner of the part that no defect box touches (none if every
    corner is taken)."""
    x1, y1, x2, y2 = part
    r = max(2, min(x2 - x1, y2 - y1) // 12)
    for fx, fy in ((0.2, 0.25), (0.8, 0.25), (0.2, 0.75), (0.8, 0.75)):
        cx, cy = round(x1 + (x2 - x1) * fx), round(y1 + (y2 - y1) * fy)
        clear = all(cx + r < b[0] or cx - r > b[2] or cy + r < b[1] or cy - r > b[3] for b in boxes)
        if clear:
            cv2.circle(img, (cx, cy), r, (70, 70, 72), -1, cv2.LINE_AA)
            return


def _scratch(img: Any, box: Sequence[float], rng: random.Random) -> None:
    """A dark, slightly bent scratch from one corner region of ``box`` to the other."""
    x1, y1, x2, y2 = box
    bw, bh = max(2.0, x2 - x1), max(2.0, y2 - y1)
    start = (x1 + bw * rng.uniform(0.1, 0.3), y1 + bh * rng.uniform(0.15, 0.4))
    end = (x1 + bw * rng.uniform(0.7, 0.9), y1 + bh * rng.uniform(0.6, 0.85))
    bend = (
        (start[0] + end[0]) / 2 + bw * rng.uniform(-0.15, 0.15),
        (start[1] + end[1]) / 2 + bh * rng.uniform(-0.15, 0.15),
    )
    points = np.array([start, bend, end], dtype=np.int32).reshape(-1, 1, 2)
    thickness = max(1, round(min(bw, bh) / 14))
    cv2.polylines(img, [points], False, SCRATCH, thickness, cv2.LINE_AA)


def thumbnail(
    boxes: Sequence[Sequence[float]],
    frame: tuple[int, int],
    seed: int,
    *,
    max_side: int = MAX_SIDE,
    quality: int = QUALITY,
) -> bytes:
    """A JPEG of a ``frame`` (width, height) scaled to at most ``max_side`` a side, with a
    scratch inside each of ``boxes`` (x1, y1, x2, y2 in frame pixels).

    Raises:
        ValueError: the frame has no area, or OpenCV could not encode the image.
    """
    fw, fh = frame
    if fw < 1 or fh < 1:
        raise ValueError(f"frame {fw} x {fh} has no area")
    scale = min(1.0, max_side / max(fw, fh))
    w, h = max(1, round(fw * scale)), max(1, round(fh * scale))
    rng = random.Random(seed)  # noqa: S311 (bench pictures, not secrets)
    shown = [[v * scale for v in b] for b in boxes]
    img = np.full((h, w, 3), BELT, dtype=np.uint8)
    for y in range(rng.randrange(_BELT_PITCH), h, _BELT_PITCH):  # the belt's ribs
        cv2.line(img, (0, y), (w - 1, y), (54, 52, 49), 1)
    cv2.rectangle(img, (0, 0), (w - 1, max(2, h // 24)), (92, 94, 96), -1)  # rails
    cv2.rectangle(img, (0, h - 1 - max(2, h // 24)), (w - 1, h - 1), (92, 94, 96), -1)
    x1, y1, x2, y2 = _part_rect(shown, w, h, rng)
    cv2.rectangle(img, (x1 + 3, y1 + 4), (x2 + 3, y2 + 4), (34, 33, 31), -1)  # shadow
    shade = np.linspace(0.92, 1.06, max(1, x2 - x1 + 1), dtype=np.float32)[None, :, None]
    part = np.clip(np.array(PART, dtype=np.float32) * shade, 0, 255).astype(np.uint8)
    img[y1 : y2 + 1, x1 : x2 + 1] = np.broadcast_to(part, (y2 - y1 + 1, x2 - x1 + 1, 3))
    cv2.rectangle(img, (x1, y1), (x2, y2), (198, 200, 203), 1, cv2.LINE_AA)  # bevel
    _hole(img, (x1, y1, x2, y2), shown)
    for box in shown:
        _scratch(img, box, rng)
    soft = cv2.GaussianBlur(img, (3, 3), 0)
    ok, buf = cv2.imencode(".jpg", soft, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError(f"OpenCV could not encode a {w} x {h} thumbnail")
    return bytes(buf)
