"""A latest-only hand-over between one producer thread and its consumers."""

from __future__ import annotations

import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")


class LatestSlot(Generic[T]):
    """Holds at most one item: putting a new one replaces (and counts) an untaken one.

    A slow consumer therefore never builds a backlog; it gets the newest item.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._item: T | None = None
        self._closed = False
        self.dropped = 0
        self.taken = 0
        self.last_take_ns = 0
        """``time.perf_counter_ns()`` of the last take (0: never)."""

    def put(self, item: T) -> bool:
        """Offer ``item``; True when it replaced one nobody took (counted in ``dropped``)."""
        with self._cond:
            replaced = self._item is not None
            if replaced:
                self.dropped += 1
            self._item = item
            self._cond.notify_all()
            return replaced

    def take(self, timeout_s: float) -> T | None:
        """The item not yet taken, waiting up to ``timeout_s``; None on timeout or close."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            while self._item is None and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if self._closed:
                return None
            item, self._item = self._item, None
            self.taken += 1
            self.last_take_ns = time.perf_counter_ns()
            return item

    def close(self) -> None:
        """Wake every waiter; ``take`` returns None from now on."""
        with self._cond:
            self._closed = True
            self._item = None
            self._cond.notify_all()

    def reopen(self) -> None:
        """Accept items again after ``close`` (a restarted producer)."""
        with self._cond:
            self._closed = False
