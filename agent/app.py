"""The agent in one process: the hot path (:class:`agent.hotpath.HotPath`) and its
companion (:class:`agent.companion.Companion`) composed in this process, the companion
calling the hot path directly through the same :class:`agent.control.link.HotPathLink`
it uses across processes.

``edge-agent run`` runs the two in separate processes under a supervisor
(:mod:`agent.supervisor`); this class is for tests, benches and embedding, and for
``edge-agent run --single-process``.

Start order: the hot path (decision log, installer recovery, pipelines, actions), then the
companion (local HTTP, uplink, directives). Stop order: the companion, then the hot path
(stop capture, let pipelines finish the frame in flight, stop actions, flush the decision
log, stop the pool).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.actions.dispatcher import ActionDispatcher
from agent.capture import Camera
from agent.companion import Companion
from agent.config import AgentConfig
from agent.control.link import HotPathLink, local_call
from agent.decisionlog import DecisionLog
from agent.directives.service import DirectivesService
from agent.enrollment.identity import Identity
from agent.hotpath import HotPath
from agent.http import LocalHttpServer
from agent.installer import Installer
from agent.metrics import AgentMetrics
from agent.pipeline.runner import Decision, PipelineRunner
from agent.pipelines import Pipelines
from agent.planning import Problem, Resolver
from agent.sensors import SensorSource
from agent.sink import DecisionSink
from agent.uplink.service import Uplink
from agent.upstream import Upstream
from runtime import WorkerPool

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
        self.hotpath = HotPath(
            config,
            on_decision=on_decision,
            on_alarm=lambda kind, message: self.companion.upstream.alarm(kind, message),  # noqa: PLW0108 - built below
            resolve=resolve,
            metrics=self.metrics,
        )
        self.problems: list[Problem] = self.hotpath.problems
        self.link = HotPathLink(
            local_call(self.hotpath.handle),
            device_id=config.agent.device_id,
            state_dir=config.agent.state_dir,
        )
        self.companion = Companion(
            config,
            self.link,
            metrics=self.metrics,
            http=http,
            decision_log=self.hotpath.log,
            installer=self.hotpath.installer,
            split=False,
            problems=self.problems,
        )
        self.state_dir: Path = config.agent.state_dir
        self.profile_name = self.hotpath.profile_name

    # -- the parts, as callers and tests know them ----------------------------------
    @property
    def device_id(self) -> str:
        return self.config.agent.device_id

    @property
    def log(self) -> DecisionLog:
        return self.hotpath.log

    @property
    def dispatcher(self) -> ActionDispatcher:
        return self.hotpath.dispatcher

    @property
    def installer(self) -> Installer | None:
        return self.hotpath.installer

    @property
    def sink(self) -> DecisionSink:
        return self.hotpath.sink

    @property
    def pipelines(self) -> Pipelines:
        return self.hotpath.pipelines

    @property
    def upstream(self) -> Upstream:
        return self.companion.upstream

    @property
    def http(self) -> LocalHttpServer | None:
        return self.companion.http

    @property
    def started_at(self) -> float:
        return self.hotpath.started_at

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
        self.hotpath.start()
        self.companion.start()
        return self

    def stop(self, timeout_s: float = 4.0) -> None:
        """Stop the companion, then the hot path (capture, in-flight work, the log's
        flush); bounded by ``timeout_s``."""
        self.companion.stop(timeout_s=1.0)
        self.hotpath.stop(timeout_s=max(0.5, timeout_s - 1.0))

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- bundles (RunningAgent) ----------------------------------------------------------
    def reload(self) -> None:
        """Load every pipeline again (after a bundle switch or rollback): the cameras,
        sensors, log and actions keep running; the pool and pipeline threads are new."""
        self.hotpath.reload()

    def reload_if_changed(self) -> bool:
        """Reload when a pipeline's bundles now resolve to other directories."""
        return self.hotpath.reload_if_changed()

    def bundle_health(self, bundle: str) -> Mapping[str, float]:
        """Health of ``bundle`` in the running pipelines (see :class:`Pipelines`).

        Raises:
            RuntimeError: no running pipeline uses the bundle.
        """
        return self.hotpath.bundle_health(bundle)

    # -- status ----------------------------------------------------------------------
    def update_gauges(self) -> None:
        self.hotpath.update_gauges()
        self.companion.update_gauges()

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Alive: the pool has workers and the decision log writer runs."""
        return self.companion.health()

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """Ready: every started pipeline runs and every camera delivers."""
        return self.hotpath.ready()

    def stats(self) -> dict[str, Any]:
        return self.hotpath.stats()

    def fleet_health(self) -> dict[str, Any]:
        """The agent's part of the fleet's ``Health`` report (the hot path's, shadow
        comparison included)."""
        return self.hotpath.fleet_health()
