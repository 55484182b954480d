"""The cluster tables: the fencing epoch of each leader-only role (``cluster_leader``) and
each replica's last report (``cluster_replicas``).

:func:`raise_epoch` starts a leader's term (the new epoch, in one statement);
:func:`check_epoch` is the fence a leader's write runs in its own transaction: on
PostgreSQL it locks the role's row (``SELECT ... FOR UPDATE``), so a new leader's
:func:`raise_epoch` waits for the write to commit and every later write by the old
leader sees the new epoch and is refused. SQLite serves one replica (epoch 1): a role
without a row counts as epoch 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from fleet_server.db._tx import Bind, reading, upsert, writing
from fleet_server.db.errors import StorageError
from fleet_server.db.tables import cluster_leader, cluster_replicas

__all__ = [
    "ROLLOUTS_ROLE",
    "SINGLE_EPOCH",
    "EpochMismatch",
    "LeaderRow",
    "ReplicaRow",
    "check_epoch",
    "delete_replica",
    "list_replicas",
    "load_leader",
    "prune_replicas",
    "raise_epoch",
    "report_replica",
]

ROLLOUTS_ROLE = "rollouts"
"""The leader-only role of the rollout reconciler, the drift job and retention."""
SINGLE_EPOCH = 1
"""The epoch of a role without a row (the single replica on SQLite)."""


class EpochMismatch(StorageError):
    """A leader's write was fenced: the role's stored epoch is not the writer's.

    Attributes:
        role: the role ("rollouts").
        epoch: the writer's epoch.
        stored: the stored one.
    """

    def __init__(self, role: str, epoch: int, stored: int) -> None:
        self.role = role
        self.epoch = epoch
        self.stored = stored
        super().__init__(role, f"fenced: epoch {epoch} is not the current epoch {stored}")


@dataclass(frozen=True)
class LeaderRow:
    """A role's current term."""

    name: str
    epoch: int
    holder: str
    acquired_at: float


@dataclass(frozen=True)
class ReplicaRow:
    """A replica's last report."""

    replica_id: str
    host: str
    pid: int
    started_at: float
    seen_at: float
    leader: bool
    epoch: int | None
    info: dict[str, Any] | None


def raise_epoch(bind: Bind, role: str, holder: str, now: float) -> int:
    """Start a new term of ``role`` held by ``holder``; returns its epoch (1 for the
    first term, else the stored one plus one)."""
    t = cluster_leader
    with writing(bind) as conn:
        stmt = (
            upsert(conn, t)
            .values(name=role, epoch=1, holder=holder, acquired_at=now)
            .on_conflict_do_update(
                index_elements=["name"],
                set_={"epoch": t.c.epoch + 1, "holder": holder, "acquired_at": now},
            )
            .returning(t.c.epoch)
        )
        return int(conn.execute(stmt).scalar_one())


def check_epoch(conn: Connection, role: str, epoch: int) -> None:
    """The fence, in the caller's write transaction: ``role``'s stored epoch must be
    ``epoch`` (no row counts as :data:`SINGLE_EPOCH`). On PostgreSQL the row stays
    locked until the transaction ends.

    Raises:
        EpochMismatch: another term started since.
    """
    t = cluster_leader
    query = sa.select(t.c.epoch).where(t.c.name == role)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    stored = conn.execute(query).scalar()
    current = SINGLE_EPOCH if stored is None else int(stored)
    if current != epoch:
        raise EpochMismatch(role, epoch, current)


def load_leader(bind: Bind, role: str = ROLLOUTS_ROLE) -> LeaderRow | None:
    """``role``'s current term (None before the first)."""
    with reading(bind) as conn:
        row = conn.execute(sa.select(cluster_leader).where(cluster_leader.c.name == role)).first()
    return None if row is None else LeaderRow(**row._asdict())


def report_replica(bind: Bind, row: ReplicaRow) -> None:
    """Insert or replace a replica's report."""
    values = vars(row)
    with writing(bind) as conn:
        stmt = upsert(conn, cluster_replicas).values(**values)
        stmt = stmt.on_conflict_do_update(
            index_elements=["replica_id"],
            set_={k: v for k, v in values.items() if k != "replica_id"},
        )
        conn.execute(stmt)


def list_replicas(bind: Bind) -> list[ReplicaRow]:
    """Every replica's last report, by id."""
    t = cluster_replicas
    with reading(bind) as conn:
        rows = conn.execute(sa.select(t).order_by(t.c.replica_id)).all()
    return [ReplicaRow(**r._asdict()) for r in rows]


def delete_replica(bind: Bind, replica_id: str) -> None:
    """Forget a replica (it stopped on purpose)."""
    t = cluster_replicas
    with writing(bind) as conn:
        conn.execute(t.delete().where(t.c.replica_id == replica_id))


def prune_replicas(bind: Bind, seen_before: float) -> int:
    """Forget the replicas not seen since ``seen_before``; returns how many."""
    t = cluster_replicas
    with writing(bind) as conn:
        return int(conn.execute(t.delete().where(t.c.seen_at < seen_before)).rowcount)
