"""Failed sign-ins counted per (user name, client address), with a short lockout.

Pure bookkeeping: the caller passes the time. After ``max_failures`` failures in a row
for one pair, that pair is locked out for ``lockout_s``; each further lockout within
:data:`FORGET_AFTER_S` of the last failure doubles, up to :data:`MAX_LOCKOUT_S`. A
success clears the pair. Keyed by the pair, a guesser can't lock a user out from
everywhere; a user name guessed at from many addresses is still slowed at each one.

The table lives in memory, per fleet-server process, and holds at most
:data:`MAX_ENTRIES` pairs (the least recently failed go first): a restart forgets it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

MAX_ENTRIES = 10_000
MAX_LOCKOUT_S = 900.0
FORGET_AFTER_S = 3600.0


@dataclass
class _Entry:
    failures: int = 0
    strikes: int = 0
    locked_until: float = 0.0
    last: float = 0.0


class LoginLimiter:
    """Failure counts and lockouts (thread-safe)."""

    def __init__(
        self, max_failures: int, lockout_s: float, *, max_entries: int = MAX_ENTRIES
    ) -> None:
        if max_failures < 1 or lockout_s <= 0 or max_entries < 1:
            raise ValueError("max_failures, lockout_s and max_entries must be positive")
        self.max_failures = max_failures
        self.lockout_s = lockout_s
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def locked_for(self, username: str, client: str, now: float) -> float:
        """Seconds the pair stays locked out (0.0 when it may try)."""
        with self._lock:
            entry = self._entries.get((username, client))
            if entry is None:
                return 0.0
            return max(0.0, entry.locked_until - now)

    def failed(self, username: str, client: str, now: float) -> float:
        """Count a failure; the lockout it starts (seconds; 0.0 for none)."""
        key = (username, client)
        with self._lock:
            entry = self._entries.pop(key, None) or _Entry()
            if now - entry.last > FORGET_AFTER_S:
                entry = _Entry()
            entry.failures += 1
            entry.last = now
            lockout = 0.0
            if entry.failures >= self.max_failures:
                lockout = min(self.lockout_s * 2**entry.strikes, MAX_LOCKOUT_S)
                entry.strikes += 1
                entry.failures = 0
                entry.locked_until = now + lockout
            self._entries[key] = entry
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return lockout

    def succeeded(self, username: str, client: str) -> None:
        """Forget the pair's failures."""
        with self._lock:
            self._entries.pop((username, client), None)
