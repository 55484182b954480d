"""The error a remote action request can't be made with."""

from __future__ import annotations

from fleet_server.errors import FleetError


class ActionError(FleetError):
    """A request can't be made: a bad action, parameter or expiry (``status`` 400), a
    device that is unknown (404) or revoked (409), or it could not be sent (503).

    Attributes:
        status: the HTTP status it answers.
        reason: what is wrong.
    """

    def __init__(self, status: int, reason: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(reason)
