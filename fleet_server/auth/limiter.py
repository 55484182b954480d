"""Failed sign-ins counted per (user name, client address), per address and per user
name, each with a short lockout (:class:`SignInThrottle`).

Pure bookkeeping: the caller passes the time. After ``max_failures`` failures in a row
for one pair, that pair is locked out for ``lockout_s``; each further lockout within
:data:`FORGET_AFTER_S` of the last failure doubles, up to :data:`MAX_LOCKOUT_S`. A
success clears the pair. Keyed by the pair, a guesser can't lock a user out from
everywhere; a user name guessed at from many addresses is still slowed at each one.

The pair alone would let one address guess at every user, and many addresses (or a
spoofed ``X-Forwarded-For``, see :mod:`fleet_server.auth.proxies`) guess at one user
without end, so :class:`SignInThrottle` also counts failures per address (an IPv6 /64)
whatever the name, and per name from anywhere, with higher thresholds. A success clears
only its pair: an address can't reset its count by signing in to an account of its own.

The tables live in memory, per fleet-server process, and hold at most
:data:`MAX_ENTRIES` keys each (the least recently failed go first): a restart forgets
them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from fleet_server.auth.proxies import throttle_key

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


class SignInThrottle:
    """The three counts a sign-in goes through: (name, address), address, name."""

    PER_ADDRESS = ""
    """The user-name slot of an address's own count ('' is never a user name)."""
    ANY_ADDRESS = "*"
    """The address slot of a name's own count (never an address)."""

    def __init__(
        self, max_failures: int, lockout_s: float, *, per_address: int, per_user: int
    ) -> None:
        self.pairs = LoginLimiter(max_failures, lockout_s)
        self.addresses = LoginLimiter(per_address, lockout_s)
        self.users = LoginLimiter(per_user, lockout_s)

    def _keys(self, username: str, client: str) -> list[tuple[LoginLimiter, str, str]]:
        return [
            (self.pairs, username, client),
            (self.addresses, self.PER_ADDRESS, throttle_key(client)),
            (self.users, username, self.ANY_ADDRESS),
        ]

    def locked_for(self, username: str, client: str, now: float) -> float:
        """Seconds until this name may try from this address (0.0: now)."""
        return max(lim.locked_for(u, c, now) for lim, u, c in self._keys(username, client))

    def failed(self, username: str, client: str, now: float) -> float:
        """Count a failure on all three; the longest lockout it starts (0.0 for none)."""
        return max(lim.failed(u, c, now) for lim, u, c in self._keys(username, client))

    def succeeded(self, username: str, client: str) -> None:
        """Forget the pair's failures (the address's and the name's counts stay)."""
        self.pairs.succeeded(username, client)
