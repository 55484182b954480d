"""Exponential backoff between attempts to reopen a source."""

from __future__ import annotations


class Backoff:
    """Delays ``initial_s``, doubling up to ``max_s``; ``reset`` after a success."""

    def __init__(self, initial_s: float, max_s: float, factor: float = 2.0) -> None:
        if initial_s <= 0 or max_s < initial_s or factor < 1:
            raise ValueError(f"bad backoff: initial {initial_s}, max {max_s}, factor {factor}")
        self.initial_s = initial_s
        self.max_s = max_s
        self.factor = factor
        self._next = initial_s

    def next(self) -> float:
        """The delay to wait now; the following one is longer (up to ``max_s``)."""
        delay = self._next
        self._next = min(self.max_s, self._next * self.factor)
        return delay

    def reset(self) -> None:
        """Start again from ``initial_s``."""
        self._next = self.initial_s
