"""What the running agent says about itself: its part of the fleet's ``Health`` report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.capture import Camera
from runtime import WorkerPool


def agent_health(
    cameras: Mapping[str, Camera], pool: WorkerPool | None, outcome_counts: Mapping[str, int]
) -> dict[str, Any]:
    """The agent's part of a ``Health`` report: fps and drops per camera, inference
    latency percentiles and queue depth per model (the worker pool's histograms), worker
    restarts and decisions by outcome since the bundles were loaded."""
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
    }
