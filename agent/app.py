"""The agent process: wires config, capture, the runtime pool, pipelines, the decision log,
actions and the local HTTP endpoint together, and takes them down in order.

A part that can't start (a bundle that is missing, a model that does not load) is reported
and left out; the rest of the agent runs. Shutdown order: stop capture, let pipelines
finish the frame in flight, stop actions, flush the decision log, stop the pool.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.actions.dispatcher import ActionDispatcher, ActionEvent
from agent.capture import Camera
from agent.config import AgentConfig
from agent.decisionlog import DecisionLog
from agent.directives.report import reported_state
from agent.directives.service import DirectivesService
from agent.enrollment.identity import Identity
from agent.http import LocalHttpServer
from agent.installer import Installer
from agent.kernel.errors import EdgefleetError
from agent.metrics import AgentMetrics
from agent.pipeline.runner import Decision, PipelineRunner, Stage
from agent.planning import (
    Plan,
    Problem,
    Resolver,
    config_bundles,
    installed_resolver,
    plan_pipelines,
)
from agent.sensors import SensorSource, make_sensor
from agent.status import agent_health
from agent.uplink.service import Uplink
from agent.uplink.sysinfo import SysInfo
from runtime import ModelConfig, ModelLoadError, PoolConfig, WorkerPool
from runtime.profiles import load_profile

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 1.0
ALARM_EVENT_INTERVAL_S = 60.0
"""An alarm of one kind reaches the fleet as an event at most this often (a full disk
raises one per failed write)."""


class Agent:
    """The running agent. ``start()``, then ``stop()`` (or use it as a context manager)."""

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
        self.on_decision = on_decision
        self.problems: list[Problem] = []
        self.cameras: dict[str, Camera] = {}
        self.sensors: dict[str, SensorSource] = {}
        self.runners: list[PipelineRunner] = []
        self.pool: WorkerPool | None = None
        self.http: LocalHttpServer | None = None
        self._want_http = http
        self._config_hash = config.digest()
        self.state_dir = config.agent.state_dir
        self.log = DecisionLog(
            self.state_dir,
            config.decision_log,
            device_id=config.agent.device_id,
            on_alarm=self._alarm,
        )
        self.dispatcher = ActionDispatcher(
            config.actions.actions,
            config.mqtt,
            queue_bound=config.actions.queue_bound,
            metrics=self.metrics,
        )
        self.installer: Installer | None = None
        self.updates: DirectivesService | None = None
        self.profile_name = load_profile(config.agent.profile).name
        if resolve is None and config.uses_installer():
            self.installer = Installer(
                self.state_dir, profile_name=self.profile_name, config=config.bundles.installer
            )
            resolve = installed_resolver(self.installer)
        self.resolve: Resolver | None = resolve
        self.identity: Identity | None = None
        self.uplink: Uplink | None = None
        self._alarm_lock = threading.Lock()
        self._alarm_sent: dict[str, tuple[float | None, int]] = {}
        self._loaded: dict[str, list[Path]] = {}
        self._reload_lock = threading.Lock()
        self.outcome_counts: dict[str, int] = {}
        """Decisions by outcome since the bundles were last (re)loaded, for the fleet's
        outcome-shift gate."""
        self._stop = threading.Event()
        self._stats_thread: threading.Thread | None = None
        self.started_at = 0.0
        self.first_decision_at: float | None = None

    @property
    def device_id(self) -> str:
        return self.config.agent.device_id

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> Agent:
        self.started_at = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log.open()
        if self.installer is not None:
            for report in self.installer.recover():
                log.warning("installer recovered: %s", report)
        plans, problems = plan_pipelines(self.config, self.resolve)
        self.problems.extend(problems)
        for p in problems:
            log.error("%s not started: %s", p.part, p.reason)
        plans = self._start_pool(plans)
        self._start_sources({pl.config.source for pl in plans})
        self.dispatcher.start()
        for plan in plans:
            self._start_runner(plan)
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
        self._start_uplink()
        if self.config.bundles.enabled and self.installer is not None:
            bundles = self.config.bundles
            self.updates = DirectivesService(
                self,
                bundles,
                self.installer,
                hardware_class=bundles.hardware_class or self.profile_name,
                identity=self.identity,
                on_report=self._install_report,
            )
            self.updates.start()
        self._stats_thread = threading.Thread(
            target=self._stats_loop, name="agent-stats", daemon=True
        )
        self._stats_thread.start()
        return self

    def _start_uplink(self) -> None:
        """Report to the fleet with the enrolled identity (TLS); without one, say so."""
        cfg = self.config.uplink
        try:
            self.identity = Identity.load(self.state_dir, cfg.identity_dir)
        except EdgefleetError as e:
            self.problems.append(Problem("uplink", f"{e} (enroll again: edge-agent enroll)"))
            return
        if not cfg.enabled:
            return
        if self.identity is None:
            self.problems.append(Problem("uplink", "not enrolled: run edge-agent enroll"))
            return
        labels = dict(self.identity.labels)
        try:
            self.uplink = Uplink(
                self.config.agent.device_id,
                self.identity,
                cfg,
                state=lambda: reported_state(self.profile_name, self.installer, labels),
                health=lambda: agent_health(self.cameras, self.pool, self.outcome_counts),
                decision_log=self.log,
                sysinfo=SysInfo(
                    self.state_dir,
                    pids=lambda: [p for p in (self.pool.worker_pids() if self.pool else []) if p],
                ),
                state_dir=self.state_dir,
                on_alarm=self._count_alarm,
            )
        except EdgefleetError as e:
            self.problems.append(Problem("uplink", str(e)))
            return
        self.uplink.start()

    def _install_report(self, report: dict[str, Any]) -> None:
        if self.uplink is not None:
            try:
                self.uplink.event("install", report)
                self.uplink.publish_state()
            except EdgefleetError as e:
                log.warning("install report not sent: %s", e)

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
            self.outcome_counts = {}
            if self.pool is not None:
                self.pool.close()
                self.pool = None
            self.problems = [p for p in self.problems if not p.part.startswith("pipeline ")]
            plans, problems = plan_pipelines(self.config, self.resolve)
            self.problems.extend(problems)
            for p in problems:
                log.error("%s not started: %s", p.part, p.reason)
            plans = self._start_pool(plans)
            self._start_sources({pl.config.source for pl in plans})
            for plan in plans:
                self._start_runner(plan)

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
                    self.problems.append(Problem(f"pipeline {pl.config.name}", str(e)))
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
                Problem(f"pipeline {plan.config.name}", "its source did not start")
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
        )
        self.runners.append(runner)
        self._loaded[name] = [b.path for b in plan.bundles]
        runner.start()

    def stop(self, timeout_s: float = 4.0) -> None:
        """Stop capture, drain in-flight work, flush the log; bounded by ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        if self.updates is not None:
            self.updates.stop(timeout_s=1.0)
        if self.uplink is not None:
            self.uplink.stop(timeout_s=1.0)
        for cam in self.cameras.values():
            cam.stop(timeout_s=0.5)
        for sensor in self.sensors.values():
            sensor.stop(timeout_s=0.5)
        for r in self.runners:
            r.stop()
        for r in self.runners:
            r.join(max(0.1, min(2.0, deadline - time.monotonic())))
        self.dispatcher.stop(timeout_s=max(0.1, min(1.0, deadline - time.monotonic())))
        self.log.close(timeout_s=max(0.5, deadline - time.monotonic() - 0.5))
        if self.pool is not None:
            self.pool.close(timeout_s=max(0.2, deadline - time.monotonic()))
        if self.http is not None:
            self.http.stop()

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the decision sink -----------------------------------------------------------
    def _emit(self, d: Decision) -> None:
        rec = d.record
        self.outcome_counts[rec.outcome] = self.outcome_counts.get(rec.outcome, 0) + 1
        decision_id = self.log.append(rec)
        e2e_s = (time.perf_counter_ns() - d.t_capture_ns) / 1e9
        self.dispatcher.dispatch(
            ActionEvent(
                decision_id=decision_id,
                outcome=rec.outcome,
                source=rec.source,
                line=rec.line,
                capture_time=rec.capture_time,
                decision_time=rec.decision_time,
                model=rec.model_name,
                model_version=rec.model_version,
                score=d.result.score,
                label=d.result.label,
                summary=rec.outputs,
            )
        )
        pipeline = self._pipeline_of(rec.source)
        m = self.metrics
        m.decisions.labels(pipeline=pipeline, outcome=rec.outcome).inc()
        m.e2e_latency.labels(pipeline=pipeline).observe(e2e_s)
        for stage, ms in rec.latencies_ms.items():
            if stage != "e2e":
                m.stage_latency.labels(pipeline=pipeline, stage=stage).observe(ms / 1000)
        if self.first_decision_at is None:
            self.first_decision_at = time.monotonic()
        if self.on_decision is not None:
            self.on_decision(d, decision_id)

    def _pipeline_of(self, source: str) -> str:
        for r in self.runners:
            if r.source_name == source:
                return r.name
        return source

    def _error_sink(self, pipeline: str) -> Callable[[str, str], None]:
        return lambda reason, message: self._pipeline_error(pipeline, reason, message)

    def _pipeline_error(self, pipeline: str, reason: str, message: str) -> None:
        self.metrics.inference_errors.labels(pipeline=pipeline, reason=reason).inc()
        log.warning("pipeline %s: %s", pipeline, message)

    def _camera_state(self, name: str, up: bool, reason: str) -> None:
        # the camera logs its own transitions; here they become the up/down gauge
        self.metrics.camera_up.labels(camera=name).set(1 if up else 0)

    def _alarm(self, kind: str, message: str) -> None:
        """An alarm of a part (the decision log): counted, logged, and reported to the
        fleet as an ``alarm`` event through the outbox (in order, also when offline), at
        most one per kind every :data:`ALARM_EVENT_INTERVAL_S`; the next one says how
        many were folded into it (``repeated``)."""
        self._count_alarm(kind, message)
        log.error("alarm %s: %s", kind, message)
        uplink = self.uplink
        if uplink is None:
            return
        now = time.monotonic()
        with self._alarm_lock:
            last, folded = self._alarm_sent.get(kind, (None, 0))
            if last is not None and now - last < ALARM_EVENT_INTERVAL_S:
                self._alarm_sent[kind] = (last, folded + 1)
                return
            self._alarm_sent[kind] = (now, 0)
        try:
            uplink.event("alarm", {"alarm": kind, "message": message, "repeated": folded})
        except EdgefleetError as e:
            log.error("alarm %s not queued for the fleet: %s", kind, e)  # noqa: TRY400

    def _count_alarm(self, kind: str, _message: str) -> None:
        self.metrics.alarms.labels(kind=kind).inc()

    # -- status ----------------------------------------------------------------------
    def _stats_loop(self) -> None:
        while not self._stop.wait(STATS_INTERVAL_S):
            try:
                self.update_gauges()
            except Exception:  # metrics must never take the agent down; log and go on
                log.exception("updating metrics failed")

    def update_gauges(self) -> None:
        m = self.metrics
        for name, cam in self.cameras.items():
            s = cam.stats()
            m.camera_up.labels(camera=name).set(1 if s.up else 0)
            m.fps.labels(camera=name).set(s.fps_measured)
            m.set_counter(m.frames, s.frames_captured, camera=name)
            m.set_counter(m.frames_dropped, s.frames_dropped, camera=name)
            m.set_counter(m.camera_reopens, s.reopens, camera=name)
        for name, sensor in self.sensors.items():
            m.update_sensor(name, sensor.stats())
        m.update_decision_log(self.log.stats())
        if self.uplink is not None:
            m.update_uplink(self.uplink.stats())
        if self.pool is not None:
            for info in self.pool.models:
                m.queue_depth.labels(queue=info.name).set(self.pool.queued(info.name))

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Alive: the pool has workers and the decision log writer runs."""
        pool_ok = self.pool is not None and self.pool.degraded is None
        details: dict[str, Any] = {
            "pool": "ok" if pool_ok else (self.pool.degraded if self.pool else "not started"),
            "decision_log": self.log.stats(),
            "problems": [f"{p.part}: {p.reason}" for p in self.problems],
            "sensors": {n: _sensor_health(s) for n, s in self.sensors.items()},
        }
        if self.updates is not None:
            last = self.updates.reports[-1] if self.updates.reports else None
            details["last_install"] = last
            details["stale"] = bool(last and last.get("stale"))
        if self.uplink is not None:
            up = self.uplink.stats()
            box = up["outbox"]
            details["uplink"] = {"connected": bool(up["connected"]), "last_error": up["last_error"]}
            details["outbox"] = {
                "pending": box["pending"],
                "bytes": box["bytes"],
                "dropped": box["dropped"],
                "dropping": box["dropping"],
            }
        return (pool_ok or not self.config.pipelines), details

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """Ready: every started pipeline runs and every camera delivers."""
        cams = {n: c.up for n, c in self.cameras.items()}
        sensors = {n: s.up and not s.stats().get("silent", False) for n, s in self.sensors.items()}
        ok = (
            bool(self.runners)
            and all(cams.values())
            and all(sensors.values())
            and (self.pool is not None and self.pool.ready_workers() > 0)
        )
        return ok, {
            "cameras": cams,
            "sensors": sensors,
            "pipelines": [r.name for r in self.runners],
        }

    def stats(self) -> dict[str, Any]:
        return {
            "pipelines": {r.name: vars(r.stats) for r in self.runners},
            "cameras": {n: dataclasses.asdict(c.stats()) for n, c in self.cameras.items()},
            "decision_log": self.log.stats(),
            "actions": self.dispatcher.stats(),
            "problems": [f"{p.part}: {p.reason}" for p in self.problems],
        }


def _sensor_health(sensor: SensorSource) -> dict[str, Any]:
    """A sensor on /healthz: up, and for an MQTT sensor its thread and its silence."""
    st = sensor.stats()
    keys = ("up", "silent", "silent_s", "thread_alive", "thread_restarts", "callback_errors")
    return {k: st[k] for k in keys if k in st} | {"last_error": st.get("last_error", "")}
