"""Cheap statistics of an input frame: brightness, contrast and sharpness of its luma.

Measured on a gray downscale of at most :data:`SIDE` x :data:`SIDE` pixels: the mean
(brightness, 0..255), the standard deviation (contrast) and ``log10`` of the variance of
the Laplacian (sharpness, focus). The downscale is a nearest-neighbour step to at most
:data:`COARSE_SIDE` pixels on the long side, then ``INTER_AREA`` to :data:`SIDE`: on a
1080p frame 0.17 ms instead of 1.6 ms for ``INTER_AREA`` alone (measured on the
development machine, one thread), and on natural images the three figures agree with the
one-step downscale to within 1 % (the nearest step keeps more of pure pixel noise). Every
device and version measures the same way, which is what a drift comparison needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SIDE = 64
"""The long side of the downscale the statistics are measured on."""
COARSE_SIDE = 256
"""The long side of the nearest-neighbour step before the area downscale."""


@dataclass(frozen=True)
class InputStats:
    """Luma statistics of one frame."""

    brightness: float
    contrast: float
    sharpness: float


class FrameError(ValueError):
    """The frame is not an 8-bit image (HxW or HxWx3/4)."""


def input_stats(frame: Any) -> InputStats:
    """Brightness, contrast and sharpness of ``frame`` (HxWx3 BGR, HxWx4 BGRA, HxWx1 or
    HxW gray, uint8).

    Raises:
        FrameError: not a uint8 numpy image of one of those shapes, or empty.
    """
    import cv2  # noqa: PLC0415 - only the writer thread needs OpenCV
    import numpy as np  # noqa: PLC0415

    if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8:
        what = getattr(frame, "dtype", type(frame).__name__)
        raise FrameError(f"frame must be a uint8 numpy array, not {what}")
    if frame.ndim == 3 and frame.shape[2] == 1:
        frame = frame[:, :, 0]
    if not (frame.ndim == 2 or (frame.ndim == 3 and frame.shape[2] in (3, 4))):
        raise FrameError(f"frame must be HxW or HxWx3 (BGR), not shape {frame.shape}")
    h, w = int(frame.shape[0]), int(frame.shape[1])
    if h == 0 or w == 0:
        raise FrameError(f"frame is empty (shape {frame.shape})")
    img = frame
    step = -(-max(h, w) // COARSE_SIDE)  # ceil
    if step > 1:
        size = (max(1, w // step), max(1, h // step))
        img = cv2.resize(img, size, interpolation=cv2.INTER_NEAREST)
    ch, cw = int(img.shape[0]), int(img.shape[1])
    if max(ch, cw) > SIDE:
        scale = SIDE / max(ch, cw)
        size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
        img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
    if img.ndim == 3:
        code = cv2.COLOR_BGR2GRAY if img.shape[2] == 3 else cv2.COLOR_BGRA2GRAY
        img = cv2.cvtColor(img, code)
    mean, std = cv2.meanStdDev(img)
    lap = cv2.Laplacian(img, cv2.CV_32F)
    var = float(lap.var())
    return InputStats(
        brightness=float(mean[0, 0]),
        contrast=float(std[0, 0]),
        sharpness=math.log10(var + 1e-9),
    )
