"""The rollout controller's error: a spec, a plan or a stored state that can't be used."""

from __future__ import annotations

from fleet_server.errors import FleetError


class RolloutError(FleetError):
    """A rollout spec, plan or stored state is not valid.

    Attributes:
        field: dotted name of the offending field ("" for the whole thing).
        reason: what is wrong with it.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        at = f"{field}: " if field else ""
        super().__init__(f"rollout: {at}{reason}")
