"""What every sensor source shares: windowing, the latest-only hand-over, counters."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod

import numpy as np
import numpy.typing as npt

from agent.capture.latest import LatestSlot
from agent.sensors.config import SensorConfig
from agent.sensors.window import SensorWindow, Windower

logger = logging.getLogger(__name__)

_LOG_FIRST_BAD = 20  # bad readings logged one by one; after that every 100th
_LOG_EVERY_BAD = 100

SensorStats = dict[str, int | bool | str]


class SensorSource(ABC):
    """A sensor: readings in, windows out; consumers take the newest window."""

    def __init__(self, config: SensorConfig) -> None:
        self.config = config
        self._slot: LatestSlot[SensorWindow] = LatestSlot()
        self._windower = Windower(len(config.fields), config.window, config.stride)
        self._lock = threading.Lock()
        self._readings = 0
        self._bad = 0
        self._windows = 0
        self._errors = 0
        self._up = False
        self._last_error = ""

    @property
    def name(self) -> str:
        """The sensor's configured name."""
        return self.config.name

    @property
    def up(self) -> bool:
        """True while readings can arrive (connected and subscribed, or replaying)."""
        return self._up

    @abstractmethod
    def start(self) -> None:
        """Start delivering readings in the background."""

    @abstractmethod
    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop, waiting up to ``timeout_s`` for the background thread."""

    def latest(self, timeout_s: float) -> SensorWindow | None:
        """The newest window not yet taken, waiting up to ``timeout_s``; None on timeout
        or stop."""
        return self._slot.take(timeout_s)

    def stats(self) -> SensorStats:
        """Counters: readings, bad_readings, windows, dropped, errors, up, last_error."""
        with self._lock:
            return {
                "readings": self._readings,
                "bad_readings": self._bad,
                "windows": self._windows,
                "dropped": self._slot.dropped,
                "errors": self._errors,
                "up": self._up,
                "last_error": self._last_error,
            }

    def _deliver(self, values: npt.NDArray[np.floating], t_ns: int, wall: float) -> None:
        with self._lock:
            self._readings += 1
            window = self._windower.push(values)
            if window is None:
                return
            seq = self._windows
            self._windows += 1
        self._slot.put(SensorWindow(self.name, seq, window, t_ns, wall))

    def _reject(self, where: str, reason: str) -> None:
        """Count (and log, rate-limited) a reading that was skipped."""
        with self._lock:
            self._bad += 1
            bad = self._bad
        if bad <= _LOG_FIRST_BAD or bad % _LOG_EVERY_BAD == 0:
            logger.warning(
                "sensor %s: skipped %s: %s (%d skipped so far)", self.name, where, reason, bad
            )

    def _reset_window(self) -> None:
        with self._lock:
            self._windower.reset()

    def _set_up(self, up: bool, reason: str, *, failure: bool = True) -> None:
        """Record the state; going down with ``failure`` also sets ``last_error``."""
        with self._lock:
            changed = self._up != up
            self._up = up
            if not up and failure:
                self._last_error = reason
        if changed:
            log = logger.info if up else logger.warning
            log("sensor %s: %s (%s)", self.name, "up" if up else "down", reason)

    def _count_error(self, reason: str) -> None:
        with self._lock:
            self._errors += 1
            self._last_error = reason
