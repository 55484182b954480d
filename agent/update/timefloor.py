"""A persisted lower bound on the current time, so that a clock set back (to 1970, or by
an hour) can't make expired metadata look valid again.

The floor is the latest of :data:`EPOCH` and the wall-clock time of every successful
refresh, kept in a small JSON file written durably. The effective time is
``max(clock, floor)``. A clock far ahead is not believed into the floor: the floor only
moves at a refresh that succeeded, and one can't succeed while the metadata looks
expired. TUF metadata carries no signing time, so the only signed hint there is would
be an expiry, which bounds time from above, not below.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from agent.kernel.durable import write_durable

log = logging.getLogger(__name__)

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
"""No time before this is believed: it predates this code (like systemd's TIME_EPOCH)."""

FLOOR_FILE = "time-floor.json"
_MAX_FILE = 4096


def utc_now() -> datetime:
    """The system clock, in UTC."""
    return datetime.now(timezone.utc)


class TimeFloor:
    """The persisted time floor in ``path`` and the effective time it gives.

    Args:
        path: the JSON file (conventionally ``<trust_dir>/time-floor.json``).
        clock: returns the current time, timezone-aware; tests inject a fake one.
        minimum: the floor before any refresh succeeded.
    """

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], datetime] = utc_now,
        minimum: datetime = EPOCH,
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._minimum = minimum
        self._lock = threading.Lock()
        self.unreadable = 0
        """How often the floor file could not be read (the minimum was used instead)."""

    def clock(self) -> datetime:
        """The clock's reading, in UTC."""
        return self._clock().astimezone(timezone.utc)

    def floor(self) -> datetime:
        """The persisted floor, or the minimum when none is (or it can't be read)."""
        try:
            raw = self.path.read_bytes()[:_MAX_FILE]
        except FileNotFoundError:
            return self._minimum
        except OSError as exc:
            return self._unreadable(f"cannot read: {exc.strerror or exc}")
        try:
            data = json.loads(raw)
            value = datetime.fromisoformat(data["floor"])
        except (ValueError, KeyError, TypeError) as exc:
            return self._unreadable(f"not a time floor: {exc}")
        if value.tzinfo is None:
            return self._unreadable("floor has no timezone")
        return max(value.astimezone(timezone.utc), self._minimum)

    def now(self) -> datetime:
        """The effective time: the later of the clock and the floor."""
        return max(self.clock(), self.floor())

    def clock_behind(self) -> bool:
        """Whether the clock reads earlier than the floor (it was set back)."""
        return self.clock() < self.floor()

    def raise_to(self, when: datetime) -> datetime:
        """Move the floor up to ``when`` (never down) and persist it; return the floor.

        Raises:
            OSError: the file can't be written.
        """
        when = when.astimezone(timezone.utc)
        with self._lock:
            current = self.floor()
            if when <= current and self.path.exists():
                return current
            value = max(when, current)
            text = json.dumps({"floor": value.isoformat()}) + "\n"
            write_durable(self.path, text.encode())
            return value

    def _unreadable(self, why: str) -> datetime:
        # A broken floor must not lock the device out: fall back to the minimum, loudly.
        self.unreadable += 1
        log.warning("time floor %s %s; using %s", self.path, why, self._minimum.isoformat())
        return self._minimum
