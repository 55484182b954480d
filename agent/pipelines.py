"""The agent's pipelines and what feeds them, built from the config: the runtime's worker
pool with every pipeline's models, the cameras and sensors the pipelines read, and one
runner thread per pipeline. Reloaded after a bundle switch or rollback: the sources keep
running, the pool and the pipeline threads are new.

A part that can't start (a bundle that is missing, a model that does not load, a sensor
that can't connect) is recorded as a :class:`~agent.planning.Problem` and left out; the
rest runs.

A pipeline whose first stage is an installed bundle with a candidate in its shadow slot
also gets that candidate in the pool (``<pipeline>#shadow``) and a shadow thread
(:mod:`agent.shadow`); a candidate that does not load is a problem of its own and never
takes the live pipeline down. A reload notices a candidate appearing, going or changing.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.capture import Camera
from agent.config import AgentConfig, PipelineConfig
from agent.kernel.errors import EdgefleetError
from agent.metrics import AgentMetrics
from agent.pipeline.runner import MAX_IN_FLIGHT, Decision, PipelineRunner, Stage
from agent.planning import Plan, Problem, Resolver, config_bundles, plan_pipelines
from agent.sensors import SensorSource, make_sensor
from agent.shadow.loading import (
    SHADOW_PROBLEM,
    SHADOW_QUEUE_BOUND,
    ShadowPlan,
    ShadowRef,
    ShadowResolver,
    installed_shadows,
    plan_shadow,
    shadow_ref,
)
from agent.shadow.runner import ShadowRunner
from agent.shadow.sampler import Sampler
from agent.shadow.stats import ShadowKey, ShadowStats, health_summary
from agent.shadow.store import ShadowStore
from agent.wire.quality import ShadowSummary
from runtime import EdgeRuntimeError, ModelConfig, ModelLoadError, PoolConfig, WorkerPool
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
        wrap_source: Callable[[str, Camera], Any] | None = None,
    ) -> None:
        self.config = config
        self.resolve = resolve
        self.metrics = metrics
        self.problems = problems
        self._emit = emit
        self._on_reload = on_reload
        self._wrap_source = wrap_source
        """(pipeline, camera) -> the source the pipeline reads instead of the camera (a
        station's triggered source), or None for the camera itself."""
        self._config_hash = config.digest()
        self.cameras: dict[str, Camera] = {}
        self.sensors: dict[str, SensorSource] = {}
        self.runners: list[PipelineRunner] = []
        self.pool: WorkerPool | None = None
        self.shadow_resolve: ShadowResolver = installed_shadows(config)
        """Where each pipeline's candidate is (default: its installed bundle's shadow
        slot); a bench or test may point it elsewhere before :meth:`start`."""
        self.shadows: dict[str, ShadowRunner] = {}
        """The running shadow of each pipeline that has one."""
        self.shadow_stats: dict[ShadowKey, ShadowStats] = {}
        """Every candidate's totals since this agent started (kept across reloads)."""
        self._loaded: dict[str, tuple[list[Path], ShadowRef | None]] = {}
        self._shadow_plans: dict[str, ShadowPlan] = {}
        self._delivered_at_start: dict[str, int] = {}
        """Per pipeline: what its source had delivered when its runner started (the
        switch, after a reload), for :meth:`bundle_health`."""
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
        self._shadow_plans = self._plan_shadows(plans)
        plans = self._start_pool(plans)
        self._start_sources({pl.config.source for pl in plans})
        for plan in plans:
            self._start_runner(plan)

    def reload_if_changed(self) -> bool:
        """Reload when a pipeline's bundles now resolve to other directories, or its
        shadow candidate appeared, went or changed (its slot or its manifest)."""
        wanted: dict[str, tuple[list[Path], ShadowRef | None]] = {}
        for p in self.config.pipelines:
            try:
                paths = (self.resolve or config_bundles)(p)
            except EdgefleetError:
                paths = []
            wanted[p.name] = (paths, self._shadow_ref(p))
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
            self._stop_shadows(2.0)
            self._loaded = {}
            self._on_reload()
            if self.pool is not None:
                self.pool.close()
                self.pool = None
            self.problems[:] = [
                p
                for p in self.problems
                if not p.part.startswith((PIPELINE_PROBLEM, SHADOW_PROBLEM))
            ]
            self._start_all()

    def bundle_health(self, bundle: str) -> Mapping[str, float]:
        """Worker restarts, inference errors, inferences and inference p95 of the
        pipelines that run ``bundle`` (the health probe of a bundle on trial), the inputs
        their sources delivered and the pipelines that decided none of them: every
        counter since the pipelines (and their pool) started, i.e. since the switch.

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
        delivered = {
            r.name: max(0, _delivered(r.source) - self._delivered_at_start.get(r.name, 0))
            for r in runners
        }
        return {
            "worker_crashes": float(pool.restarts()),
            "inference_errors": float(sum(r.stats.errors for r in runners)),
            "p95_ms": p95,
            "inferences": float(sum(r.stats.decided for r in runners)),
            "frames": float(sum(delivered.values())),
            "pipelines_without_inference": float(
                sum(1 for r in runners if delivered[r.name] and not r.stats.decided)
            ),
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
        self._stop_shadows(max(0.1, min(2.0, deadline - time.monotonic())))

    def shadow_summary(self) -> ShadowSummary | None:
        """The health report's ``shadow``: the totals of the candidate running now (pooled
        over the pipelines that run it), None when no candidate runs."""
        running = {r.key for r in self.shadows.values()}
        return health_summary(s for k, s in self.shadow_stats.items() if k in running)

    def shadow_counters(self) -> dict[str, dict[str, int]]:
        """Per pipeline with a shadow: frames offered, sampled, compared, agreed, skipped
        (busy pool, shadow still busy), errors."""
        out: dict[str, dict[str, int]] = {}
        for name, sh in self.shadows.items():
            c = sh.counts
            out[name] = {
                "offered": sh.sampler.offered,
                "sampled": sh.sampler.sampled,
                "compared": c.compared,
                "agreed": c.agreed,
                "skipped_busy": c.skipped_busy,
                "skipped_behind": c.skipped_behind,
                "errors": c.errors,
            }
        return out

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
            shadows = self._shadow_models(plans, models)
            pool: WorkerPool | None = None
            try:
                pool = WorkerPool(models, pool_cfg)
                pool.start()
            except ModelLoadError as e:
                if pool is not None:
                    pool.close()
                shadow = next((sp for sp in shadows if sp.model_path == e.path), None)
                if shadow is not None:  # the candidate's fault: the live pipelines go on
                    self._shadow_failed(shadow.pipeline, str(e))
                    continue
                bad = [pl for pl in plans if any(str(b.model_file()) == e.path for b in pl.bundles)]
                if not bad:
                    raise
                for pl in bad:
                    self.problems.append(Problem(f"{PIPELINE_PROBLEM}{pl.config.name}", str(e)))
                    log.error("pipeline %s not started: %s", pl.config.name, e)  # noqa: TRY400
                plans = [pl for pl in plans if pl not in bad]
                continue
            except EdgeRuntimeError as e:
                if pool is not None:
                    pool.close()
                if not shadows:
                    raise
                for sp in shadows:  # which one is unknown: the live pipelines go first
                    self._shadow_failed(sp.pipeline, f"the pool did not start with it: {e}")
                continue
            if pool is not None:
                self.pool = pool
            return plans
        return plans

    # -- shadows -------------------------------------------------------------------------
    def _shadow_models(self, plans: list[Plan], models: list[ModelConfig]) -> list[ShadowPlan]:
        """Add the candidates of ``plans`` to ``models``; the ones added."""
        live = {pl.config.name for pl in plans}
        added: list[ShadowPlan] = []
        for sp in list(self._shadow_plans.values()):
            if sp.pipeline not in live:
                continue
            try:
                models.append(sp.bundle.model_config(sp.model, queue_bound=SHADOW_QUEUE_BOUND))
            except EdgefleetError as e:
                self._shadow_failed(sp.pipeline, str(e))
                continue
            added.append(sp)
        return added

    def _shadow_ref(self, p: PipelineConfig) -> ShadowRef | None:
        try:
            return shadow_ref(self.shadow_resolve(p))
        except (OSError, EdgefleetError):
            return None

    def _plan_shadows(self, plans: list[Plan]) -> dict[str, ShadowPlan]:
        """Each planned pipeline's candidate, loaded and checked; one that fails is a
        problem (``shadow <pipeline>``) and its pipeline runs without a shadow."""
        out: dict[str, ShadowPlan] = {}
        profile = load_profile(self.config.agent.profile).name
        for plan in plans:
            name = plan.config.name
            try:
                path = self.shadow_resolve(plan.config)
                if path is None:
                    continue
                out[name] = plan_shadow(name, path, plan.bundles[0], profile)
            except (OSError, EdgefleetError) as e:
                self._shadow_failed(name, str(e))
        return out

    def _shadow_failed(self, pipeline: str, reason: str) -> None:
        self._shadow_plans.pop(pipeline, None)
        self.problems.append(Problem(f"{SHADOW_PROBLEM}{pipeline}", reason))
        log.error("shadow of pipeline %s not started: %s", pipeline, reason)

    def _stats_for(self, key: ShadowKey, store: ShadowStore) -> ShadowStats:
        """The candidate's totals: kept since this agent started, seeded once from the
        comparisons already in the decision log."""
        stats = self.shadow_stats.get(key)
        if stats is None:
            stats = ShadowStats(key)
            stats.seed(store.seed_rows(key))
            self.shadow_stats[key] = stats
        return stats

    def _start_shadow(self, runner: PipelineRunner) -> None:
        """Give ``runner`` its shadow, when its candidate loaded (a failure here is the
        shadow's problem; the runner starts without it)."""
        sp = self._shadow_plans.get(runner.name)
        if sp is None or self.pool is None:
            return
        cfg = self.config
        try:
            candidate = Stage.build(sp.bundle, sp.model, self.pool)
            store = ShadowStore(cfg.agent.state_dir, cfg.decision_log)
        except (OSError, sqlite3.Error, EdgefleetError) as e:
            self._shadow_failed(runner.name, str(e))
            return
        try:
            stats = self._stats_for(sp.key, store)
        except sqlite3.Error as e:
            store.close()
            self._shadow_failed(runner.name, f"reading its stored results: {e}")
            return
        shadow = ShadowRunner(
            runner.name,
            pool=self.pool,
            candidate=candidate,
            live_stages=runner.stages,
            policy=runner.policy,
            key=sp.key,
            stats=stats,
            store=store,
            sampler=Sampler(cfg.shadow.sample, cfg.shadow.max_fps),
            iou_threshold=cfg.shadow.iou_threshold,
            wait_timeout_s=runner.wait_timeout_s,
        )
        self.shadows[runner.name] = shadow
        runner.shadow = shadow.offer
        shadow.start()

    def _stop_shadows(self, timeout_s: float) -> None:
        for sh in self.shadows.values():
            sh.stop()
        deadline = time.monotonic() + timeout_s
        for name, sh in self.shadows.items():
            if not sh.join(max(0.0, deadline - time.monotonic())):
                log.warning("the shadow of pipeline %s did not stop in time", name)
        self.shadows = {}

    def _start_sources(self, used: set[str]) -> None:
        video = load_profile(self.config.agent.profile).video
        for cam_cfg in self.config.cameras:
            if cam_cfg.name in used and cam_cfg.name not in self.cameras:
                cam = Camera(cam_cfg, on_state=self._camera_state, video=video)
                self.cameras[cam_cfg.name] = cam
                cam.start()
        for sensor_cfg in self.config.sensors:
            if sensor_cfg.name in used and sensor_cfg.name not in self.sensors:
                try:
                    links = {link.name: link for link in self.config.plc}
                    sensor = make_sensor(sensor_cfg, self.config.mqtt, links)
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
        camera = source if isinstance(source, Camera) else None
        reads = source
        if camera is not None and self._wrap_source is not None:
            reads = self._wrap_source(name, camera) or source
        runner = PipelineRunner(
            name,
            source_name=plan.config.source,
            line=plan.line,
            source=reads,
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
        self._delivered_at_start[name] = _delivered(source)
        self._loaded[name] = ([b.path for b in plan.bundles], self._shadow_ref(plan.config))
        self._start_shadow(runner)
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


def _delivered(source: object) -> int:
    """Inputs a source has delivered so far: a camera's frames, a sensor's windows."""
    if isinstance(source, Camera):
        return source.stats().frames_captured
    if isinstance(source, SensorSource):
        windows = source.stats().get("windows", 0)
        return windows if isinstance(windows, int) and not isinstance(windows, bool) else 0
    return 0
