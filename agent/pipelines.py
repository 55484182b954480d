"""The agent's pipelines and what feeds them, built from the config: the runtime's worker
pool with every pipeline's models, the cameras and sensors the pipelines read, and one
runner thread per pipeline. Reloaded after a bundle switch or rollback: the sources keep
running, the pool and the pipeline threads are new.

A part that can't start (a bundle that is missing, a model that does not load, a sensor
that can't connect) is recorded as a :class:`~agent.planning.Problem` and left out; the
rest runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.capture import Camera
from agent.config import AgentConfig
from agent.kernel.errors import EdgefleetError
from agent.metrics import AgentMetrics
from agent.pipeline.runner import MAX_IN_FLIGHT, Decision, PipelineRunner, Stage
from agent.planning import Plan, Problem, Resolver, config_bundles, plan_pipelines
from agent.sensors import SensorSource, make_sensor
from runtime import ModelConfig, ModelLoadError, PoolConfig, WorkerPool
from runtime.profiles import load_profile

log = logging.getLogger(__name__)

PIPELINE_PROBLEM = "pipeline "
"""The prefix of a pipeline's problem (``pipeline <name>``); a reload clears them."""


class Pipelines:
    """The pool, the sources and the pipeline runners of one agent.

    ``problems`` is the agent's list: what does not start is appended to it, and a reload
    drops the pipelines' entries before it plans again.
    """

    def __init__(
        self,
        config: AgentConfig,
        resolve: Resolver | None,
        *,
        metrics: AgentMetrics,
        problems: list[Problem],
        emit: Callable[[Decision], None],
        on_reload: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.resolve = resolve
        self.metrics = metrics
        self.problems = problems
        self._emit = emit
        self._on_reload = on_reload
        self._config_hash = config.digest()
        self.cameras: dict[str, Camera] = {}
        self.sensors: dict[str, SensorSource] = {}
        self.runners: list[PipelineRunner] = []
        self.pool: WorkerPool | None = None
        self._loaded: dict[str, list[Path]] = {}
        self._reload_lock = threading.Lock()

    def start(self) -> None:
        """Plan every pipeline, start the pool with their models, their sources and their
        runners."""
        with self._reload_lock:
            self._start_all()

    def _start_all(self) -> None:
        plans, problems = plan_pipelines(self.config, self.resolve)
        self.problems.extend(problems)
        for p in problems:
            log.error("%s not started: %s", p.part, p.reason)
        plans = self._start_pool(plans)
        self._start_sources({pl.config.source for pl in plans})
        for plan in plans:
            self._start_runner(plan)

    def reload_if_changed(self) -> bool:
        """Reload when a pipeline's bundles now resolve to other directories."""
        wanted: dict[str, list[Path]] = {}
        for p in self.config.pipelines:
            try:
                wanted[p.name] = (self.resolve or config_bundles)(p)
            except EdgefleetError:
                wanted[p.name] = []
        if wanted == self._loaded:
            return False
        self.reload()
        return True

    def reload(self) -> None:
        """Load every pipeline again (after a bundle switch or rollback): the cameras,
        sensors, log and actions keep running; the pool and pipeline threads are new."""
        with self._reload_lock:
            for r in self.runners:
                r.stop()
            for r in self.runners:
                r.join(2.0)
            self.runners = []
            self._loaded = {}
            self._on_reload()
            if self.pool is not None:
                self.pool.close()
                self.pool = None
            self.problems[:] = [p for p in self.problems if not p.part.startswith(PIPELINE_PROBLEM)]
            self._start_all()

    def bundle_health(self, bundle: str) -> Mapping[str, float]:
        """Worker restarts, inference errors and inference p95 of the pipelines that run
        ``bundle`` (the health probe of a bundle on trial).

        Raises:
            RuntimeError: no running pipeline uses the bundle.
        """
        runners = [
            r for r in self.runners if any(s.bundle.manifest.name == bundle for s in r.stages)
        ]
        pool = self.pool
        if not runners or pool is None:
            problems = "; ".join(f"{p.part}: {p.reason}" for p in self.problems)
            raise RuntimeError(f"no pipeline runs bundle {bundle}: {problems or 'none'}")
        models = [s.model for r in runners for s in r.stages if s.bundle.manifest.name == bundle]
        stats = pool.stats()["models"]
        p95 = max(float(stats[m]["stages"]["inference"].get("p95_ms", 0.0)) for m in models)
        return {
            "worker_crashes": float(pool.restarts()),
            "inference_errors": float(sum(r.stats.errors for r in runners)),
            "p95_ms": p95,
            "inferences": float(sum(r.stats.decided for r in runners)),
        }

    def pipeline_of(self, source: str) -> str:
        """The pipeline that reads ``source`` (the source's name when none does)."""
        for r in self.runners:
            if r.source_name == source:
                return r.name
        return source

    def worker_pids(self) -> list[int]:
        return [p for p in (self.pool.worker_pids() if self.pool else []) if p]

    def stop(self, deadline: float) -> None:
        """Stop capture, then let each pipeline finish the frame in flight (until the
        monotonic ``deadline``, at most 2 s each); the pool stays up (:meth:`close_pool`)."""
        for cam in self.cameras.values():
            cam.stop(timeout_s=0.5)
        for sensor in self.sensors.values():
            sensor.stop(timeout_s=0.5)
        for r in self.runners:
            r.stop()
        for r in self.runners:
            r.join(max(0.1, min(2.0, deadline - time.monotonic())))

    def close_pool(self, timeout_s: float) -> None:
        if self.pool is not None:
            self.pool.close(timeout_s=timeout_s)

    # -- building ---------------------------------------------------------------------
    def _start_pool(self, plans: list[Plan]) -> list[Plan]:
        """Start the pool with every plan's models; a model that does not load takes its
        pipeline out, and the pool starts again without it."""
        rt = self.config.runtime
        profile = load_profile(self.config.agent.profile)
        overrides: dict[str, Any] = {"pin": rt.pin, "heartbeat_timeout_s": rt.heartbeat_timeout_s}
        if rt.workers is not None:
            overrides["workers"] = rt.workers
        pool_cfg = PoolConfig.from_profile(profile, **overrides)
        while plans:
            models: list[ModelConfig] = []
            for plan in plans:
                for i, (bundle, name) in enumerate(zip(plan.bundles, plan.models, strict=True)):
                    bound = max(8, 2 * plan.max_crops[i])
                    models.append(bundle.model_config(name, queue_bound=bound))
            pool = WorkerPool(models, pool_cfg)
            try:
                pool.start()
            except ModelLoadError as e:
                pool.close()
                bad = [pl for pl in plans if any(str(b.model_file()) == e.path for b in pl.bundles)]
                if not bad:
                    raise
                for pl in bad:
                    self.problems.append(Problem(f"{PIPELINE_PROBLEM}{pl.config.name}", str(e)))
                    log.error("pipeline %s not started: %s", pl.config.name, e)  # noqa: TRY400
                plans = [pl for pl in plans if pl not in bad]
                continue
            self.pool = pool
            return plans
        return plans

    def _start_sources(self, used: set[str]) -> None:
        for cam_cfg in self.config.cameras:
            if cam_cfg.name in used and cam_cfg.name not in self.cameras:
                cam = Camera(cam_cfg, on_state=self._camera_state)
                self.cameras[cam_cfg.name] = cam
                cam.start()
        for sensor_cfg in self.config.sensors:
            if sensor_cfg.name in used and sensor_cfg.name not in self.sensors:
                try:
                    sensor = make_sensor(sensor_cfg, self.config.mqtt)
                    sensor.start()
                except EdgefleetError as e:
                    self.problems.append(Problem(f"sensor {sensor_cfg.name}", str(e)))
                    log.error("sensor %s not started: %s", sensor_cfg.name, e)  # noqa: TRY400
                    continue
                self.sensors[sensor_cfg.name] = sensor

    def _start_runner(self, plan: Plan) -> None:
        if self.pool is None:
            raise RuntimeError("the pool is not started")
        source = self.cameras.get(plan.config.source) or self.sensors.get(plan.config.source)
        if source is None:
            self.problems.append(
                Problem(f"{PIPELINE_PROBLEM}{plan.config.name}", "its source did not start")
            )
            return
        stages = [
            Stage.build(b, m, self.pool, max_crops=mc, padding=pad)
            for b, m, mc, pad in zip(
                plan.bundles, plan.models, plan.max_crops, plan.padding, strict=True
            )
        ]
        name = plan.config.name
        deadline = plan.config.deadline_ms / 1000 if plan.config.deadline_ms else None
        runner = PipelineRunner(
            name,
            source_name=plan.config.source,
            line=plan.line,
            source=source,
            pool=self.pool,
            stages=stages,
            policy=plan.policy,
            config_hash=self._config_hash,
            emit=self._emit,
            on_error=self._error_sink(name),
            deadline_s=deadline,
            # one frame in flight per worker: one camera can keep every worker busy (ADR 0009)
            in_flight=max(1, min(MAX_IN_FLIGHT, self.pool.config.workers)),
        )
        self.runners.append(runner)
        self._loaded[name] = [b.path for b in plan.bundles]
        if isinstance(source, Camera):
            self._watch_serving(source)
        runner.start()

    def _watch_serving(self, cam: Camera) -> None:
        """The camera's drop ratio and starved flag as gauges, read from its stats when
        /metrics is scraped (nothing on the hot path)."""
        m = self.metrics
        m.camera_drop_ratio.labels(camera=cam.name).set_function(lambda: cam.stats().drop_ratio)
        m.camera_starved.labels(camera=cam.name).set_function(
            lambda: 1.0 if cam.stats().starved else 0.0
        )

    def _error_sink(self, pipeline: str) -> Callable[[str, str], None]:
        return lambda reason, message: self._pipeline_error(pipeline, reason, message)

    def _pipeline_error(self, pipeline: str, reason: str, message: str) -> None:
        self.metrics.inference_errors.labels(pipeline=pipeline, reason=reason).inc()
        log.warning("pipeline %s: %s", pipeline, message)

    def _camera_state(self, name: str, up: bool, reason: str) -> None:
        # the camera logs its own transitions; here they become the up/down gauge
        self.metrics.camera_up.labels(camera=name).set(1 if up else 0)
