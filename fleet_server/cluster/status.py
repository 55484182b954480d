"""What ``fleet-server status`` and ``GET /api/v1/cluster`` show, read from the database:
every replica's last report (alive when seen within :data:`ALIVE_REPORTS` x report_s),
which one leads, the current epoch, and each one's ingest rate."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.engine import Engine

from fleet_server.db.cluster import ROLLOUTS_ROLE, list_replicas, load_leader

__all__ = ["ALIVE_REPORTS", "ClusterStatus", "ReplicaStatus", "cluster_status", "render"]

ALIVE_REPORTS = 3
"""A replica is alive while its last report is under this many report periods old."""


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica as the status shows it."""

    replica_id: str
    host: str
    pid: int
    started_at: float
    seen_at: float
    seen_s_ago: float
    alive: bool
    leader: bool
    epoch: int | None
    ingest_rate_per_s: float
    version: str


@dataclass(frozen=True)
class ClusterStatus:
    """The replicas, the leader (None when no live replica leads) and the epoch."""

    leader: str | None
    epoch: int | None
    holder: str | None
    acquired_at: float | None
    replicas: list[ReplicaStatus]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def cluster_status(engine: Engine, report_s: float, now: float | None = None) -> ClusterStatus:
    """The cluster as its replicas last reported it.

    Raises:
        StorageError: the database can't be read.
    """
    now = time.time() if now is None else now
    term = load_leader(engine, ROLLOUTS_ROLE)
    replicas = []
    for r in list_replicas(engine):
        info = r.info or {}
        age = max(0.0, now - r.seen_at)
        rate = info.get("ingest_rate_per_s", 0.0)
        replicas.append(
            ReplicaStatus(
                replica_id=r.replica_id,
                host=r.host,
                pid=r.pid,
                started_at=r.started_at,
                seen_at=r.seen_at,
                seen_s_ago=round(age, 3),
                alive=age < ALIVE_REPORTS * report_s,
                leader=r.leader,
                epoch=r.epoch,
                ingest_rate_per_s=float(rate) if isinstance(rate, int | float) else 0.0,
                version=str(info.get("version", "")),
            )
        )
    current = None if term is None else term.epoch
    leading = [
        r for r in replicas if r.alive and r.leader and (current is None or r.epoch == current)
    ]
    return ClusterStatus(
        leader=leading[0].replica_id if leading else None,
        epoch=current,
        holder=None if term is None else term.holder,
        acquired_at=None if term is None else term.acquired_at,
        replicas=replicas,
    )


def render(status: ClusterStatus) -> str:
    """A table for people."""
    lines = [
        f"leader: {status.leader or 'none'} (epoch {status.epoch if status.epoch else '-'})",
        f"{'REPLICA':<28} {'HOST':<20} {'PID':>7} {'STATE':<8} {'ROLE':<8} "
        f"{'SEEN':>7} {'INGEST/S':>9}",
    ]
    for r in status.replicas:
        state = "alive" if r.alive else "gone"
        role = "leader" if r.replica_id == status.leader else "follower"
        lines.append(
            f"{r.replica_id:<28} {r.host:<20} {r.pid:>7} {state:<8} {role:<8} "
            f"{r.seen_s_ago:>6.1f}s {r.ingest_rate_per_s:>9.1f}"
        )
    if not status.replicas:
        lines.append("(no replica has reported)")
    return "\n".join(lines)
