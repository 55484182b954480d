"""Each replica's report in ``cluster_replicas``, every ``[cluster] report_s``: host,
pid, when it started and was last seen, whether it leads (and its epoch), and ``info``:
the ingest rate of each of its workers (read from their health probes), its version
and its leader detail. ``fleet-server status`` and ``GET /api/v1/cluster`` read them
(:mod:`fleet_server.cluster.status`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from sqlalchemy.engine import Engine

from fleet_server.cluster.errors import NotLeader
from fleet_server.db.cluster import ReplicaRow, delete_replica, prune_replicas, report_replica
from fleet_server.health import HealthRegistry, PartHealth

__all__ = ["FORGET_AFTER_S", "INGEST_PREFIX", "ReplicaRegistry", "ingest_rates", "version"]

log = logging.getLogger(__name__)

INGEST_PREFIX = "ingest"
"""Health probes whose name starts with this are ingest workers (``stored`` counted)."""
FORGET_AFTER_S = 86_400.0
"""The leader forgets replicas not seen for this long."""


def version() -> str:
    """This package's version ("unknown" when not installed)."""
    try:
        return metadata.version("edgefleet")
    except metadata.PackageNotFoundError:
        return "unknown"


def ingest_rates(
    parts: dict[str, PartHealth], before: dict[str, tuple[float, int]], now: float
) -> tuple[dict[str, dict[str, float]], dict[str, tuple[float, int]]]:
    """Per ingest worker: records stored in total and per second since ``before`` (the
    previous call's second value: when, how many)."""
    out: dict[str, dict[str, float]] = {}
    seen: dict[str, tuple[float, int]] = {}
    for name, part in parts.items():
        stored = part.detail.get("stored")
        if not name.startswith(INGEST_PREFIX) or not isinstance(stored, int):
            continue
        seen[name] = (now, stored)
        rate = 0.0
        if name in before:
            t0, n0 = before[name]
            if now > t0 and stored >= n0:
                rate = (stored - n0) / (now - t0)
        out[name] = {"stored": stored, "rate_per_s": round(rate, 3)}
    return out, seen


class _Leading:
    """What the registry asks of the leadership (is_leader, check, detail)."""

    def __init__(self, leadership: Any) -> None:
        self.leadership = leadership

    def epoch(self) -> int | None:
        try:
            return int(self.leadership.check())
        except NotLeader:
            return None

    def detail(self) -> dict[str, Any]:
        fn = getattr(self.leadership, "detail", None)
        return dict(fn()) if callable(fn) else {"leader": self.leadership.is_leader()}


class ReplicaRegistry:
    """Reports this replica every ``report_s`` on its own thread (a failed report is
    logged and counted; the next comes at the next period); deletes its row at stop."""

    def __init__(
        self,
        engine: Engine,
        replica_id: str,
        leadership: Any,
        report_s: float,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.replica_id = replica_id
        self.report_s = report_s
        self.wall = wall
        self.started_at = wall()
        self.reports = 0
        self.failures = 0
        self._leading = _Leading(leadership)
        self._health: HealthRegistry | None = None
        self._before: dict[str, tuple[float, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, health: HealthRegistry) -> None:
        """Read the ingest workers' rates from ``health`` (the server's context exists
        only after the cluster was opened)."""
        self._health = health

    def report(self) -> ReplicaRow:
        """Write this replica's report now; returns it.

        Raises:
            StorageError: the database refused the write.
        """
        now = self.wall()
        parts = self._health.check() if self._health is not None else {}
        ingest, self._before = ingest_rates(parts, self._before, now)
        epoch = self._leading.epoch()
        info: dict[str, Any] = {
            "version": version(),
            "ingest": ingest,
            "ingest_rate_per_s": round(sum(w["rate_per_s"] for w in ingest.values()), 3),
            "leadership": self._leading.detail(),
        }
        row = ReplicaRow(
            replica_id=self.replica_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=self.started_at,
            seen_at=now,
            leader=epoch is not None,
            epoch=epoch,
            info=info,
        )
        report_replica(self.engine, row)
        if epoch is not None:
            prune_replicas(self.engine, now - FORGET_AFTER_S)
        self.reports += 1
        return row

    def _loop(self) -> None:
        while True:
            try:
                self.report()
            except Exception:  # a failed report must not end the loop: log, count, go on
                self.failures += 1
                log.exception("replica report failed (%d so far)", self.failures)
            if self._stop.wait(self.report_s):
                return

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="replica-report", daemon=True)
        self._thread.start()

    def detail(self) -> dict[str, Any]:
        alive = self._thread is not None and self._thread.is_alive()
        return {"reporter_alive": alive, "reports": self.reports, "report_failures": self.failures}

    def stop(self) -> None:
        """End the loop and forget this replica's row."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
        try:
            delete_replica(self.engine, self.replica_id)
        except Exception:  # the row then ages out of "alive" in 3 x report_s
            log.exception("could not delete replica %s's report", self.replica_id)
