"""What the running agent tells the fleet about itself: the reported state (which
bundle it runs, which it ran before) and its part of a health report."""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.app import Agent


def agent_version() -> str:
    try:
        return metadata.version("edgefleet")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def reported_state(agent: Agent, labels: dict[str, str]) -> dict[str, Any]:
    """``ReportedState`` fields besides device id, time and online."""
    out: dict[str, Any] = {
        "agent_version": agent_version(),
        "profile": agent.profile_name,
        "labels": labels,
    }
    if agent.installer is None:
        return out
    for slot in agent.installer.status():
        if slot.bundle is None:
            continue
        ref = {
            "name": slot.name,
            "version": slot.bundle.version,
            "release": slot.bundle.release,
            "digest": slot.bundle.digest,
        }
        if slot.active and "active" not in out:
            out["active"] = ref
        elif slot.state == "previous" and "previous" not in out:
            out["previous"] = ref
    return out


def agent_health(agent: Agent) -> dict[str, Any]:
    """The agent's part of a ``Health`` report: fps and drops per camera, inference
    latency percentiles and queue depth per model (the worker pool's histograms), worker
    restarts and decisions by outcome since the bundles were loaded."""
    fps: dict[str, float] = {}
    drops: dict[str, int] = {}
    for name, cam in agent.cameras.items():
        s = cam.stats()
        fps[name] = max(0.0, float(s.fps_measured))
        drops[name] = int(s.frames_dropped)
    latency: dict[str, dict[str, float]] = {}
    queues: dict[str, int] = {}
    pool = agent.pool
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
        "outcome_counts": dict(agent.outcome_counts),
    }
