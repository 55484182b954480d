"""The storage layer's errors: all under :class:`fleet_server.errors.FleetError`."""

from __future__ import annotations

from fleet_server.errors import FleetError


class StorageError(FleetError):
    """The fleet database can't be opened, migrated or written as asked.

    Attributes:
        what: the database, table or record concerned.
        reason: what is wrong.
    """

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"storage: {what}: {reason}")


class TokenRejected(StorageError):
    """An enrollment token is unknown, already used or expired.

    Attributes:
        token_hash: the hash of the token offered.
    """

    def __init__(self, token_hash: str, reason: str) -> None:
        self.token_hash = token_hash
        super().__init__(f"enrollment token {token_hash[:12]}…", reason)


class RolloutConflict(StorageError):
    """A rollout was saved from a stale copy: someone else saved it in between.

    Attributes:
        rollout_id: the rollout.
        expected: the revision the caller had loaded (0 for a new rollout).
    """

    def __init__(self, rollout_id: str, expected: int, reason: str) -> None:
        self.rollout_id = rollout_id
        self.expected = expected
        super().__init__(f"rollout '{rollout_id}'", reason)
