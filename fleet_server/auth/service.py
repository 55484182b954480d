"""Sign-in, session lookup and sign-out over the fleet database: what the HTTP layer
calls. No HTTP here: the caller passes the client's address and gets errors back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine

from fleet_server.auth.config import AuthSection
from fleet_server.auth.errors import AuthError, LoginLocked, LoginRefused
from fleet_server.auth.limiter import SignInThrottle
from fleet_server.auth.passwords import PasswordHasher
from fleet_server.auth.sessions import (
    Session,
    end_session,
    find_session,
    purge_expired,
    start_session,
)
from fleet_server.auth.users import get_user, replace_hash

log = logging.getLogger(__name__)


def _storable(text: str) -> bool:
    """No NUL and valid Unicode: what a name can be looked up by and a password hashed."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class SignedIn:
    """A new session: its id (for the cookie, shown once) and the session."""

    session_id: str = field(repr=False)
    session: Session


class AuthService:
    """Sign-in with failure limits, sessions, sign-out (thread-safe)."""

    def __init__(
        self,
        engine: Engine,
        settings: AuthSection,
        *,
        hasher: PasswordHasher | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.hasher = hasher or PasswordHasher()
        self.limiter = SignInThrottle(
            settings.login_max_failures,
            settings.login_lockout_s,
            per_address=settings.login_max_failures_per_address,
            per_user=settings.login_max_failures_per_user,
        )
        self.clock = clock

    def login(self, username: str, password: str, client: str) -> SignedIn:
        """Check the password of ``username`` and start a session.

        Raises:
            LoginLocked: too many failures for this name from ``client``, from ``client``
                or for this name; nothing checked.
            LoginRefused: unknown or disabled user, or wrong password (not told apart).
            AuthBusy: too many password checks at once.
            StorageError: the database can't be read or written.
        """
        now = self.clock()
        locked = self.limiter.locked_for(username, client, now)
        if locked > 0:
            raise LoginLocked(locked)
        if not (_storable(username) and _storable(password)):
            self.limiter.failed(username, client, now)
            log.warning("failed sign-in from %s: NUL or a lone surrogate in the name or password",
                        client)  # fmt: skip
            raise LoginRefused
        try:
            user = get_user(self.engine, username)
        except AuthError as exc:
            log.warning("sign-in of %r refused: %s", username, exc)
            user = None
        checked = self.hasher.check(user.password_hash if user is not None else None, password)
        if user is None or user.disabled or not checked.ok:
            lockout = self.limiter.failed(username, client, self.clock())
            log.warning(
                "failed sign-in as %r from %s%s",
                username[:64],
                client,
                f"; locked out for {lockout:.0f} s" if lockout else "",
            )
            raise LoginRefused
        self.limiter.succeeded(username, client)
        if checked.new_hash is not None:
            replace_hash(self.engine, user.username, user.password_hash, checked.new_hash)
            log.info("password hash of %r moved to the current parameters", user.username)
        purge_expired(self.engine, self.settings.session_idle_s, now=now)
        session_id, session = start_session(
            self.engine, user.username, user.role, max_s=self.settings.session_max_s, now=now
        )
        log.info("%r signed in from %s as %s", user.username, client, user.role)
        return SignedIn(session_id, session)

    def session(self, session_id: str) -> Session | None:
        """The live session of ``session_id`` (None: unknown or expired)."""
        return find_session(
            self.engine, session_id, idle_s=self.settings.session_idle_s, now=self.clock()
        )

    def logout(self, session_id: str) -> bool:
        """End the session; whether there was one."""
        return end_session(self.engine, session_id)
