"""``edge-agent bench``: the whole hot path (capture -> pool -> post-processing -> policy
-> decision log) on the real pool, with the bare runtime on the same model measured in
the same run.

Steps: (1) bare runtime: one in-process session runs the preprocessed first frame in a
tight loop; (2) capacity: the agent with the camera offered more than the pool could
serve (:data:`OFFER_OVER_BARE` x workers x bare rps), decisions per second;
(3) load: the camera paced at ``load`` x capacity, end-to-end latency from each frame's
capture timestamp to its decision being queued to the log writer (the hot path never
waits for the disk; the writer commits in batches), and where the time goes (the
pipeline's stage histograms, the pool's own stages); (4) with ``cameras`` > 1: the same
total frame rate spread over that many cameras, one pipeline each, their capacity
unpaced and each camera's latency, drops and starvation; (5) with ``shadow`` (a candidate
bundle): the load of step 3 again with the candidate as each pipeline's shadow on a
``shadow_sample`` share of the frames, and the ratio of the two e2e p99s.

Before all that, step (0): what decoding the source costs (:mod:`agent.benchsource`,
:mod:`agent.decodecost`), measured alone in the process for at most 3 s.

The source is a video file or a live stream (``rtsp://``, ``http://`` MJPEG) opened as the
agent opens a camera (transport; user from ``--username``, password only from the secret
``--password-env``, never in the URL). A stream can't be offered faster than it streams,
so for a live source: the capacity step reads a generated pattern of the stream's frame
size at the over-offer rate (the agent's capacity on frames of that size, not the
stream's); the load step runs the live camera at its own rate (``load`` is then that rate's
share of capacity, ``offered_fps`` the frames the camera captured a second); with
``cameras`` N, N cameras open N sessions on the same URL (N x the stream's rate; no
staggered run: a stream sets its own phase) and the report says whether decoding N streams
kept up.

JSON keys (besides the hot-path ones above: ``capacity_fps``, ``e2e_p50_ms``,
``e2e_p99_ms``, ``bare_p99_ms``, ``frames_captured``, ``frames_dropped``, ``per_camera``,
``stages_ms``, ``rss_mb_by_process``, ...):

- ``source`` (password redacted), ``source_kind`` (file, rtsp, http), ``live``,
  ``transport`` (rtsp only), ``capacity_source`` (file, or the pattern of a stream's size);
- ``frames_decoded``, ``decode_seconds``: the decode measurement's frames and seconds;
- ``decode_ms_p50``, ``decode_ms_p99``, ``decode_ms_basis``: per frame, the wall time of a
  read for a file; the process CPU of a read for a stream (its wall time is mostly the
  wait for the next frame: ``read_ms_p50``);
- ``decode_cpu_per_frame_ms``: process CPU (every decoder thread) per frame;
- ``stream_fps``, ``frame_width``, ``frame_height``: the file's rate, or the stream's
  (1000 / ``read_ms_p50``);
- ``cores``, ``cameras_full_at_stream_fps``, ``cameras_full_at_15fps``: cameras like this
  one whose decoding alone fills every core (``cores x 1000 / (cpu_ms x fps)``);
- with a stream and ``cameras`` > 1: ``cameras_frames_expected`` (the single stream's
  frames a second x the run's seconds), ``cameras_frames_captured`` (per camera),
  ``cameras_decode_kept_up`` (each captured >= 90 % of expected), and
  ``per_camera[name]["frames_expected"]``.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from agent.app import Agent
from agent.benchreport import (
    cameras_section,
    shadow_section,
    staggered_section,
)
from agent.benchsource import BenchSource, measure_source
from agent.config import parse_config
from agent.decodecost import cameras_full
from agent.errors import AgentError
from agent.kernel.bundle import load_bundle
from agent.pipeline.runner import Decision
from agent.shadow.config import MAX_SHADOW_FPS
from runtime.bench import Progress, measure_bare
from runtime.metrics import new_histogram, summarize
from runtime.preprocess import Preprocessor
from runtime.profiles import load_profile

CALIBRATE_S = 3.0
MAX_FPS = 1000.0
OFFER_OVER_BARE = 1.25
"""Capacity is measured with the camera at this many times what the bare runtime could
serve on every worker (capped at :data:`MAX_FPS`): more than the pool can take, without
the capture thread decoding a thousand frames a second that nobody could take (on a
2-core device that decoding would take the workers' CPU and measure the camera, not the
agent)."""
DECODE_S = 3.0
"""Longest decode measurement of the source (before everything else)."""
LIVE_CAP_FPS = 1000.0
"""A live camera's ``fps`` in the bench: a cap above any stream's rate, so that every
frame the stream delivers is published."""
FIRST_FRAME_S = 60.0
"""How long a step waits for every camera's first frame and the first decision."""
FAILED_OPENS = 2
"""A camera that failed this many opens without a frame fails the step at once."""


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _profile_workers() -> int:
    """The pool workers this device's profile gives (no ``--workers``)."""
    return int(load_profile().resolve_workers())


def _camera_names(cameras: int) -> list[str]:
    return ["bench"] if cameras == 1 else [f"cam{i + 1}" for i in range(cameras)]


def _agent_config(
    bundle: Path,
    src: BenchSource,
    fps: float,
    state: Path,
    workers: int | None,
    cameras: int = 1,
    *,
    staggered: bool = False,
    shadow: tuple[float, float] | None = None,
    synthetic: tuple[int, int] | None = None,
) -> Any:
    """The bench's agent config; ``shadow``: (sample, max_fps) of the ``[shadow]``
    section (the candidate itself is given to :func:`_run`); ``synthetic``: (width,
    height) of a generated pattern read instead of ``src`` (a live source's capacity)."""
    runtime: dict[str, Any] = {"heartbeat_timeout_s": 5.0}
    if workers:
        runtime["workers"] = workers
    names = _camera_names(cameras)
    return parse_config(
        {
            "agent": {"device_id": "bench", "state_dir": str(state), "log_level": "warning"},
            "runtime": runtime,
            "decision_log": {"thumbnails": "none"},
            "cameras": [
                _synthetic(n, fps, synthetic)
                if synthetic
                else src.camera(n, fps, i / cameras if staggered else 0.0)
                for i, n in enumerate(names)
            ],
            "pipelines": [{"name": n, "source": n, "bundle": str(bundle)} for n in names],
            "shadow": {"sample": shadow[0], "max_fps": shadow[1]} if shadow else {},
        }
    )


def _synthetic(name: str, fps: float, size: tuple[int, int]) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "synthetic",
        "fps": fps,
        "width": size[0],
        "height": size[1],
        "pattern": "bars",
    }


def _shadow_totals(agent: Agent) -> tuple[int, int]:
    """(compared, skipped) summed over the pipelines' shadows."""
    counts = agent.pipelines.shadow_counters().values()
    compared = sum(c["compared"] for c in counts)
    skipped = sum(c["skipped_busy"] + c["skipped_behind"] for c in counts)
    return compared, skipped


def _failed_cameras(agent: Agent, names: list[str]) -> bool:
    """Whether a camera that never delivered has failed its open twice (a camera that
    serves one client only, a stream gone between two steps): no use waiting longer."""
    return any(
        (st := agent.cameras[n].stats()).errors >= FAILED_OPENS and not st.frames_captured
        for n in names
    )


def _run(
    cfg: Any, duration_s: float, label: str, progress: bool, shadow: Path | None = None
) -> dict[str, Any]:
    names = [c.name for c in cfg.cameras]
    hists = {n: new_histogram() for n in names}
    total = new_histogram()
    lock = threading.Lock()
    counted = dict.fromkeys(names, 0)

    def on_decision(d: Decision, _id: str) -> None:
        e2e_us = max(1, (time.perf_counter_ns() - d.t_capture_ns) // 1000)
        with lock:
            hists[d.record.source].record_value(e2e_us)
            total.record_value(e2e_us)
            counted[d.record.source] += 1

    agent = Agent(cfg, on_decision=on_decision, http=False)
    if shadow is not None:  # every pipeline shadows this candidate
        agent.pipelines.shadow_resolve = lambda _p: shadow
    t_start = time.monotonic()
    agent.start()
    if agent.problems:
        agent.stop()
        raise AgentError("; ".join(f"{p.part}: {p.reason}" for p in agent.problems))
    bar = Progress(label, duration_s, progress)
    # Leave warm-up out: wait for the first decision, then measure from zero.
    deadline = time.monotonic() + FIRST_FRAME_S
    while agent.first_decision_at is None and time.monotonic() < deadline:
        if _failed_cameras(agent, names):
            break
        time.sleep(0.01)
    cold_start_s = (agent.first_decision_at or time.monotonic()) - t_start
    # ...and for every camera's first frame (N streams open one after the other).
    while time.monotonic() < deadline and not all(
        agent.cameras[n].stats().frames_captured for n in names
    ):
        if _failed_cameras(agent, names):
            break
        time.sleep(0.01)
    silent = [n for n in names if not agent.cameras[n].stats().frames_captured]
    if silent or agent.first_decision_at is None:
        why = "; ".join(
            f"camera {n}: {agent.cameras[n].stats().last_error or 'no frame yet'}"
            for n in (silent or names)
        )
        agent.stop()
        raise AgentError(f"{label}: nothing to measure within {FIRST_FRAME_S:g} s ({why})")
    time.sleep(0.5)
    stage_times = [r.measure_stages() for r in agent.runners]
    with lock:
        for h in (*hists.values(), total):
            h.reset()
        counted = dict.fromkeys(names, 0)
    if agent.pool is not None:
        agent.pool.reset_metrics()
    cams = {n: agent.cameras[n] for n in names}
    c0 = {n: c.stats() for n, c in cams.items()}
    s0 = _shadow_totals(agent)
    t0 = time.monotonic()
    while (elapsed := time.monotonic() - t0) < duration_s:
        time.sleep(0.1)
        bar.update(elapsed, f"{sum(counted.values())} decisions")
    bar.done()
    elapsed = time.monotonic() - t0
    c1 = {n: c.stats() for n, c in cams.items()}
    s1 = _shadow_totals(agent)
    with lock:
        per_camera = {
            n: {
                **{k: v for k, v in summarize(hists[n]).items() if k in ("p50_ms", "p99_ms")},
                "decisions_per_s": round(counted[n] / elapsed, 1),
                "frames_captured": c1[n].frames_captured - c0[n].frames_captured,
                "frames_dropped": c1[n].frames_dropped - c0[n].frames_dropped,
                "drop_ratio": round(c1[n].drop_ratio, 3),
                "starved": c1[n].starved,
            }
            for n in names
        }
        e2e = summarize(total)
        decisions = sum(counted.values())
    rss: dict[str, float | None] = {"agent": _rss_mb(os.getpid())}
    for i, pid in enumerate(agent.pool.worker_pids() if agent.pool else []):
        rss[f"worker {i}"] = _rss_mb(pid) if pid else None
    pool_stages = _pool_stages(agent)
    stages = [t.summary() for t in stage_times if t is not None]
    agent.stop()
    log_stats = agent.log.stats()
    return {
        "e2e": e2e,
        "decisions": decisions,
        "rate": decisions / elapsed,
        "per_camera": per_camera,
        "frames_captured": sum(p["frames_captured"] for p in per_camera.values()),
        "frames_dropped": sum(p["frames_dropped"] for p in per_camera.values()),
        "decisions_logged": int(log_stats.get("written", 0)),
        "rss_mb_by_process": {k: round(v, 1) for k, v in rss.items() if v is not None},
        "cold_start_s": cold_start_s,
        "stages_ms": _p50_p99(stages[0]) if len(stages) == 1 else {},
        "pool_stages_ms": pool_stages,
        "in_flight": max((r.in_flight for r in agent.runners), default=1),
        "shadow_frames": s1[0] - s0[0],
        "shadow_skipped": s1[1] - s0[1],
    }


def _p50_p99(summary: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        stage: {"p50": s["p50_ms"], "p99": s["p99_ms"], "mean": round(s["mean_ms"], 3)}
        for stage, s in summary.items()
    }


def _pool_stages(agent: Agent) -> dict[str, dict[str, float]]:
    """The pool's own stages for the first model (queue, hops, preprocess, inference)."""
    if agent.pool is None:
        return {}
    models = agent.pool.stats().get("models", {})
    if not models:
        return {}
    stages = next(iter(models.values())).get("stages", {})
    return {
        name: {"p50": float(s.get("p50_ms", 0.0)), "p99": float(s.get("p99_ms", 0.0))}
        for name, s in stages.items()
        if isinstance(s, dict) and s.get("count", 1)
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
    cameras: int = 1,
    shadow: Path | None = None,
    shadow_sample: float = 0.2,
    shadow_max_fps: float = MAX_SHADOW_FPS,
    transport: str = "tcp",
    username: str = "",
    password_env: str = "",
) -> dict[str, Any]:
    """Measure the source's decode cost, the bare runtime, capacity, then the hot path at
    ``load`` x capacity (a live source: at its own rate); with ``cameras`` > 1 also the
    same total frame rate over that many cameras (a live source: that many streams); with
    ``shadow`` (a bundle directory) the same load again with it as the shadow on a
    ``shadow_sample`` share of the frames (at most ``shadow_max_fps`` a second; by default
    no cap to speak of, so that the share is what is measured). ``video`` is a file or a
    stream URL; ``transport``, ``username`` and ``password_env`` apply to a stream.

    Raises:
        AgentError: no such video, a stream that does not open (its URL and reason word),
            no camera, a shadow sample outside 0..1, or a part of the agent (the shadow
            included) did not start.
    """
    src = BenchSource(video, transport, username, password_env)
    if src.live:
        src.config()  # a bad URL, transport or credential fails before anything runs
    elif not Path(video).is_file():
        raise AgentError(f"bench source {video}: no such file")
    if cameras < 1:
        raise AgentError(f"bench needs at least one camera, got {cameras}")
    if not 0.0 <= shadow_sample <= 1.0:
        raise AgentError(f"bench --shadow-sample must be 0..1, got {shadow_sample}")
    if not 0.0 < shadow_max_fps <= MAX_SHADOW_FPS:
        raise AgentError(f"bench --shadow-max-fps must be above 0, at most {MAX_SHADOW_FPS:g}")
    if shadow is not None:
        load_bundle(shadow)  # a bad candidate fails here, naming its file
    bundle = load_bundle(bundle_dir)
    manifest = bundle.manifest
    mc = bundle.model_config("bare")
    if mc.preprocess is None:
        raise AgentError(f"bench needs an image model; {bundle_dir} has no preprocess")
    # Decode first, while nothing else in the process uses CPU.
    frame, decode = measure_source(src, min(DECODE_S, duration_s))
    shape = next(iter(mc.input_shapes.values()))
    pre = Preprocessor(mc.preprocess, shape, manifest.input.dtype)
    tensor = np.empty(shape, pre.dtype)
    pre.run(frame, tensor)
    bare = measure_bare(
        str(bundle.model_file()), [tensor], duration_s=min(5.0, duration_s), progress=progress
    )
    size = (int(frame.shape[1]), int(frame.shape[0]))
    stream_fps = float(decode["stream_fps"])
    with tempfile.TemporaryDirectory(prefix="edge-agent-bench-") as tmp:
        state = state_dir or Path(tmp)
        n_workers = workers or _profile_workers()
        offer = min(MAX_FPS, OFFER_OVER_BARE * n_workers * bare.throughput_rps)
        cal = _run(
            _agent_config(
                bundle_dir, src, offer, state / "cal", workers, synthetic=size if src.live else None
            ),
            CALIBRATE_S,
            f"capacity ({'pattern' if src.live else 'camera'} at {offer:.0f} fps)",
            progress,
        )
        capacity = cal["rate"]
        # A live stream can't be offered faster than it streams: it runs at its own rate.
        fps = max(1.0, load * capacity)
        cam_fps = LIVE_CAP_FPS if src.live else fps
        what = f"{src.shown} at its own rate" if src.live else f"{load:.0%} of capacity"
        run = _run(
            _agent_config(bundle_dir, src, cam_fps, state / "load", workers),
            duration_s,
            f"hot path at {what} ({stream_fps if src.live else fps:.0f} fps)",
            progress,
        )
        if src.live:  # what the stream offered, as the load's share of capacity
            fps = run["frames_captured"] / duration_s
            load = round(fps / capacity, 3) if capacity else 0.0
        shadowed: dict[str, Any] | None = None
        if shadow is not None:
            shadowed = _run(
                _agent_config(
                    bundle_dir,
                    src,
                    cam_fps,
                    state / "load-shadow",
                    workers,
                    shadow=(shadow_sample, shadow_max_fps),
                ),
                duration_s,
                f"hot path at {what} with the shadow on {shadow_sample:.0%} of the frames",
                progress,
                shadow=shadow,
            )
        many: dict[str, Any] | None = None
        staggered: dict[str, Any] | None = None
        if cameras > 1:
            each = LIVE_CAP_FPS if src.live else fps / cameras
            many = _run(
                _agent_config(bundle_dir, src, each, state / "load-n", workers, cameras),
                duration_s,
                f"{cameras} streams of {src.shown}"
                if src.live
                else f"{cameras} cameras at {each:.0f} fps each, started together",
                progress,
            )
            if not src.live:  # a stream sets its own phase
                staggered = _run(
                    _agent_config(
                        bundle_dir, src, each, state / "load-s", workers, cameras, staggered=True
                    ),
                    duration_s,
                    f"{cameras} cameras at {each:.0f} fps each, phases staggered",
                    progress,
                )
    e2e = run["e2e"]
    report: dict[str, Any] = {
        "model": manifest.name,
        "model_version": manifest.version,
        "source": src.shown,
        "source_kind": src.kind,
        "live": src.live,
        **({"transport": transport} if src.kind == "rtsp" else {}),
        "frame_shape": list(frame.shape),
        **decode,
        "cameras_full_at_15fps": cameras_full(decode["decode_cpu_per_frame_ms"], 15),
        "load": load,
        "frames_in_flight": run["in_flight"],
        "capacity_fps": round(capacity, 1),
        "capacity_offered_fps": round(offer, 1),
        "capacity_source": "synthetic pattern of the stream's size" if src.live else "file",
        "offered_fps": round(fps, 1),
        "decisions_per_s": round(run["rate"], 1),
        "e2e_p50_ms": e2e["p50_ms"],
        "e2e_p99_ms": e2e["p99_ms"],
        "e2e_p999_ms": e2e["p999_ms"],
        "bare_p50_ms": bare.latency["p50_ms"],
        "bare_p99_ms": bare.latency["p99_ms"],
        "bare_rps": round(bare.throughput_rps, 1),
        "e2e_p99_over_bare_p99_ms": round(e2e["p99_ms"] - bare.latency["p99_ms"], 3),
        "frames_captured": run["frames_captured"],
        "frames_dropped": run["frames_dropped"],
        "decisions_logged": run["decisions_logged"],
        "stages_ms": run["stages_ms"],
        "pool_stages_ms": run["pool_stages_ms"],
        "rss_mb_by_process": run["rss_mb_by_process"],
        "rss_mb": round(sum(run["rss_mb_by_process"].values()), 1),
        "parent_rss_mb": run["rss_mb_by_process"].get("agent", 0.0),
        "cold_start_to_first_decision_s": round((run if src.live else cal)["cold_start_s"], 3),
        "cameras": cameras,
        "per_camera_p99_ms": {n: p["p99_ms"] for n, p in run["per_camera"].items()},
    }
    if shadow is not None and shadowed is not None:
        report.update(
            shadow_section(run, shadowed, capacity, shadow, shadow_sample, shadow_max_fps)
        )
    if many is not None:
        report.update(cameras_section(run, many, fps * duration_s if src.live else None))
    if staggered is not None:
        report.update(staggered_section(run, staggered))
    return report
