"""``edge-agent bench``: the whole hot path (capture -> pool -> post-processing -> policy
-> decision log) on the real pool, with the bare runtime on the same model measured in
the same run.

Steps: (1) bare runtime: one in-process session runs the preprocessed first frame in a
tight loop; (2) capacity: the agent with the camera unpaced, decisions per second;
(3) load: the camera paced at ``load`` x capacity, end-to-end latency from each frame's
capture timestamp to its decision being queued to the log writer (the hot path never
waits for the disk; the writer commits in batches).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from agent.app import Agent
from agent.config import parse_config
from agent.errors import AgentError
from agent.kernel.bundle import load_bundle
from agent.pipeline.runner import Decision
from runtime.bench import Progress, measure_bare
from runtime.metrics import new_histogram, summarize
from runtime.preprocess import Preprocessor

CALIBRATE_S = 3.0
MAX_FPS = 1000.0


def _first_frame(video: str) -> np.ndarray:
    cap = cv2.VideoCapture(video)
    try:
        ok, frame = cap.read()
    finally:
        cap.release()
    if not ok or frame is None:
        raise AgentError(f"bench source {video}: no frame could be read")
    return np.asarray(frame)


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def _agent_config(bundle: Path, video: str, fps: float, state: Path, workers: int | None) -> Any:
    runtime: dict[str, Any] = {"heartbeat_timeout_s": 5.0}
    if workers:
        runtime["workers"] = workers
    return parse_config(
        {
            "agent": {"device_id": "bench", "state_dir": str(state), "log_level": "warning"},
            "runtime": runtime,
            "decision_log": {"thumbnails": "none"},
            "cameras": [{"name": "bench", "kind": "file", "uri": video, "fps": fps, "loop": True}],
            "pipelines": [{"name": "bench", "source": "bench", "bundle": str(bundle)}],
        }
    )


def _run(cfg: Any, duration_s: float, label: str, progress: bool) -> dict[str, Any]:
    hist = new_histogram()
    lock = threading.Lock()
    counted = [0]

    def on_decision(d: Decision, _id: str) -> None:
        e2e_us = max(1, (time.perf_counter_ns() - d.t_capture_ns) // 1000)
        with lock:
            hist.record_value(e2e_us)
            counted[0] += 1

    agent = Agent(cfg, on_decision=on_decision, http=False)
    t_start = time.monotonic()
    agent.start()
    if agent.problems:
        agent.stop()
        raise AgentError("; ".join(f"{p.part}: {p.reason}" for p in agent.problems))
    bar = Progress(label, duration_s, progress)
    # Leave warm-up out: wait for the first decision, then measure from zero.
    deadline = time.monotonic() + 60
    while agent.first_decision_at is None and time.monotonic() < deadline:
        time.sleep(0.01)
    cold_start_s = (agent.first_decision_at or time.monotonic()) - t_start
    time.sleep(0.5)
    with lock:
        hist.reset()
        counted[0] = 0
    cam = agent.cameras["bench"]
    c0 = cam.stats()
    t0 = time.monotonic()
    while (elapsed := time.monotonic() - t0) < duration_s:
        time.sleep(0.1)
        bar.update(elapsed, f"{counted[0]} decisions")
    bar.done()
    elapsed = time.monotonic() - t0
    c1 = cam.stats()
    pids = [os.getpid(), *(p for p in (agent.pool.worker_pids() if agent.pool else []) if p)]
    rss = _rss_mb(pids)
    parent_rss = _rss_mb([os.getpid()])
    agent.stop()
    log_stats = agent.log.stats()
    with lock:
        e2e = summarize(hist)
        decisions = counted[0]
    return {
        "e2e": e2e,
        "decisions": decisions,
        "rate": decisions / elapsed,
        "frames_captured": c1.frames_captured - c0.frames_captured,
        "frames_dropped": c1.frames_dropped - c0.frames_dropped,
        "decisions_logged": int(log_stats.get("written", 0)),
        "rss_mb": rss,
        "parent_rss_mb": parent_rss,
        "cold_start_s": cold_start_s,
    }


def run_agent_bench(
    bundle_dir: Path,
    video: str,
    *,
    duration_s: float = 10.0,
    load: float = 0.6,
    workers: int | None = None,
    state_dir: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Measure bare runtime, capacity, then the hot path at ``load`` x capacity."""
    if not Path(video).is_file():
        raise AgentError(f"bench source {video}: no such file")
    bundle = load_bundle(bundle_dir)
    manifest = bundle.manifest
    frame = _first_frame(video)
    mc = bundle.model_config("bare")
    if mc.preprocess is None:
        raise AgentError(f"bench needs an image model; {bundle_dir} has no preprocess")
    shape = next(iter(mc.input_shapes.values()))
    pre = Preprocessor(mc.preprocess, shape, manifest.input.dtype)
    tensor = np.empty(shape, pre.dtype)
    pre.run(frame, tensor)
    bare = measure_bare(
        str(bundle.model_file()), [tensor], duration_s=min(5.0, duration_s), progress=progress
    )
    with tempfile.TemporaryDirectory(prefix="edge-agent-bench-") as tmp:
        state = state_dir or Path(tmp)
        cal = _run(
            _agent_config(bundle_dir, video, MAX_FPS, state / "cal", workers),
            CALIBRATE_S,
            "capacity (unpaced camera)",
            progress,
        )
        capacity = cal["rate"]
        fps = max(1.0, load * capacity)
        run = _run(
            _agent_config(bundle_dir, video, fps, state / "load", workers),
            duration_s,
            f"hot path at {load:.0%} of capacity ({fps:.0f} fps)",
            progress,
        )
    e2e = run["e2e"]
    return {
        "model": manifest.name,
        "model_version": manifest.version,
        "source": video,
        "frame_shape": list(frame.shape),
        "load": load,
        "capacity_fps": round(capacity, 1),
        "offered_fps": round(fps, 1),
        "decisions_per_s": round(run["rate"], 1),
        "e2e_p50_ms": e2e["p50_ms"],
        "e2e_p99_ms": e2e["p99_ms"],
        "e2e_p999_ms": e2e["p999_ms"],
        "bare_p50_ms": bare.latency["p50_ms"],
        "bare_p99_ms": bare.latency["p99_ms"],
        "e2e_p99_over_bare_p99_ms": round(e2e["p99_ms"] - bare.latency["p99_ms"], 3),
        "frames_captured": run["frames_captured"],
        "frames_dropped": run["frames_dropped"],
        "decisions_logged": run["decisions_logged"],
        "rss_mb": round(run["rss_mb"], 1),
        "parent_rss_mb": round(run["parent_rss_mb"], 1),
        "cold_start_to_first_decision_s": round(cal["cold_start_s"], 3),
    }


def format_report(r: dict[str, Any]) -> str:
    target = r["bare_p99_ms"] + 2.0
    met = "met" if r["e2e_p99_ms"] <= target else "NOT met"
    return "\n".join(
        [
            f"model {r['model']} {r['model_version']}, frames {r['frame_shape']}",
            f"bare runtime         p50 {r['bare_p50_ms']:.3f} ms  p99 {r['bare_p99_ms']:.3f} ms",
            f"capacity             {r['capacity_fps']:.1f} decisions/s (unpaced camera)",
            f"at {r['load']:.0%} ({r['offered_fps']:.0f} fps)  e2e p50 {r['e2e_p50_ms']:.3f} ms  "
            f"p99 {r['e2e_p99_ms']:.3f} ms  (target <= bare p99 + 2 ms = {target:.3f}: {met})",
            f"frames captured {r['frames_captured']}, dropped {r['frames_dropped']}, "
            f"decisions logged {r['decisions_logged']}",
            f"RSS {r['rss_mb']:.0f} MB (agent {r['parent_rss_mb']:.0f} MB + workers), "
            f"cold start to first decision {r['cold_start_to_first_decision_s']:.2f} s",
        ]
    )
