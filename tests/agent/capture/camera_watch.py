"""What the live-camera tests (MJPEG and RTSP) share: a bounded wait that says how long
it took, and a recorder of a camera's up/down transitions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds it took until ``predicate()``; fails after ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class StateLog:
    """A camera's ``on_state`` callback that keeps every (up, reason) it is given."""

    def __init__(self) -> None:
        self.events: list[tuple[bool, str]] = []
        self._lock = threading.Lock()

    def __call__(self, name: str, up: bool, reason: str) -> None:
        with self._lock:
            self.events.append((up, reason))

    def ups(self) -> list[bool]:
        with self._lock:
            return [up for up, _ in self.events]
