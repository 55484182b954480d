"""The bounded hand-off between the threads that append and the writer thread.

A deque (appends and pops are atomic in CPython) with a bound checked before each
append, and an event that wakes the writer only when it has something to do: the first
record after the queue ran empty (to start the flush clock), a full batch, or a command.
An append costs well under a microsecond and never takes a lock on the common path.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")

_SPACE_POLL_S = 0.000_2


class Handoff(Generic[T]):
    """A FIFO of at most ``bound`` items (commands may exceed it) for one consumer."""

    def __init__(self, bound: int, batch_size: int) -> None:
        self._items: deque[T] = deque()
        self._bound = bound
        self._batch = batch_size
        self._ready = threading.Event()
        self.urgent = False  # set by put_urgent, reset by the consumer

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T, timeout_s: float) -> bool:
        """Append ``item``; when full, wait up to ``timeout_s`` for room. False: no room."""
        items = self._items
        if len(items) >= self._bound and not self._wait_for_room(timeout_s):
            return False
        items.append(item)
        n = len(items)
        if (n == 1 or n >= self._batch) and not self._ready.is_set():
            self._ready.set()
        return True

    def put_urgent(self, item: T) -> None:
        """Append ``item`` past the bound and wake the consumer now (for commands)."""
        self._items.append(item)
        self.urgent = True
        self._ready.set()

    def _wait_for_room(self, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while len(self._items) >= self._bound:
            if time.monotonic() >= end:
                return False
            time.sleep(_SPACE_POLL_S)
        return True

    # The consumer's side.

    def take_urgent(self) -> bool:
        """Whether a command was queued since the last call (read before ``len``)."""
        urgent = self.urgent
        self.urgent = False
        return urgent

    def pop(self) -> T:
        """The oldest item (the caller knows there is one)."""
        return self._items.popleft()

    def clear_wakeup(self) -> None:
        self._ready.clear()

    def wait(self, timeout_s: float) -> None:
        """Sleep until woken or ``timeout_s`` passed."""
        self._ready.wait(max(0.0, timeout_s))
