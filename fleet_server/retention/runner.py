"""The retention job in ``fleet-server serve`` (runs on the leader only).

Every replica runs the loop; a pass runs only while ``ctx.leader.is_leader()``, and stops
between two batches when the lead is lost. Its health probe ``retention`` carries the
figures metrics read: ``runs``, ``failures``, ``last_run_at``, ``last_duration_s``,
``deleted`` (rows per table, since start), ``deleted_total``, ``longest_batch_s``.
A failed pass is logged and counted, and the loop goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from fleet_server.api.context import ServerContext
from fleet_server.health import PartHealth
from fleet_server.retention.prune import PruneReport, prune

log = logging.getLogger(__name__)

PROBE = "retention"
FIRST_RUN_S = 60.0
"""Seconds after start before the first pass (the server settles first)."""
JOIN_S = 30.0


class RetentionRunner:
    """Applies the ``[retention]`` budgets every ``interval_s`` while this replica leads."""

    def __init__(self, ctx: ServerContext, *, first_run_s: float = FIRST_RUN_S) -> None:
        self.ctx = ctx
        self.first_run_s = first_run_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.runs = 0
        self.failures = 0
        self.skipped = 0
        self.last_run_at: float | None = None
        self.last_duration_s: float | None = None
        self.last_error: str | None = None
        self.longest_batch_s = 0.0
        self.deleted: dict[str, int] = {}

    def start(self) -> None:
        """Register the health probe and start the job's thread."""
        self.ctx.health.register(PROBE, self.health)
        if not self.ctx.config.retention.enabled:
            log.info("retention: disabled ([retention] enabled = false)")
            return
        self._thread = threading.Thread(target=self._loop, name="retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop it (a pass stops between two batches)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_S)
            if self._thread.is_alive():
                log.error("retention: thread still running %.0f s after stop", JOIN_S)
        self.ctx.health.unregister(PROBE)

    def _loop(self) -> None:
        wait = self.first_run_s
        while not self._stop.wait(wait):
            self.run_once()
            wait = self.ctx.config.retention.interval_s

    def _going_on(self) -> bool:
        return not self._stop.is_set() and self.ctx.leader.is_leader()

    def run_once(self, now: float | None = None, *, dry_run: bool = False) -> PruneReport | None:
        """One pass now if this replica leads (None when it does not); a failure is
        logged and counted, never raised."""
        if not self.ctx.leader.is_leader():
            with self._lock:
                self.skipped += 1
            return None
        config = self.ctx.config
        began = time.time()
        try:
            report = prune(
                self.ctx.engine,
                config.retention,
                now=now,
                repository=self.ctx.repository,
                dry_run=dry_run,
                should_go_on=self._going_on,
                drift_reference_s=config.drift.reference_hours * 3600.0,
                session_idle_s=float(config.auth.session_idle_s),
            )
        except Exception as exc:  # logged and counted; the loop goes on
            log.exception("retention: pass failed")
            with self._lock:
                self.runs += 1
                self.failures += 1
                self.last_run_at = began
                self.last_duration_s = time.time() - began
                self.last_error = f"{type(exc).__name__}: {exc}"
            return None
        with self._lock:
            self.runs += 1
            self.failures += 1 if report.errors else 0
            self.last_run_at = began
            self.last_duration_s = report.duration_s
            self.last_error = report.errors[-1] if report.errors else None
            self.longest_batch_s = max(self.longest_batch_s, report.longest_batch_s)
            if not dry_run:
                for table, n in report.deleted.items():
                    self.deleted[table] = self.deleted.get(table, 0) + n
        log.info(
            "retention: %d row(s) deleted in %.2f s (longest batch %.3f s)%s",
            report.deleted_total, report.duration_s, report.longest_batch_s,
            "; stopped early" if report.stopped else "",
        )  # fmt: skip
        return report

    def detail(self) -> dict[str, Any]:
        """The probe's figures."""
        with self._lock:
            return {
                "runs": self.runs,
                "failures": self.failures,
                "skipped": self.skipped,
                "last_run_at": self.last_run_at,
                "last_duration_s": self.last_duration_s,
                "last_error": self.last_error,
                "longest_batch_s": self.longest_batch_s,
                "deleted": dict(self.deleted),
                "deleted_total": sum(self.deleted.values()),
                "leader": self.ctx.leader.is_leader(),
            }

    def health(self) -> PartHealth:
        """OK unless the thread died (a failed pass is in the detail, ``last_error``: it
        must not take the replica out of service)."""
        detail = self.detail()
        thread = self._thread
        dead = thread is not None and not thread.is_alive() and not self._stop.is_set()
        return PartHealth(not dead, detail)
