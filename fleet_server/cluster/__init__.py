"""Replicas of the fleet server on one database (docs/scaling-replicas.md, ADR 0015).

Every replica serves the API, ingests and answers bundle-chunk requests; exactly one, the
leader, runs the jobs that must not run twice: the rollout reconciler, the drift job and
retention. :class:`Leadership` is what those jobs ask before they act, and what a
rollout save checks in its transaction (the fencing epoch), so a replica that lost the
lead can't publish a stale directive.

:func:`open_cluster` picks the implementation from the database: PostgreSQL gets the
advisory-lock leader (:mod:`fleet_server.cluster.leader`); SQLite is one replica, always
the leader (epoch 1), and a second replica on the same file is refused at start (an
exclusive ``flock`` on ``<database>.serve.lock``, held while the server runs). Both
report themselves every ``[cluster] report_s`` (:mod:`fleet_server.cluster.registry`).
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.engine import Engine

from fleet_server.cluster.errors import ClusterError, NotLeader
from fleet_server.cluster.leader import LeaderTimings, PgLeader
from fleet_server.cluster.registry import ReplicaRegistry
from fleet_server.config import FleetServerConfig
from fleet_server.health import HealthRegistry, PartHealth

__all__ = [
    "CLUSTER_HEALTH",
    "Cluster",
    "ClusterError",
    "Leadership",
    "NotLeader",
    "PgCluster",
    "SingleReplica",
    "SqliteCluster",
    "leader_detail",
    "open_cluster",
    "replica_name",
]

CLUSTER_HEALTH = "cluster"
LOCK_SUFFIX = ".serve.lock"


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

    def attach(self, health: HealthRegistry) -> None:
        """Report the running server's health (ingest rates) and register a probe."""
        ...

    def stop(self) -> None: ...


def replica_name(config: FleetServerConfig) -> str:
    """``[cluster] replica_id``, else ``<host>-<pid>``."""
    return config.cluster.replica_id or f"{socket.gethostname()}-{os.getpid()}"


def leader_detail(leader: Leadership) -> dict[str, Any]:
    """The leadership's figures for a health probe: its ``detail()`` when it has one."""
    fn = getattr(leader, "detail", None)
    if callable(fn):
        return dict(fn())
    try:
        epoch: int | None = leader.check()
    except NotLeader:
        epoch = None
    return {"replica_id": leader.replica_id, "leader": epoch is not None, "epoch": epoch}


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

    def attach(self, health: HealthRegistry) -> None:
        """Nothing to report."""

    def stop(self) -> None:
        """Nothing to stop."""


class _Reported:
    """A leadership with its registry: start, attach, stop, and the cluster probe."""

    leadership: Leadership

    def __init__(self, engine: Engine, config: FleetServerConfig, leadership: Leadership) -> None:
        self.leadership = leadership
        self.registry = ReplicaRegistry(
            engine, leadership.replica_id, leadership, config.cluster.report_s
        )
        self._health: HealthRegistry | None = None

    def attach(self, health: HealthRegistry) -> None:
        self.registry.attach(health)
        health.register(CLUSTER_HEALTH, self.health)
        self._health = health

    def health(self) -> PartHealth:
        """Ok while the elector (if any) and the reporter threads run."""
        detail = {**leader_detail(self.leadership), **self.registry.detail()}
        ok = bool(detail["reporter_alive"]) and detail.get("elector_alive", True) is not False
        return PartHealth(ok, detail)

    def _unattach(self) -> None:
        if self._health is not None:
            self._health.unregister(CLUSTER_HEALTH)
            self._health = None


class SqliteCluster(_Reported):
    """The single replica on an SQLite file; a second one is refused (see the module)."""

    def __init__(self, engine: Engine, config: FleetServerConfig, database: Path) -> None:
        super().__init__(engine, config, SingleReplica(replica_name(config)))
        self.lock_path = database.with_name(database.name + LOCK_SUFFIX)
        self._fd: int | None = None

    def start(self) -> None:
        """Take the lock file and start reporting.

        Raises:
            ClusterError: another fleet-server serves this database, or no lock file.
        """
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ClusterError(str(self.lock_path), f"cannot open the lock file: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            db = self.lock_path.name.removesuffix(LOCK_SUFFIX)
            raise ClusterError(
                str(self.lock_path.with_name(db)),
                "another fleet-server already serves this SQLite database; several "
                "replicas need PostgreSQL ([database] url = postgresql+psycopg://...)",
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        self.registry.start()

    def stop(self) -> None:
        self._unattach()
        self.registry.stop()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class PgCluster(_Reported):
    """A replica on PostgreSQL: the advisory-lock leader and its reports."""

    def __init__(self, engine: Engine, config: FleetServerConfig) -> None:
        c = config.cluster
        self.leader = PgLeader(
            engine, replica_name(config), LeaderTimings(c.lease_s, c.renew_s, c.poll_s)
        )
        super().__init__(engine, config, self.leader)

    def start(self) -> None:
        self.leader.start()
        self.registry.start()

    def stop(self) -> None:
        self._unattach()
        self.leader.stop()
        self.registry.stop()


def open_cluster(config: FleetServerConfig, engine: Engine) -> Cluster:
    """This replica's membership in the fleet server's cluster (see the module docstring);
    :meth:`Cluster.start` joins it.

    Raises:
        ClusterError: a database that is neither SQLite nor PostgreSQL.
    """
    name = engine.dialect.name
    if name == "postgresql":
        return PgCluster(engine, config)
    if name == "sqlite" and engine.url.database:
        return SqliteCluster(engine, config, Path(engine.url.database).resolve())
    raise ClusterError(engine.url.render_as_string(), f"no cluster on a {name} database")
