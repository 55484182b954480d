"""Generated test patterns: cheap, numpy only, the frame number drawn on each."""

from __future__ import annotations

from typing import Literal

import cv2
import numpy as np
import numpy.typing as npt

PatternKind = Literal["bars", "checker", "noise"]

_CELL = 32
_BAR_COLOR = (0, 200, 255)
_BACKGROUND = 40


class Pattern:
    """Renders frame ``n`` of a moving bar, a moving checkerboard, or noise."""

    def __init__(self, width: int, height: int, kind: PatternKind, seed: int = 0) -> None:
        self.width = width
        self.height = height
        self.kind = kind
        self._rng = np.random.default_rng(seed)
        self._board: npt.NDArray[np.uint8] | None = None
        if kind == "checker":
            ys, xs = np.indices((height + 2 * _CELL, width + 2 * _CELL))
            cells = ((ys // _CELL + xs // _CELL) % 2).astype(np.uint8) * 200 + 30
            self._board = np.repeat(cells[:, :, None], 3, axis=2)
        self._bar_width = max(4, width // 16)
        self._bar_step = max(1, width // 64)
        self._font_scale = max(0.4, height / 480)

    def render(self, n: int) -> npt.NDArray[np.uint8]:
        """A new HxWx3 uint8 BGR image for frame ``n`` (never a shared buffer)."""
        if self.kind == "noise":
            image = self._rng.integers(0, 256, (self.height, self.width, 3), dtype=np.uint8)
        elif self._board is not None:
            shift = n % (2 * _CELL)
            image = self._board[shift : shift + self.height, shift : shift + self.width].copy()
        else:
            image = np.full((self.height, self.width, 3), _BACKGROUND, np.uint8)
            x = (n * self._bar_step) % self.width
            image[:, x : x + self._bar_width] = _BAR_COLOR
        self._draw_number(image, n)
        return image

    def _draw_number(self, image: npt.NDArray[np.uint8], n: int) -> None:
        origin = (8, int(32 * self._font_scale) + 4)
        font = cv2.FONT_HERSHEY_SIMPLEX
        thickness = max(1, int(2 * self._font_scale))
        cv2.putText(image, str(n), origin, font, self._font_scale, (0, 0, 0), thickness + 2)
        cv2.putText(image, str(n), origin, font, self._font_scale, (255, 255, 255), thickness)
