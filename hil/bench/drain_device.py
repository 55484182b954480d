"""The device side of the drain bench (:mod:`hil.bench.drain`): a real
:class:`agent.app.Agent` on a looped video, its capacity, the backlog written into its
decision log, and the live latency and CPU figures of each phase.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.app import Agent
from agent.config import AgentConfig
from agent.config import parse_config as parse_agent_config
from agent.decisionlog import DecisionLog, DecisionRecord
from agent.decisionlog.connection import connect_reader
from agent.pipeline.runner import Decision
from hil.bench.drain_fleet import DEVICE_ID, DrainBenchError
from runtime.bench import Progress
from runtime.metrics import new_histogram, summarize

log = logging.getLogger(__name__)

MAX_FPS = 1000.0
FIRST_DECISION_S = 60.0
SETTLE_S = 2.0
"""Seconds after the first decision before a phase is measured (warm-up left out)."""
PREFILL_CHUNK = 5000
TEMPLATE_FIELDS = ("source", "line", "model_name", "model_version", "bundle_digest",
                   "backend", "config_hash", "outcome")  # fmt: skip


def agent_config(
    bundle: Path, video: str, fps: float, state: Path, workers: int | None,
    uplink: dict[str, Any] | None = None,
) -> AgentConfig:  # fmt: skip
    """The agent: one file camera looping ``video`` at ``fps``, one pipeline on
    ``bundle``, no thumbnails, ``uplink`` as its ``[uplink]`` section.

    Raises:
        ConfigError: a value is not valid.
    """
    runtime: dict[str, Any] = {"heartbeat_timeout_s": 5.0}
    if workers:
        runtime["workers"] = workers
    data: dict[str, Any] = {
        "agent": {"device_id": DEVICE_ID, "state_dir": str(state), "log_level": "warning"},
        "runtime": runtime,
        "decision_log": {"thumbnails": "none"},
        "cameras": [{"name": "cam", "kind": "file", "uri": video, "fps": fps, "loop": True}],
        "pipelines": [{"name": "line", "source": "cam", "bundle": str(bundle)}],
    }
    if uplink is not None:
        data["uplink"] = uplink
    return parse_agent_config(data)


class Latency:
    """End-to-end latency of each decision (capture timestamp to the decision handed
    on), one histogram per phase."""

    def __init__(self) -> None:
        self._hist = new_histogram()
        self._lock = threading.Lock()

    def record(self, decision: Decision, _id: str) -> None:
        e2e_us = max(1, (time.perf_counter_ns() - decision.t_capture_ns) // 1000)
        with self._lock:
            self._hist.record_value(e2e_us)

    def take(self) -> dict[str, float]:
        """The phase's figures (count, p50_ms, p99_ms, ...); starts the next phase."""
        with self._lock:
            out = summarize(self._hist)
            self._hist.reset()
        return out


class Cpu:
    """Machine-wide busy share (``/proc/stat``) and this process's CPU over a phase."""

    def __init__(self) -> None:
        self._mark = self._now()

    @staticmethod
    def _now() -> tuple[float, float, float]:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
        return sum(fields), idle, time.process_time()

    def take(self, seconds: float) -> dict[str, float]:
        now = self._now()
        total, idle, own = (a - b for a, b in zip(now, self._mark, strict=True))
        self._mark = now
        return {
            "machine_busy_pct": round(100.0 * (1.0 - idle / total), 1) if total else 0.0,
            "agent_process_cores": round(own / seconds, 2) if seconds > 0 else 0.0,
        }


def start_agent(cfg: AgentConfig, on_decision: Callable[[Decision, str], None]) -> Agent:
    """A started agent past its first decision and warm-up.

    Raises:
        DrainBenchError: a part did not start, or no decision came.
    """
    agent = Agent(cfg, on_decision=on_decision, http=False)
    agent.start()
    deadline = time.monotonic() + FIRST_DECISION_S
    while not agent.problems and agent.first_decision_at is None and time.monotonic() < deadline:
        time.sleep(0.01)
    why = "; ".join(f"{p.part}: {p.reason}" for p in agent.problems)
    if not why and agent.first_decision_at is None:
        why = f"no decision within {FIRST_DECISION_S:g} s"
    if why:
        agent.stop()
        raise DrainBenchError(f"agent: {why}")
    time.sleep(SETTLE_S)
    return agent


def pace_by_hot_path(agent: Agent) -> bool:
    """Pace the agent's drain by its hot path's live latency, as ``Uplink(load=...)``
    does, where the agent's own wiring has not (the in-process agent builds its uplink
    without ``load`` until the process split passes it); whether the drain is paced.
    """
    uplink = agent.uplink
    if uplink is None:
        return False
    drain = uplink._drain  # the bench stands in for the agent's wiring
    if drain.load is None:
        drain.load = agent.sink.live.snapshot
    return True


def calibrate(
    bundle: Path, video: str, state: Path, workers: int | None, seconds: float, bars: bool
) -> tuple[float, dict[str, Any]]:
    """The agent's capacity (decisions/s, camera unpaced) and one of its decisions (the
    fields :func:`prefill` copies).

    Raises:
        DrainBenchError: the agent did not start or decide.
    """
    counted = [0]

    def count(_d: Decision, _id: str) -> None:
        counted[0] += 1

    agent = start_agent(agent_config(bundle, video, MAX_FPS, state, workers), count)
    try:
        n0, t0 = counted[0], time.monotonic()
        wait_phase(
            seconds, "capacity (unpaced camera)", bars, lambda: f"{counted[0] - n0} decisions"
        )
        capacity = (counted[0] - n0) / (time.monotonic() - t0)
    finally:
        agent.stop()
    conn = connect_reader(agent.log.path)
    try:
        conn.row_factory = sqlite3.Row
        sql = "SELECT * FROM decisions ORDER BY decision_time LIMIT 1"
        row: sqlite3.Row | None = conn.execute(sql).fetchone()
    finally:
        conn.close()
    if row is None:
        raise DrainBenchError(f"calibration: no decision in {agent.log.path}")
    keep = {k: row[k] for k in TEMPLATE_FIELDS}
    keep.update({k: json.loads(row[k]) for k in ("outputs", "thresholds", "latencies_ms")})
    return capacity, keep


def prefill(cfg: AgentConfig, template: dict[str, Any], count: int, rate: float) -> None:
    """``count`` un-uploaded decisions like ``template``, made ``rate`` a second up to
    now, in the agent's decision log (its own writer, before the agent opens it).

    Raises:
        DrainBenchError: not every decision was written.
    """
    dlog = DecisionLog(cfg.agent.state_dir, cfg.decision_log, device_id=DEVICE_ID)
    dlog.open()
    e2e_s = float(template["latencies_ms"].get("e2e", 5.0)) / 1000.0
    end = time.time() - 1.0
    try:
        for start in range(0, count, PREFILL_CHUNK):
            for i in range(start, min(count, start + PREFILL_CHUNK)):
                t = end - (count - i) / rate
                fields = {"capture_time": t - e2e_s, "decision_time": t,
                          "input_digest": secrets.token_hex(16)}  # fmt: skip
                dlog.append(DecisionRecord(**template, **fields))  # type: ignore[arg-type]
            if not dlog.flush(60.0):
                raise DrainBenchError("backlog: the decision log did not commit in 60 s")
        stats = dlog.stats()
    finally:
        dlog.close()
    if stats["written"] != count:
        raise DrainBenchError(
            f"backlog: {stats['written']} of {count} decisions written ({stats['dropped']} dropped)"
        )


def wait_phase(seconds: float, label: str, bars: bool, text: Callable[[], str]) -> None:
    """Wait ``seconds``, a progress line (``text()``) on stderr when ``bars``."""
    bar = Progress(label, seconds, bars)
    t0 = time.monotonic()
    while (elapsed := time.monotonic() - t0) < seconds:
        time.sleep(min(0.1, seconds - elapsed))
        bar.update(time.monotonic() - t0, text())
    bar.done()
