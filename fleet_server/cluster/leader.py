"""The leader of the replicas on PostgreSQL: a session advisory lock on a connection of
its own, a lease, and a fencing epoch (docs/scaling-replicas.md, ADR 0015).

One thread per replica (:class:`PgLeader`):

- a follower tries ``pg_try_advisory_lock(LOCK_KEY)`` every ``poll_s`` on its dedicated
  connection (not from the pool: the lock lives and dies with it);
- on success it raises the role's epoch in ``cluster_leader`` (:func:`raise_epoch`) and
  waits ``lease_s`` before it acts, so that the previous leader's lease has run out;
- the leader checks every ``renew_s``, with one query bounded by a short statement
  timeout, that its session still holds the lock and the epoch is still its own; any
  failure or surprise drops the lead at once and closes the connection (which frees the
  lock if PostgreSQL still counted it);
- :meth:`is_leader` and :meth:`check` trust the lead only within ``lease_s`` of the
  start of the last renewal that succeeded (a monotonic clock): a leader whose thread is
  stuck on a dead network stops acting by itself.

Once it holds the lock, its session gets ``idle_session_timeout = lease_s``: a leader
process that is frozen (SIGSTOP, a stalled VM) and stops renewing loses its session, and
the lock, after a lease of silence. The connection has TCP keepalives and
``tcp_user_timeout`` on both ends: a blocked query of the leader ends within about a
lease when PostgreSQL is gone, and PostgreSQL ends the session of a vanished leader (and
frees its lock) within about a lease, not after the kernel's default two hours. The
lease is measured on ``CLOCK_BOOTTIME``, which counts the time a host spent suspended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from fleet_server.cluster.errors import NotLeader
from fleet_server.db.cluster import ROLLOUTS_ROLE, raise_epoch

__all__ = ["LOCK_KEY", "LeaderTimings", "PgLeader"]

log = logging.getLogger(__name__)

LOCK_KEY = 0x45464C54
"""The advisory lock of the rollouts role ("EFLT"; under 2**31, so it is pg_locks'
``objid`` with ``classid`` 0)."""

_TRY_LOCK = sa.text("SELECT pg_try_advisory_lock(:key), pg_backend_pid()")
_RENEW = sa.text(
    "SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND pid = pg_backend_pid() AND classid = 0 AND objid = :key AND objsubid = 1),"
    " (SELECT epoch FROM cluster_leader WHERE name = :role)"
)
_UNLOCK = sa.text("SELECT pg_advisory_unlock(:key)")
_IDLE_LIMIT = "SELECT set_config('idle_session_timeout', :ms, false)"


def _boottime() -> float:
    """Seconds on a clock that keeps counting while the host is suspended (a lease
    must not look fresh after a suspended VM resumes)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class LeaderTimings:
    """``[cluster]``'s lease_s, renew_s and poll_s."""

    lease_s: float = 5.0
    renew_s: float = 1.0
    poll_s: float = 1.0

    @property
    def query_timeout_s(self) -> float:
        """Statement timeout of the lock connection: under half a lease."""
        return max(0.1, min(self.renew_s, self.lease_s / 2))


class PgLeader:
    """Leadership by advisory lock on the PostgreSQL database of ``engine`` (its URL;
    the lock connection is separate). Thread-safe; :meth:`start` runs the elector.

    Args:
        replica_id: this replica's name (recorded as the term's holder).
        timings: lease, renewal and poll periods.
        role: the ``cluster_leader`` row (and the lock's meaning).
        clock: monotonic seconds that count suspended time (the lease); ``wall``:
            POSIX time (acquired_at).
    """

    def __init__(
        self,
        engine: Engine,
        replica_id: str,
        timings: LeaderTimings = LeaderTimings(),
        *,
        role: str = ROLLOUTS_ROLE,
        clock: Callable[[], float] = _boottime,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.replica_id = replica_id
        self.timings = timings
        self.role = role
        self.clock = clock
        self.wall = wall
        self._engine = _lock_engine(engine, timings)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Connection | None = None
        # under _lock: the current term (epoch None: not holding the lock)
        self._epoch: int | None = None
        self._acts_at = 0.0
        self._renewed_at = 0.0
        self.backend_pid: int | None = None
        self.terms = 0
        self.losses = 0
        self.failures = 0
        self.renewals = 0
        self.last_error = ""

    # -- what the jobs ask ------------------------------------------------------------

    def is_leader(self) -> bool:
        """True only while this replica holds the lock, waited out the previous lease,
        and renewed within ``lease_s``."""
        try:
            self.check()
        except NotLeader:
            return False
        return True

    def check(self) -> int:
        """This term's fencing epoch.

        Raises:
            NotLeader: not holding the lock, still waiting out the previous leader's
                lease, or the lease ran out.
        """
        now = self.clock()
        with self._lock:
            epoch, acts_at, renewed_at = self._epoch, self._acts_at, self._renewed_at
        if epoch is None:
            raise NotLeader(self.replica_id, "not the leader")
        if now < acts_at:
            raise NotLeader(self.replica_id, f"waiting {acts_at - now:.1f} s for the lease")
        late = now - renewed_at - self.timings.lease_s
        if late >= 0:
            raise NotLeader(self.replica_id, f"lease expired {late:.1f} s ago")
        return epoch

    def detail(self) -> dict[str, Any]:
        """Figures for the health probe and the replica's report."""
        with self._lock:
            epoch, renewed_at = self._epoch, self._renewed_at
        thread = self._thread
        return {
            "replica_id": self.replica_id,
            "leader": self.is_leader(),
            "holds_lock": epoch is not None,
            "epoch": epoch,
            "lease_left_s": None
            if epoch is None
            else round(max(0.0, self.timings.lease_s - (self.clock() - renewed_at)), 3),
            "elector_alive": thread is not None and thread.is_alive(),
            "terms": self.terms,
            "losses": self.losses,
            "failures": self.failures,
            "renewals": self.renewals,
            "last_error": self.last_error,
        }

    # -- the elector ------------------------------------------------------------------

    def start(self) -> None:
        """Start the elector thread."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="leader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Give the lead up (unlock, close) and end the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timings.query_timeout_s + 10.0)
            if self._thread.is_alive():
                log.warning("leader: the elector thread did not end in time")
        self._drop("stopping", unlock=True)
        self._engine.dispose()

    def _run(self) -> None:
        while not self._stop.is_set():
            holding = self._epoch is not None
            try:
                if holding:
                    self._renew()
                else:
                    self._try_acquire()
            except SQLAlchemyError as exc:  # the database failed: drop at once, count
                self._failed(exc)
            except Exception as exc:  # a bug must not end the elector: log, count, drop
                log.exception("leader %s: unexpected failure", self.replica_id)
                self._failed(exc)
            period = self.timings.renew_s if self._epoch is not None else self.timings.poll_s
            self._stop.wait(period)

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        cause = getattr(exc, "orig", None) or exc  # the driver's error, without the SQL
        self.last_error = " ".join(f"{type(cause).__name__}: {cause}".split())[:300]
        log.warning("leader %s: %s", self.replica_id, self.last_error)
        self._drop(f"failure: {self.last_error}", unlock=False)

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self._engine.connect()
        return self._conn

    def _try_acquire(self) -> None:
        conn = self._connection()
        started = self.clock()
        got, pid = conn.execute(_TRY_LOCK, {"key": LOCK_KEY}).one()
        self.backend_pid = int(pid)
        if not got:
            return
        # A leader that stops renewing (frozen, stopped, paused) is cut off by
        # PostgreSQL after a lease of silence, which frees the lock for a follower.
        limit_ms = str(int(self.timings.lease_s * 1000))
        conn.execute(sa.text(_IDLE_LIMIT), {"ms": limit_ms})
        epoch = raise_epoch(conn, self.role, self.replica_id, self.wall())
        with self._lock:
            self._epoch = epoch
            self._renewed_at = started
            self._acts_at = self.clock() + self.timings.lease_s
        self.terms += 1
        log.info(
            "leader %s: took the lock (epoch %d); acting in %g s",
            self.replica_id, epoch, self.timings.lease_s,
        )  # fmt: skip

    def _renew(self) -> None:
        conn = self._connection()
        started = self.clock()
        held, stored = conn.execute(_RENEW, {"key": LOCK_KEY, "role": self.role}).one()
        with self._lock:
            epoch = self._epoch
        if not held:
            self._drop("the lock is no longer held", unlock=False)
            return
        if stored != epoch:
            self._drop(f"epoch {stored} in the database, not {epoch}", unlock=True)
            return
        with self._lock:
            self._renewed_at = started
        self.renewals += 1

    def _drop(self, why: str, *, unlock: bool) -> None:
        """Leave the lead now (if held) and close the lock connection."""
        with self._lock:
            had = self._epoch is not None
            self._epoch = None
            self._acts_at = self._renewed_at = 0.0
        if had:
            self.losses += 1
            log.warning("leader %s: lost the lead: %s", self.replica_id, why)
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if unlock and had:
                conn.execute(_UNLOCK, {"key": LOCK_KEY})
        except SQLAlchemyError as exc:  # closing frees the lock anyway
            log.info("leader %s: unlock failed (%s); closing", self.replica_id, exc)
        finally:
            try:
                conn.invalidate()
                conn.close()
            except SQLAlchemyError as exc:  # a dead connection may fail to close: log, go on
                log.info("leader %s: closing the lock connection: %s", self.replica_id, exc)


def _lock_engine(engine: Engine, timings: LeaderTimings) -> Engine:
    """A pool-less engine on ``engine``'s database for the lock connection: autocommit
    (the lock is session-level; no transaction stays open), short statement timeout,
    TCP keepalives and user timeout of about a lease."""
    lease_ms = int(timings.lease_s * 1000)
    statement_ms = int(timings.query_timeout_s * 1000)
    idle = max(1, int(timings.lease_s / 2))
    return sa.create_engine(
        engine.url,
        poolclass=NullPool,
        isolation_level="AUTOCOMMIT",
        connect_args={
            "connect_timeout": max(2, int(timings.lease_s)),
            # the server's side too: PostgreSQL frees the lock of a client that vanished
            # (a partition, a dead host) within about a lease, not after the kernel's 2 h
            "options": f"-c statement_timeout={statement_ms}"
            f" -c idle_in_transaction_session_timeout={lease_ms}"
            f" -c tcp_keepalives_idle={idle} -c tcp_keepalives_interval=1"
            f" -c tcp_keepalives_count=3 -c tcp_user_timeout={lease_ms}",
            "keepalives": 1,
            "keepalives_idle": idle,
            "keepalives_interval": 1,
            "keepalives_count": 3,
            "tcp_user_timeout": lease_ms,
            "application_name": "edgefleet-leader",
        },
    )
