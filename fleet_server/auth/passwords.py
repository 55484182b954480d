"""User names, the password rule, and argon2id hashing (``argon2-cffi``).

Hashes use argon2-cffi's default parameters (RFC 9106's low-memory profile: argon2id,
t=3, m=64 MiB, p=4). A hash made with other parameters still verifies, and
:meth:`PasswordHasher.check` hands back a new hash to store: users are moved to the
current parameters as they sign in. Each check holds 64 MiB for about 0.1 s, so the
checks running at once are bounded (:data:`MAX_CONCURRENT_CHECKS`).
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass

import argon2
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from fleet_server.auth.errors import AuthBusy, BadUsername, WeakPassword

MIN_PASSWORD = 12
MAX_PASSWORD = 1024
"""Characters; longer inputs are refused before hashing (no work for a huge body)."""
MAX_CONCURRENT_CHECKS = 4
CHECK_WAIT_S = 10.0
log = logging.getLogger(__name__)

USERNAME = re.compile(r"^[a-z0-9._-]{1,64}$")


def check_username(name: str) -> str:
    """``name`` if it is a valid user name: 1-64 of a-z 0-9 . _ -, not only dots.

    Raises:
        BadUsername: it is not.
    """
    if not USERNAME.match(name):
        raise BadUsername(name, "use 1-64 of a-z 0-9 . _ - (lower case)")
    if set(name) == {"."}:
        raise BadUsername(name, "a name of only dots is not allowed")
    return name


def check_new_password(username: str, password: str) -> str:
    """``password`` if it may be set: at least :data:`MIN_PASSWORD` characters, at most
    :data:`MAX_PASSWORD`, not the user name, no control characters.

    Raises:
        WeakPassword: naming the rule it breaks.
    """
    if len(password) < MIN_PASSWORD:
        raise WeakPassword(username, f"at least {MIN_PASSWORD} characters, got {len(password)}")
    if len(password) > MAX_PASSWORD:
        raise WeakPassword(username, f"at most {MAX_PASSWORD} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in password):
        raise WeakPassword(username, "control characters (a line break?) are not allowed")
    if password.lower() == username.lower():
        raise WeakPassword(username, "it is the user name")
    return password


@dataclass(frozen=True)
class Checked:
    """The outcome of a password check.

    Attributes:
        ok: the password matches.
        new_hash: when it matches and the stored hash used old parameters: its
            replacement, to be stored.
    """

    ok: bool
    new_hash: str | None = None


class PasswordHasher:
    """argon2id hashing with a bound on concurrent checks (thread-safe)."""

    def __init__(
        self,
        hasher: argon2.PasswordHasher | None = None,
        *,
        max_concurrent: int = MAX_CONCURRENT_CHECKS,
        wait_s: float = CHECK_WAIT_S,
    ) -> None:
        self._hasher = hasher or argon2.PasswordHasher()
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._wait_s = wait_s
        self._dummy: str | None = None

    def hash(self, password: str) -> str:
        """A new argon2id hash of ``password`` (salted; PHC string format).

        Raises:
            AuthBusy: no hashing slot within the wait.
        """
        with self._slot():
            return self._hasher.hash(password)

    def check(self, stored: str | None, password: str) -> Checked:
        """Whether ``password`` matches the ``stored`` hash. With no hash (no such user)
        a dummy hash is checked, so that the answer takes as long either way.

        Raises:
            AuthBusy: no hashing slot within the wait.
        """
        if len(password) > MAX_PASSWORD:
            return Checked(ok=False)
        with self._slot():
            if stored is None:
                self._dummy = self._dummy or self._hasher.hash("no such user: dummy password")
                self._verify(self._dummy, password)
                return Checked(ok=False)
            if not self._verify(stored, password):
                return Checked(ok=False)
            if self._hasher.check_needs_rehash(stored):
                return Checked(ok=True, new_hash=self._hasher.hash(password))
            return Checked(ok=True)

    def _verify(self, stored: str, password: str) -> bool:
        try:
            return self._hasher.verify(stored, password)
        except VerifyMismatchError:
            return False
        except (InvalidHashError, VerificationError) as exc:
            log.warning("a stored password hash can't be checked: %s", exc)
            return False

    def _slot(self) -> _Slot:
        return _Slot(self._slots, self._wait_s)


class _Slot:
    def __init__(self, sem: threading.BoundedSemaphore, wait_s: float) -> None:
        self._sem = sem
        self._wait_s = wait_s

    def __enter__(self) -> None:
        if not self._sem.acquire(timeout=self._wait_s):
            raise AuthBusy(self._wait_s)

    def __exit__(self, *exc: object) -> None:
        self._sem.release()
