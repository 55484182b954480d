"""What the running agent says about itself: liveness and readiness (/healthz, /readyz),
its stats, the metrics' gauges (refreshed by a thread of their own), and its part of the
fleet's ``Health`` report."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from agent.actions.dispatcher import ActionDispatcher
from agent.capture import Camera
from agent.capture.camera import CameraStats
from agent.decisionlog import DecisionLog
from agent.metrics import AgentMetrics
from agent.pipelines import Pipelines
from agent.planning import Problem
from agent.sensors import SensorSource
from agent.upstream import Upstream
from agent.wire.quality import ShadowSummary
from runtime import WorkerPool

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 1.0


def hotpath_liveness(
    pipelines: Pipelines, decision_log: DecisionLog, *, configured: bool
) -> tuple[bool, dict[str, Any]]:
    """The hot path is alive: the pool has workers, the decision log writer runs (with
    no pipeline configured, alive anyway) and no running pipeline's loop is wedged
    (``pipelines``: each one's heartbeat, see :func:`pipeline_liveness`)."""
    pool = pipelines.pool
    pool_ok = pool is not None and pool.degraded is None
    loops = pipeline_liveness(pipelines)
    details: dict[str, Any] = {
        "pool": "ok" if pool_ok else (pool.degraded if pool else "not started"),
        "decision_log": decision_log.stats(),
        "problems": problem_lines(pipelines.problems),
        "sensors": {n: sensor_health(s) for n, s in pipelines.sensors.items()},
        "pipelines": loops,
        "cameras": {n: camera_health(c.stats()) for n, c in pipelines.cameras.items()},
    }
    wedged = any(loop["wedged"] for loop in loops.values())
    return (pool_ok or not configured) and not wedged, details


def camera_health(s: CameraStats) -> dict[str, Any]:
    """A camera on /healthz: up; ``failure``, the reason word it is down for now ("" while
    it delivers frames); ``last_failure``, the last one with when and why, kept
    after it recovered (null if it never failed); the failures by reason; and (RTSP) the
    decoder that runs and the ones passed over, with why; and the damage its decoder
    reported (lost packets, decode errors, concealed, damaged and skipped frames, and
    whether it is counted at all); and a GenICam camera's own counters (``genicam``:
    :meth:`agent.capture.genicam.source.GenicamState.snapshot`). A camera that is down
    does not make the agent unhealthy (it is reopened; /readyz says not ready)."""
    last = None
    if s.last_failure:
        at = datetime.fromtimestamp(s.last_failure_at, timezone.utc).isoformat(timespec="seconds")
        last = {"reason": s.last_failure, "at": at, "error": s.last_error}
    health: dict[str, Any] = {
        "up": s.up,
        "failure": s.failure,
        "last_failure": last,
        "failures": dict(s.failures),
        "decoder": s.decoder,
        "decoders_passed_over": dict(s.decoders_passed_over),
        "damage": dataclasses.asdict(s.damage),
    }
    if s.genicam:
        health["genicam"] = dict(s.genicam)
    return health


def pipeline_liveness(pipelines: Pipelines) -> dict[str, dict[str, Any]]:
    """Each running pipeline's loop heartbeat (:meth:`PipelineRunner.liveness`): what the
    supervisor pets systemd's watchdog by. An idle source still beats; a loop stuck on a
    worker or dead does not."""
    return {r.name: r.liveness() for r in list(pipelines.runners)}


def upstream_health(upstream: Upstream) -> dict[str, Any]:
    """The companion's part of /healthz: the last install, the uplink and its outbox."""
    details: dict[str, Any] = {}
    if upstream.updates is not None:
        reports = upstream.updates.reports
        last = reports[-1] if reports else None
        details["last_install"] = last
        details["stale"] = bool(last and last.get("stale"))
    if upstream.uplink is not None:
        up = upstream.uplink.stats()
        box = up["outbox"]
        details["uplink"] = {"connected": bool(up["connected"]), "last_error": up["last_error"]}
        details["outbox"] = {
            "pending": box["pending"],
            "bytes": box["bytes"],
            "dropped": box["dropped"],
            "dropping": box["dropping"],
        }
    return details


def readiness(pipelines: Pipelines) -> tuple[bool, dict[str, Any]]:
    """Ready: every started pipeline runs and every camera delivers; a camera that is
    down is named with the reason word of its last failure (``camera_failures``)."""
    cams = {n: c.up for n, c in pipelines.cameras.items()}
    sensors = {n: s.up and not s.stats().get("silent", False) for n, s in pipelines.sensors.items()}
    pool = pipelines.pool
    ok = (
        bool(pipelines.runners)
        and all(cams.values())
        and all(sensors.values())
        and (pool is not None and pool.ready_workers() > 0)
    )
    down = {n: c.stats().failure or "unknown" for n, c in pipelines.cameras.items() if not c.up}
    return ok, {
        "cameras": cams,
        "camera_failures": down,
        "sensors": sensors,
        "pipelines": [r.name for r in pipelines.runners],
    }


def agent_stats(
    pipelines: Pipelines, decision_log: DecisionLog, dispatcher: ActionDispatcher
) -> dict[str, Any]:
    """Everything at once (``edge-agent run --stats``)."""
    shadow = pipelines.shadow_summary()
    return {
        "pipelines": {r.name: vars(r.stats) for r in pipelines.runners},
        "shadows": pipelines.shadow_counters(),
        "shadow": shadow.model_dump(mode="json") if shadow is not None else None,
        "cameras": {n: dataclasses.asdict(c.stats()) for n, c in pipelines.cameras.items()},
        "decision_log": decision_log.stats(),
        "actions": dispatcher.stats(),
        "problems": problem_lines(pipelines.problems),
    }


def update_camera_metrics(m: AgentMetrics, name: str, s: CameraStats) -> None:
    """Set camera ``name``'s metrics from its stats: up, fps, frames, drops, reopens,
    failures by reason word, (where its decoder reports it) damage, and a GenICam
    camera's resent packets, missed triggers and clock error."""
    m.camera_up.labels(camera=name).set(1 if s.up else 0)
    m.fps.labels(camera=name).set(s.fps_measured)
    m.set_counter(m.frames, s.frames_captured, camera=name)
    m.set_counter(m.frames_dropped, s.frames_dropped, camera=name)
    m.set_counter(m.camera_reopens, s.reopens, camera=name)
    for reason, count in s.failures.items():
        m.set_counter(m.camera_failures, count, camera=name, reason=reason)
    g = s.genicam
    if g:
        m.set_counter(m.camera_resent_packets, g["resent_packets"], camera=name)
        m.set_counter(m.camera_missed_triggers, g["missed_triggers"], camera=name)
        m.camera_clock_error.labels(camera=name).set(g["clock"]["error_us"] / 1e6)
    d = s.damage
    if d.counted or d.damaged_frames:
        m.set_counter(m.camera_lost_packets, d.lost_packets, camera=name)
        m.set_counter(m.camera_decode_errors, d.decode_errors, camera=name)
        m.set_counter(m.camera_concealed_frames, d.concealed_frames, camera=name)
        kept = d.damaged_frames - d.skipped_frames
        m.set_counter(m.camera_damaged_frames, kept, camera=name, action="kept")
        m.set_counter(m.camera_damaged_frames, d.skipped_frames, camera=name, action="skipped")


def update_hotpath_gauges(
    metrics: AgentMetrics, pipelines: Pipelines, decision_log: DecisionLog
) -> None:
    """Set the hot path's metrics that are read from its parts rather than counted as
    things happen."""
    m = metrics
    for name, cam in pipelines.cameras.items():
        update_camera_metrics(m, name, cam.stats())
    for name, sensor in pipelines.sensors.items():
        m.update_sensor(name, sensor.stats())
    m.update_decision_log(decision_log.stats())
    pool = pipelines.pool
    if pool is not None:
        for info in pool.models:
            m.queue_depth.labels(queue=info.name).set(pool.queued(info.name))
    for name, counts in pipelines.shadow_counters().items():
        m.update_shadow(name, counts)


def update_upstream_gauges(metrics: AgentMetrics, upstream: Upstream) -> None:
    """Set the companion's metrics read from the uplink."""
    if upstream.uplink is not None:
        metrics.update_uplink(upstream.uplink.stats())


class GaugeThread:
    """Calls ``update`` every :data:`STATS_INTERVAL_S` on a thread of its own until
    stopped; an error is logged and the next round runs."""

    def __init__(self, update: Callable[[], None], stop: threading.Event) -> None:
        self._update = update
        self._stop = stop
        self._thread = threading.Thread(target=self._loop, name="agent-stats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(STATS_INTERVAL_S):
            try:
                self._update()
            except Exception:  # metrics must never take the agent down; log and go on
                log.exception("updating metrics failed")


def problem_lines(problems: list[Problem]) -> list[str]:
    return [f"{p.part}: {p.reason}" for p in problems]


def sensor_health(sensor: SensorSource) -> dict[str, Any]:
    """A sensor on /healthz: up, and for an MQTT sensor its thread and its silence."""
    st = sensor.stats()
    keys = ("up", "silent", "silent_s", "thread_alive", "thread_restarts", "callback_errors")
    return {k: st[k] for k in keys if k in st} | {"last_error": st.get("last_error", "")}


STATION_COUNTS = ("triggers", "deadline_missed", "overruns")


def station_counts(line_stats: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Each station's counts for the fleet's ``Health.stations`` (from the line's stats;
    the fleet's alerts watch them rise)."""
    out: dict[str, dict[str, int]] = {}
    stations = line_stats.get("stations")
    for name, stats in stations.items() if isinstance(stations, Mapping) else ():
        if isinstance(stats, Mapping):
            out[str(name)] = {
                k: int(v) for k in STATION_COUNTS if isinstance(v := stats.get(k), int)
            }
    return out


def agent_health(
    cameras: Mapping[str, Camera],
    pool: WorkerPool | None,
    outcome_counts: Mapping[str, int],
    shadow: ShadowSummary | None = None,
) -> dict[str, Any]:
    """The agent's part of a ``Health`` report: fps and drops per camera, inference
    latency percentiles and queue depth per model (the worker pool's histograms), worker
    restarts and decisions by outcome since the bundles were loaded, and the shadow
    candidate's comparison (``Health.shadow``) while one runs."""
    fps: dict[str, float] = {}
    drops: dict[str, int] = {}
    for name, cam in cameras.items():
        s = cam.stats()
        fps[name] = max(0.0, float(s.fps_measured))
        drops[name] = int(s.frames_dropped)
    latency: dict[str, dict[str, float]] = {}
    queues: dict[str, int] = {}
    if pool is not None:
        for model, snap in pool.stats()["models"].items():
            total = snap["stages"]["inference"]  # the model, as its latency budget means
            latency[model] = {
                "p50": total.get("p50_ms", 0.0),
                "p95": total.get("p95_ms", 0.0),
                "p99": total.get("p99_ms", 0.0),
                "count": int(total.get("count", 0)),
            }
            queues[model] = pool.queued(model)
    return {
        "fps": fps,
        "drops": drops,
        "latency_ms": latency,
        "queue_depth": queues,
        # read by the fleet's rollout gates (the health message keeps extra fields)
        "worker_crashes": pool.restarts() if pool is not None else 0,
        "outcome_counts": dict(outcome_counts),
        "shadow": shadow.model_dump(mode="json") if shadow is not None else None,
    }
