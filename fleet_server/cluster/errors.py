"""The cluster's errors."""

from __future__ import annotations

from fleet_server.errors import FleetError

__all__ = ["ClusterError", "NotLeader"]


class NotLeader(FleetError):
    """This replica does not hold the lead (or its lease ran out): it must not act.

    Attributes:
        replica_id: this replica.
        reason: why ("not the leader", "lease expired 2.1 s ago", "fenced: epoch 7 < 8").
    """

    def __init__(self, replica_id: str, reason: str) -> None:
        self.replica_id = replica_id
        self.reason = reason
        super().__init__(f"replica {replica_id}: {reason}")


class ClusterError(FleetError):
    """This replica can't join the cluster.

    Attributes:
        database: the database (password hidden).
        reason: why.
    """

    def __init__(self, database: str, reason: str) -> None:
        self.database = database
        self.reason = reason
        super().__init__(f"cluster on {database}: {reason}")
