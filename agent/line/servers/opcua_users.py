"""Who may use the agent's OPC UA server: the users file, the password check, and the
rule that anonymous clients never write or call.

The users come from one secret (``[opcua_server] users_env``, read with
:func:`agent.kernel.secrets.read_secret`): one user per line, ``name:argon2-hash``
(preferred: ``python3 -c "from argon2 import PasswordHasher; print(PasswordHasher().hash('...'))"``)
or ``name:password``; blank lines and lines starting with ``#`` are skipped.

asyncua asks for a user while it activates a session, synchronously on the server's
event loop, so a check blocks the loop for argon2's ~0.1 s. Three things bound that:
a user who signed in once is recognised by a keyed digest of the password (no argon2
again), a password longer than :data:`MAX_PASSWORD` is refused unhashed, and failed
checks are limited to :data:`FAILURE_BUDGET` per :data:`FAILURE_WINDOW_S` (beyond that a
user not recognised is refused without hashing, counted as ``login_throttled``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import argon2
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from asyncua import ua
from asyncua.crypto.permission_rules import USER_TYPES, SimpleRoleRuleset, User, UserRole
from asyncua.ua.object_ids import ObjectIds

log = logging.getLogger(__name__)

USERNAME = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")
MAX_PASSWORD = 1024
"""Characters; a longer password is refused before any hashing."""
MAX_USERS = 1000
FAILURE_BUDGET = 10
FAILURE_WINDOW_S = 60.0


class UsersFileError(ValueError):
    """The users secret can't be read as users; the message names the line."""


@dataclass(frozen=True)
class Credential:
    """One user's stored password: an argon2 hash (``hashed``) or the password itself."""

    secret: str
    hashed: bool


def parse_users(text: str) -> dict[str, Credential]:
    """The users of a users secret, by name.

    Raises:
        UsersFileError: a line is not ``name:secret``, a name is invalid or repeated,
            or there is no user at all.
    """
    users: dict[str, Credential] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, secret = line.partition(":")
        if not sep or not secret:
            raise UsersFileError(f"line {number}: not `name:argon2-hash` or `name:password`")
        if not USERNAME.match(name):
            raise UsersFileError(f"line {number}: user name must be 1-64 of A-Z a-z 0-9 . _ @ -")
        if name in users:
            raise UsersFileError(f"line {number}: user {name!r} is given twice")
        if len(users) >= MAX_USERS:
            raise UsersFileError(f"more than {MAX_USERS} users")
        users[name] = Credential(secret, hashed=secret.startswith("$argon2"))
    if not users:
        raise UsersFileError("no user in it")
    return users


@dataclass
class LoginCounters:
    ok: int = 0
    failed: int = 0
    throttled: int = 0


@dataclass
class PasswordCheck:
    """Checks user names and passwords against the users file (thread-safe).

    Attributes:
        users: by name.
        counters: sign-ins that passed, failed and were refused unchecked.
    """

    users: dict[str, Credential]
    clock: Callable[[], float] = time.monotonic
    counters: LoginCounters = field(default_factory=LoginCounters)
    _hasher: argon2.PasswordHasher = field(default_factory=argon2.PasswordHasher)
    _key: bytes = field(default_factory=lambda: os.urandom(32))
    _known: dict[str, bytes] = field(default_factory=dict)
    _failures: deque[float] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, username: str, password: str) -> bool:
        """Whether ``password`` is ``username``'s."""
        tag = hmac.new(self._key, password.encode("utf-8", "replace"), hashlib.sha256).digest()
        with self._lock:
            known = self._known.get(username)
            if known is not None and hmac.compare_digest(known, tag):
                self.counters.ok += 1
                return True
            now = self.clock()
            while self._failures and now - self._failures[0] > FAILURE_WINDOW_S:
                self._failures.popleft()
            if len(self._failures) >= FAILURE_BUDGET:
                self.counters.throttled += 1
                log.warning("OPC UA sign-in of %r refused unchecked: too many failures", username)
                return False
        ok = len(password) <= MAX_PASSWORD and self._verify(username, password)
        with self._lock:
            if ok:
                self._known[username] = tag
                self.counters.ok += 1
            else:
                self._failures.append(self.clock())
                self.counters.failed += 1
        if not ok:
            log.warning("OPC UA sign-in of %r failed", username)
        return ok

    def _verify(self, username: str, password: str) -> bool:
        cred = self.users.get(username)
        if cred is None:
            return False
        if not cred.hashed:
            return hmac.compare_digest(cred.secret.encode(), password.encode("utf-8", "replace"))
        try:
            return self._hasher.verify(cred.secret, password)
        except VerifyMismatchError:
            return False
        except (InvalidHashError, VerificationError) as exc:
            log.warning("the OPC UA user %r's hash can't be checked: %s", username, exc)
            return False


class Users:
    """asyncua's user manager for this server: users by :class:`PasswordCheck`,
    anonymous clients (read-only) when ``allow_anonymous``, and nobody on a channel
    without security when ``secure_channel_required``.

    That last rule closes a gap of asyncua's: it always accepts a channel without
    security (clients discover endpoints over it) and applies no permission rule on it,
    so a session activated there could call methods whatever endpoints are offered. The
    peer's certificate, which asyncua hands the user manager, is None exactly on such a
    channel.
    """

    def __init__(
        self, check: PasswordCheck | None, *, allow_anonymous: bool, secure_channel_required: bool
    ) -> None:
        self.check = check
        self.allow_anonymous = allow_anonymous
        self.secure_channel_required = secure_channel_required
        self.refused_insecure = 0

    def get_user(
        self,
        iserver: Any,
        username: str | None = None,
        password: str | None = None,
        certificate: Any = None,
    ) -> User | None:
        if self.secure_channel_required and not certificate:
            self.refused_insecure += 1
            log.warning("OPC UA session refused: a channel without security")
            return None
        if username is None:
            return User(role=UserRole.Anonymous) if self.allow_anonymous else None
        if self.check is None or not self.check.check(username, password or ""):
            return None
        return User(role=UserRole.User, name=username)


_ALLOWED = frozenset(ua.NodeId(ua.Int32(t)) for t in USER_TYPES)
_DENIED_ANONYMOUS = frozenset(
    ua.NodeId(ua.Int32(t))
    for t in (
        ObjectIds.WriteRequest_Encoding_DefaultBinary,
        ObjectIds.CallRequest_Encoding_DefaultBinary,
        ObjectIds.HistoryUpdateRequest_Encoding_DefaultBinary,
    )
)


class Rules(SimpleRoleRuleset):
    """asyncua's permission rules for this server, checked on every request of an
    activated session: users may do what a client does (read, browse, subscribe, call;
    a write is refused by the nodes' access levels); anonymous clients may read, browse
    and subscribe, never write or call; nobody changes the address space (no node
    management requests: no Admin role is ever given)."""

    def check_validity(self, user: User, action_type_id: ua.NodeId, body: Any) -> bool:
        if action_type_id not in _ALLOWED:
            return False
        return user.role != UserRole.Anonymous or action_type_id not in _DENIED_ANONYMOUS
