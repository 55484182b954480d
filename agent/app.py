"""The agent process: composes its parts from the config and takes them down in order.

- :mod:`agent.pipelines`: the worker pool, cameras, sensors and pipeline runners (built
  from the config, reloaded after a bundle switch);
- :mod:`agent.sink`: where each decision goes (decision log, actions, metrics);
- :mod:`agent.upstream`: the uplink and the directives service toward the fleet;
- :mod:`agent.status`: health, readiness, stats and the metrics' gauges.

A part that can't start (a bundle that is missing, a model that does not load) is reported
and left out; the rest of the agent runs. Shutdown order: stop capture, let pipelines
finish the frame in flight, stop actions, flush the decision log, stop the pool.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.actions.dispatcher import ActionDispatcher
from agent.capture import Camera
from agent.config import AgentConfig
from agent.decisionlog import DecisionLog
from agent.directives.service import DirectivesService
from agent.enrollment.identity import Identity
from agent.http import LocalHttpServer
from agent.installer import Installer
from agent.metrics import AgentMetrics
from agent.pipeline.runner import Decision, PipelineRunner
from agent.pipelines import Pipelines
from agent.planning import Problem, Resolver, installed_resolver
from agent.sensors import SensorSource
from agent.sink import DecisionSink
from agent.status import (
    GaugeThread,
    agent_health,
    agent_stats,
    liveness,
    readiness,
    update_gauges,
)
from agent.uplink.service import Uplink
from agent.upstream import Upstream
from runtime import WorkerPool
from runtime.profiles import load_profile

log = logging.getLogger(__name__)


class Agent:
    """The running agent. ``start()``, then ``stop()`` (or use it as a context manager).

    Implements :class:`agent.directives.host.RunningAgent` for the directives service.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        on_decision: Callable[[Decision, str], None] | None = None,
        http: bool = True,
        resolve: Resolver | None = None,
    ) -> None:
        self.config = config
        self.metrics = AgentMetrics()
        self.problems: list[Problem] = []
        self.http: LocalHttpServer | None = None
        self._want_http = http
        self.state_dir: Path = config.agent.state_dir
        self.upstream = Upstream(config, metrics=self.metrics, problems=self.problems)
        self.log = DecisionLog(
            self.state_dir,
            config.decision_log,
            device_id=config.agent.device_id,
            on_alarm=self.upstream.alarm,
        )
        self.dispatcher = ActionDispatcher(
            config.actions.actions,
            config.mqtt,
            queue_bound=config.actions.queue_bound,
            metrics=self.metrics,
        )
        self.installer: Installer | None = None
        self.profile_name = load_profile(config.agent.profile).name
        if resolve is None and config.uses_installer():
            self.installer = Installer(
                self.state_dir, profile_name=self.profile_name, config=config.bundles.installer
            )
            resolve = installed_resolver(self.installer)
        self.sink = DecisionSink(
            self.log,
            self.dispatcher,
            self.metrics,
            pipeline_of=lambda source: self.pipelines.pipeline_of(source),  # noqa: PLW0108 - built below
            on_decision=on_decision,
        )
        self.pipelines = Pipelines(
            config,
            resolve,
            metrics=self.metrics,
            problems=self.problems,
            emit=self.sink.emit,
            on_reload=self.sink.reset_counts,
        )
        self._stop = threading.Event()
        self._gauges = GaugeThread(self.update_gauges, self._stop)
        self.started_at = 0.0

    # -- the parts, as callers and tests know them ----------------------------------
    @property
    def device_id(self) -> str:
        return self.config.agent.device_id

    @property
    def cameras(self) -> dict[str, Camera]:
        return self.pipelines.cameras

    @property
    def sensors(self) -> dict[str, SensorSource]:
        return self.pipelines.sensors

    @property
    def runners(self) -> list[PipelineRunner]:
        return self.pipelines.runners

    @property
    def pool(self) -> WorkerPool | None:
        return self.pipelines.pool

    @property
    def resolve(self) -> Resolver | None:
        return self.pipelines.resolve

    @property
    def identity(self) -> Identity | None:
        return self.upstream.identity

    @property
    def uplink(self) -> Uplink | None:
        return self.upstream.uplink

    @property
    def updates(self) -> DirectivesService | None:
        return self.upstream.updates

    @property
    def outcome_counts(self) -> dict[str, int]:
        """Decisions by outcome since the bundles were last (re)loaded."""
        return self.sink.outcome_counts

    @property
    def first_decision_at(self) -> float | None:
        return self.sink.first_decision_at

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> Agent:
        self.started_at = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log.open()
        if self.installer is not None:
            for report in self.installer.recover():
                log.warning("installer recovered: %s", report)
        self.pipelines.start()
        self.dispatcher.start()
        if self._want_http:
            h = self.config.http
            self.http = LocalHttpServer(
                h.host,
                h.port,
                self.metrics,
                health=self.health,
                ready=self.ready,
                allow_remote=h.allow_remote,
            )
            self.http.start()
        self.upstream.start(
            self,
            decision_log=self.log,
            installer=self.installer,
            profile_name=self.profile_name,
            health=lambda: agent_health(self.cameras, self.pool, self.outcome_counts),
            worker_pids=self.pipelines.worker_pids,
        )
        self._gauges.start()
        return self

    def stop(self, timeout_s: float = 4.0) -> None:
        """Stop capture, drain in-flight work, flush the log; bounded by ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        self.upstream.stop(timeout_s=1.0)
        self.pipelines.stop(deadline)
        self.dispatcher.stop(timeout_s=max(0.1, min(1.0, deadline - time.monotonic())))
        self.log.close(timeout_s=max(0.5, deadline - time.monotonic() - 0.5))
        self.pipelines.close_pool(timeout_s=max(0.2, deadline - time.monotonic()))
        if self.http is not None:
            self.http.stop()

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- bundles ---------------------------------------------------------------------
    def reload(self) -> None:
        """Load every pipeline again (after a bundle switch or rollback): the cameras,
        sensors, log and actions keep running; the pool and pipeline threads are new."""
        self.pipelines.reload()

    def reload_if_changed(self) -> bool:
        """Reload when a pipeline's bundles now resolve to other directories."""
        return self.pipelines.reload_if_changed()

    def bundle_health(self, bundle: str) -> Mapping[str, float]:
        """Health of ``bundle`` in the running pipelines (see :class:`Pipelines`).

        Raises:
            RuntimeError: no running pipeline uses the bundle.
        """
        return self.pipelines.bundle_health(bundle)

    # -- status ----------------------------------------------------------------------
    def update_gauges(self) -> None:
        update_gauges(self.metrics, self.pipelines, self.log, self.upstream)

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Alive: the pool has workers and the decision log writer runs."""
        return liveness(
            self.pipelines, self.log, self.upstream, configured=bool(self.config.pipelines)
        )

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """Ready: every started pipeline runs and every camera delivers."""
        return readiness(self.pipelines)

    def stats(self) -> dict[str, Any]:
        return agent_stats(self.pipelines, self.log, self.dispatcher)
