"""The hot path: capture, pipelines, policy, actions and the decision-log writer, and
nothing else.

:class:`HotPath` composes those parts from the config and answers the control channel's
operations (:meth:`HotPath.handle`): health and readiness, stats, its metrics, a reload
after a bundle switch, a bundle's health on trial, and the alarms its parts raised. The
uplink, the directives service, the local HTTP endpoint and their gauges are the
companion's (:mod:`agent.companion`); :class:`agent.app.Agent` runs both in one process,
``edge-agent run`` in two (:mod:`agent.supervisor`).

A part that can't start (a bundle that is missing, a model that does not load) is reported
and left out; the rest runs. Shutdown order: stop capture, let pipelines finish the frame
in flight, stop actions, flush the decision log, stop the pool.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.actions.dispatcher import ActionDispatcher
from agent.config import AgentConfig
from agent.control.protocol import ControlError
from agent.decisionlog import DecisionLog
from agent.installer import Installer
from agent.installer.checks import measure_in_pool
from agent.installer.errors import InstallError
from agent.kernel.bundle import load_bundle
from agent.kernel.errors import BundleError
from agent.line.recipes import Recipes
from agent.line.service import LineService
from agent.metrics import AgentMetrics
from agent.pipeline.runner import Decision
from agent.pipelines import Pipelines
from agent.planning import Problem, Resolver, installed_resolver
from agent.sink import DecisionSink
from agent.status import (
    GaugeThread,
    agent_health,
    agent_stats,
    hotpath_liveness,
    readiness,
    station_counts,
    update_hotpath_gauges,
)
from runtime import PoolConfig
from runtime.profiles import load_profile

log = logging.getLogger(__name__)

ALARM_QUEUE_BOUND = 64
"""Alarms kept for the companion to collect; older ones are folded into a count."""

Alarm = Callable[[str, str], None]

MAX_TRIAL_RUNS = 1000
MAX_TRIAL_TIMEOUT_MS = 600_000


class AlarmQueue:
    """The alarms of the hot path's parts, kept for the companion (which reports them to
    the fleet): bounded, the oldest dropped and counted."""

    def __init__(self, bound: int = ALARM_QUEUE_BOUND) -> None:
        self._items: collections.deque[dict[str, str]] = collections.deque(maxlen=bound)
        self._lock = threading.Lock()
        self.dropped = 0

    def put(self, kind: str, message: str) -> None:
        with self._lock:
            if len(self._items) == self._items.maxlen:
                self.dropped += 1
            self._items.append({"alarm": kind, "message": message})

    def take(self, most: int) -> list[dict[str, str]]:
        with self._lock:
            n = max(0, min(most, len(self._items)))
            return [self._items.popleft() for _ in range(n)]


class HotPath:
    """The hot path of one agent. ``start()``, then ``stop()``.

    Args:
        config: the agent's configuration.
        on_decision: also called with each decision and its id (on the pipeline's thread).
        on_alarm: told of each alarm at once (one process); None keeps them for
            :meth:`handle`'s ``alarms`` (the companion collects them).
        resolve: where a pipeline's bundles are (default: the installer's active slots,
            or the configured directories).
        recover: run the installer's recovery at start (the first start of the service,
            not a restart after a crash, while the companion may be in a health window).
        metrics: where the parts count (default: a registry of its own).
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        on_decision: Callable[[Decision, str], None] | None = None,
        on_alarm: Alarm | None = None,
        resolve: Resolver | None = None,
        recover: bool = True,
        metrics: AgentMetrics | None = None,
        starts: int = 1,
        last_exit: str = "",
    ) -> None:
        self.config = config
        self.metrics = metrics or AgentMetrics()
        self.problems: list[Problem] = []
        self.state_dir: Path = config.agent.state_dir
        self.alarms = AlarmQueue()
        self._on_alarm = on_alarm
        self._recover = recover
        self.log = DecisionLog(
            self.state_dir,
            config.decision_log,
            device_id=config.agent.device_id,
            on_alarm=self._alarm,
            drift=config.drift,
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
        self.line = LineService(config, metrics=self.metrics, on_alarm=self._alarm)
        self.sink = DecisionSink(
            self.log,
            self.dispatcher,
            self.metrics,
            pipeline_of=lambda source: self.pipelines.pipeline_of(source),  # noqa: PLW0108 - built below
            on_decision=on_decision,
            answer=self.line.answer if self.line.stations else None,
        )
        self.pipelines = Pipelines(
            config,
            resolve,
            metrics=self.metrics,
            problems=self.problems,
            emit=self.sink.emit,
            on_reload=self.sink.reset_counts,
            wrap_source=self.line.wrap_source if self.line.stations else None,
        )
        self._stop = threading.Event()
        self._gauges = GaugeThread(self.update_gauges, self._stop)
        self.line.recipes = Recipes(config, self.installer, self.reload_if_changed)
        self.started_at = 0.0
        self.boot = secrets.token_hex(8)
        """Differs on every start: the companion tells a restart by it."""
        self.starts = starts
        self.last_exit = last_exit

    @property
    def device_id(self) -> str:
        return self.config.agent.device_id

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> HotPath:
        self.started_at = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log.open()
        if self.installer is not None and self._recover:
            for report in self.installer.recover():
                log.warning("installer recovered: %s", report)
        self.line.start()
        self.pipelines.start()
        self.dispatcher.start()
        self._gauges.start()
        return self

    def stop(self, timeout_s: float = 4.0) -> None:
        """Stop capture, drain in-flight work, flush the log; bounded by ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        self.pipelines.stop(deadline)
        self.line.stop(timeout_s=max(0.2, min(2.0, deadline - time.monotonic())))
        self.dispatcher.stop(timeout_s=max(0.1, min(1.0, deadline - time.monotonic())))
        self.log.close(timeout_s=max(0.5, deadline - time.monotonic() - 0.5))
        self.pipelines.close_pool(timeout_s=max(0.2, deadline - time.monotonic()))

    # -- what the companion asks ------------------------------------------------------
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

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Alive: the pool has workers and the decision log writer runs."""
        alive, details = hotpath_liveness(
            self.pipelines, self.log, configured=bool(self.config.pipelines)
        )
        if self.line.configured:
            details["line"] = self.line.health()
        return alive, details

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """Ready: every started pipeline runs and every camera delivers."""
        return readiness(self.pipelines)

    def stats(self) -> dict[str, Any]:
        stats = agent_stats(self.pipelines, self.log, self.dispatcher)
        if self.line.configured:
            stats["line"] = self.line.stats()
        return stats

    def fleet_health(self) -> dict[str, Any]:
        """The agent's part of the fleet's ``Health`` report."""
        p = self.pipelines
        health = agent_health(p.cameras, p.pool, self.sink.outcome_counts, p.shadow_summary())
        if self.line.configured:
            health["stations"] = station_counts(self.line.stats())
        return health

    def hello(self) -> dict[str, Any]:
        """Who answers: pid, a boot id that differs on every start, how many times the
        supervisor started the hot path and how the last one ended."""
        first = self.sink.first_decision_at
        return {
            "pid": os.getpid(),
            "boot": self.boot,
            "starts": self.starts,
            "last_exit": self.last_exit,
            "device_id": self.device_id,
            "up_s": round(time.monotonic() - self.started_at, 3) if self.started_at else 0.0,
            "first_decision_s": round(first - self.started_at, 3) if first else None,
        }

    def update_gauges(self) -> None:
        update_hotpath_gauges(self.metrics, self.pipelines, self.log)
        self.line.update_metrics()

    def handle(self, op: str, args: dict[str, Any]) -> Any:
        """Answer one control operation (:data:`agent.control.protocol.OPS`), its
        arguments already checked.

        Raises:
            ControlError: an unknown operation, or no running pipeline uses the bundle
                asked about.
        """
        answer = self._ops.get(op)
        if answer is None:
            raise ControlError(f"unknown operation {op!r}")
        return answer(args)

    def _status(self) -> dict[str, Any]:
        return {
            "hello": self.hello(),
            "health": self.health(),
            "ready": self.ready(),
            "fleet_health": self.fleet_health(),
            "worker_pids": self.pipelines.worker_pids(),
        }

    def _bundle_health(self, args: dict[str, Any]) -> dict[str, float]:
        try:
            return dict(self.bundle_health(str(args["bundle"])))
        except RuntimeError as exc:
            raise ControlError(str(exc)) from None

    def _trial(self, args: dict[str, Any]) -> dict[str, Any]:
        """Load, warm up and self-benchmark a staged bundle for the installer (which runs
        in the companion) where the model will run: a one-worker pool of this process, its
        worker at the priority of the live workers. The bundle must be under the state
        directory.

        Raises:
            ControlError: the path is outside the state directory, or runs or the timeout
                out of range.
        """
        root = self.state_dir.resolve()
        path = Path(str(args["bundle"])).resolve()
        if not path.is_relative_to(root):
            raise ControlError(f"trial: {path} is not under the state directory {root}")
        runs, timeout_ms = int(args["runs"]), int(args["timeout_ms"])
        if not 1 <= runs <= MAX_TRIAL_RUNS or not 1 <= timeout_ms <= MAX_TRIAL_TIMEOUT_MS:
            raise ControlError(
                f"trial: runs must be 1..{MAX_TRIAL_RUNS} and timeout_ms 1..{MAX_TRIAL_TIMEOUT_MS}"
            )
        try:
            bundle = load_bundle(path)
            bench = measure_in_pool(
                bundle, PoolConfig(workers=1, pin=False), runs=runs, timeout_s=timeout_ms / 1000
            )
        except InstallError as exc:
            return {"error": {"step": exc.step, "reason": exc.reason, "name": exc.name}}
        except BundleError as exc:
            return {"error": {"step": "load", "reason": str(exc), "name": ""}}
        return {"bench": dataclasses.asdict(bench)}

    def _reload(self) -> None:
        self.reload()

    @property
    def _ops(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        return {
            "hello": lambda _a: self.hello(),
            "status": lambda _a: self._status(),
            "health": lambda _a: self.health(),
            "ready": lambda _a: self.ready(),
            "stats": lambda _a: self.stats(),
            "metrics": lambda _a: self.metrics.render_part("hotpath").decode("utf-8"),
            "reload": lambda _a: self._reload(),
            "reload_if_changed": lambda _a: self.reload_if_changed(),
            "bundle_health": self._bundle_health,
            "live": lambda _a: dataclasses.asdict(self.sink.live.snapshot()),
            "trial": self._trial,
            "alarms": lambda a: {
                "alarms": self.alarms.take(int(a["max"])),
                "dropped": self.alarms.dropped,
            },
        }

    def _alarm(self, kind: str, message: str) -> None:
        if self._on_alarm is not None:
            self._on_alarm(kind, message)
        else:
            log.error("alarm %s: %s", kind, message)
            self.alarms.put(kind, message)
