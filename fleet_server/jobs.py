"""The jobs ``fleet-server serve`` runs beside the API that must not run twice across
replicas: the rollout reconciler and the drift job (retention:
:mod:`fleet_server.retention.runner`). Each runs its loop on every replica and acts only
while ``ctx.leader`` says this replica leads (a follower looks again every
:data:`FOLLOWER_POLL_S`); the rollout service's saves and publishes are fenced by it too
(:mod:`fleet_server.rollout.service`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from fleet_server.api.context import ServerContext
from fleet_server.cluster import leader_detail
from fleet_server.health import PartHealth
from fleet_server.quality.drift import DriftSettings
from fleet_server.quality.drift_job import run_drift
from fleet_server.rollout.service import RolloutService
from fleet_server.services import PUBLISH_TIMEOUT_S, MqttPublisher, make_publisher

log = logging.getLogger(__name__)

ROLLOUTS_HEALTH = "rollouts"
DRIFT_HEALTH = "drift"
FOLLOWER_POLL_S = 0.25
"""How often a job that does not lead asks again (it acts within this of taking the lead)."""


class RolloutRunner:
    """The rollout service on its own thread; attaches itself as the API's RolloutOps."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.publisher: MqttPublisher | None = None
        self.service: RolloutService | None = None
        self.passes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.publisher = make_publisher(self.ctx)
        if not self.publisher.wait_connected(PUBLISH_TIMEOUT_S):
            log.warning(
                "rollout publisher: not connected within %g s (retrying)", PUBLISH_TIMEOUT_S
            )
        self.service = RolloutService(
            self.ctx.engine,
            repo=self.ctx.repository,
            keystore=self.ctx.keystore,
            publish=self.publisher,
            leader=self.ctx.leader,
        )
        self.ctx.rollouts = self.service
        self._thread = threading.Thread(
            target=self._loop, args=(self.service,), name="rollouts", daemon=True
        )
        self._thread.start()
        self.ctx.health.register(ROLLOUTS_HEALTH, self.health)

    def _loop(self, service: RolloutService) -> None:
        """A tick every ``[rollouts] tick_s`` while this replica leads."""
        leader = self.ctx.leader
        tick_s = self.ctx.config.rollouts.tick_s
        leading = False
        while not self._stop.is_set():
            if not leader.is_leader():
                if leading:
                    log.info("rollout loop: not the leader any more; waiting")
                leading = False
                self._stop.wait(min(tick_s, FOLLOWER_POLL_S))
                continue
            if not leading:
                log.info("rollout loop: leading; reconciling every %g s", tick_s)
            leading = True
            started = time.monotonic()
            try:
                service.tick()
                self.passes += 1
            except Exception:  # a failed pass must not end the loop: log, count, go on
                service.stats.tick_errors += 1
                log.exception("rollout loop: tick failed")
            self._stop.wait(max(0.0, tick_s - (time.monotonic() - started)))

    def health(self) -> PartHealth:
        """Ok while the reconciliation thread runs and the publisher is connected with
        its network thread alive."""
        thread_ok = self._thread is not None and self._thread.is_alive()
        pub = self.publisher
        detail: dict[str, Any] = {"loop_alive": thread_ok, "leader": leader_detail(self.ctx.leader)}
        if self.service is not None:
            detail["stats"] = vars(self.service.stats).copy()
        if pub is not None:
            detail["publisher"] = pub.detail()
        ok = thread_ok and pub is not None and pub.connected and pub.guard.thread_alive
        return PartHealth(ok, detail)

    def stop(self) -> None:
        self.ctx.health.unregister(ROLLOUTS_HEALTH)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.ctx.rollouts = None
        if self.publisher is not None:
            self.publisher.close()


def drift_settings(ctx: ServerContext) -> DriftSettings:
    """The ``[drift]`` section as the drift job's settings."""
    return DriftSettings.of(ctx.config.drift)


class DriftRunner:
    """The drift job (:func:`fleet_server.quality.drift_job.run_drift`) every
    ``[drift] interval_s``, on its own thread; a failed run is logged and counted, and
    the next one comes at the next interval."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.runs = 0
        self.failures = 0
        self.raised = 0
        self.skipped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> None:
        """One run now."""
        result = run_drift(self.ctx.engine, drift_settings(self.ctx))
        self.runs += 1
        self.raised += len(result.raised)

    def _loop(self) -> None:
        interval = self.ctx.config.drift.interval_s
        while not self._stop.wait(interval):
            if not self.ctx.leader.is_leader():
                self.skipped += 1
                continue
            try:
                self.run_once()
            except Exception:  # a failed run must not end the loop: log, count, go on
                self.failures += 1
                log.exception("drift job failed (%d so far)", self.failures)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="drift", daemon=True)
        self._thread.start()
        self.ctx.health.register(DRIFT_HEALTH, self.health)

    def health(self) -> PartHealth:
        """Ok while the job's thread runs."""
        alive = self._thread is not None and self._thread.is_alive()
        detail = {"loop_alive": alive, "runs": self.runs, "failures": self.failures,
                  "raised": self.raised, "skipped_not_leader": self.skipped,
                  "leader": self.ctx.leader.is_leader()}  # fmt: skip
        return PartHealth(alive, detail)

    def stop(self) -> None:
        self.ctx.health.unregister(DRIFT_HEALTH)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
