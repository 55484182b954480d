"""The jobs ``fleet-server serve`` runs beside the API that must not run twice across
replicas: the rollout reconciler and the drift job (retention:
:mod:`fleet_server.retention.runner`). Each runs its loop on every replica and acts only
while ``ctx.leader`` says this replica leads."""

from __future__ import annotations

import logging
import threading
from typing import Any

from fleet_server.api.context import ServerContext
from fleet_server.health import PartHealth
from fleet_server.quality.drift import DriftSettings
from fleet_server.quality.drift_job import run_drift
from fleet_server.rollout.service import RolloutService
from fleet_server.services import PUBLISH_TIMEOUT_S, MqttPublisher, make_publisher

log = logging.getLogger(__name__)

ROLLOUTS_HEALTH = "rollouts"
DRIFT_HEALTH = "drift"


class RolloutRunner:
    """The rollout service on its own thread; attaches itself as the API's RolloutOps."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.publisher: MqttPublisher | None = None
        self.service: RolloutService | None = None
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
        )
        self.ctx.rollouts = self.service
        tick_s = self.ctx.config.rollouts.tick_s
        self._thread = threading.Thread(
            target=self.service.run, args=(self._stop, tick_s), name="rollouts", daemon=True
        )
        self._thread.start()
        self.ctx.health.register(ROLLOUTS_HEALTH, self.health)

    def health(self) -> PartHealth:
        """Ok while the reconciliation thread runs and the publisher is connected with
        its network thread alive."""
        thread_ok = self._thread is not None and self._thread.is_alive()
        pub = self.publisher
        detail: dict[str, Any] = {"loop_alive": thread_ok}
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
                  "raised": self.raised}  # fmt: skip
        return PartHealth(alive, detail)

    def stop(self) -> None:
        self.ctx.health.unregister(DRIFT_HEALTH)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
