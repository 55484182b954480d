"""The errors of users, passwords and sessions: all under :class:`AuthError`, itself a
:class:`fleet_server.errors.FleetError` (``fleetctl`` prints one line and exits 2; the
HTTP layer picks the status from the class)."""

from __future__ import annotations

from fleet_server.errors import FleetError


class AuthError(FleetError):
    """A user, a password or a sign-in can't be accepted as asked.

    Attributes:
        what: the user, field or credential concerned.
        reason: what is wrong.
    """

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")


class BadUsername(AuthError):
    """A user name that does not follow the rules (1-64 of a-z 0-9 . _ -).

    Attributes:
        username: the name offered.
    """

    def __init__(self, username: str, reason: str) -> None:
        self.username = username
        super().__init__(f"user name {username!r}", reason)


class WeakPassword(AuthError):
    """A new password is refused (too short, too long, or not text).

    Attributes:
        username: whose password it was to be.
    """

    def __init__(self, username: str, reason: str) -> None:
        self.username = username
        super().__init__(f"password of '{username}'", reason)


class UnknownRole(AuthError):
    """A role name that is not one of the roles.

    Attributes:
        role: the name offered.
    """

    def __init__(self, role: str, known: tuple[str, ...]) -> None:
        self.role = role
        super().__init__(f"role {role!r}", f"not a role (one of {', '.join(known)})")


class UnknownUser(AuthError):
    """No user of that name.

    Attributes:
        username: the name looked up.
    """

    def __init__(self, username: str) -> None:
        self.username = username
        super().__init__(f"user '{username}'", "no such user")


class UserExists(AuthError):
    """A user of that name exists already.

    Attributes:
        username: the name.
    """

    def __init__(self, username: str) -> None:
        self.username = username
        super().__init__(f"user '{username}'", "exists already (fleetctl users passwd to reset)")


class LoginRefused(AuthError):
    """A sign-in failed. On purpose it does not say whether the name or the password
    was wrong, or whether the account is disabled."""

    def __init__(self) -> None:
        super().__init__("login", "wrong user name or password")


class LoginLocked(AuthError):
    """Too many failed sign-ins for this user name from this address; wait.

    Attributes:
        retry_after_s: seconds until sign-ins are taken again.
    """

    def __init__(self, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(
            "login", f"too many failed attempts; try again in {max(1, round(retry_after_s))} s"
        )


class AuthBusy(AuthError):
    """Too many password checks at once: the server waited and gave up (retry)."""

    def __init__(self, waited_s: float) -> None:
        self.waited_s = waited_s
        super().__init__("login", f"the server is busy checking passwords (waited {waited_s} s)")
