"""Readings into windows: the last ``window`` readings, every ``stride`` new ones."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Values = npt.NDArray[np.float32]


@dataclass(frozen=True)
class SensorWindow:
    """A window of readings, ready for a tabular or time-series model.

    Attributes:
        sensor: the sensor's name.
        seq: per-sensor number of the window.
        values: float32, read-only; shape (1, window, n_fields), or (1, n_fields) for a
            window of 1; oldest reading first.
        t_capture_ns: ``time.perf_counter_ns()`` when the newest reading arrived.
        wall_time: ``time.time()`` at the same moment.
    """

    sensor: str
    seq: int
    values: Values
    t_capture_ns: int
    wall_time: float


class Windower:
    """Collects readings of ``n_fields`` values; emits a window when it is full and then
    every ``stride`` readings. Not thread-safe: one producer."""

    def __init__(self, n_fields: int, window: int, stride: int) -> None:
        if n_fields < 1 or window < 1 or stride < 1:
            raise ValueError(f"bad window: fields {n_fields}, window {window}, stride {stride}")
        self.n_fields = n_fields
        self.window = window
        self.stride = stride
        self._buffer: deque[Values] = deque(maxlen=window)
        self._since_emit = 0
        self._emitted = False

    def push(self, values: npt.NDArray[np.floating]) -> Values | None:
        """Add one reading; the window's tensor when one is due, else None."""
        reading = np.asarray(values, np.float32).reshape(self.n_fields)
        self._buffer.append(reading)
        self._since_emit += 1
        if len(self._buffer) < self.window:
            return None
        if self._emitted and self._since_emit < self.stride:
            return None
        self._emitted = True
        self._since_emit = 0
        stacked = np.stack(self._buffer)
        out = stacked.reshape(1, self.n_fields) if self.window == 1 else stacked[None]
        out.flags.writeable = False
        return out

    def reset(self) -> None:
        """Forget buffered readings (after a gap: a reconnect, a replay starting over)."""
        self._buffer.clear()
        self._since_emit = 0
        self._emitted = False
