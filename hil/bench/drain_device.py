"""The device side of the drain bench (:mod:`hil.bench.drain`): the agent as the product
runs it, ``edge-agent run --config F`` as a subprocess (the supervisor, its hot path and
its companion; ``--single-process`` for comparison), on a looped video. Everything the
bench measures on the device it reads from outside, as an operator could: the decision
log read only (capacity = rows decided in a window; live e2e latency = the ``e2e_ms`` of
the rows decided in a window, capture timestamp to decision), the outbox read only, the
processes' CPU from ``/proc`` and the uplink's counters from ``/metrics``. The backlog is
written into the decision log (the agent's own writer) before the agent starts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.config import parse_config as parse_agent_config
from agent.decisionlog import DecisionLog, DecisionRecord
from agent.kernel.errors import EdgefleetError
from agent.status import STATS_INTERVAL_S
from agent.uplink.cli import outbox_status
from hil.bench.drain_fleet import DEVICE_ID, DrainBenchError
from hil.loopback import free_port
from hil.procs import children
from runtime.bench import Progress
from runtime.metrics import new_histogram, summarize

log = logging.getLogger(__name__)

BIN = Path(sys.executable).parent
"""Where this interpreter's console scripts (``edge-agent``) are."""
MODES = ("two-process", "single-process")
"""``edge-agent run`` (supervisor, hot path, companion) or ``edge-agent run --single-process``."""
MAX_FPS = 1000.0
FIRST_DECISION_S = 90.0
SETTLE_S = 2.0
"""Seconds after the first decision before a phase is measured (warm-up left out)."""
COMMIT_S = 1.0
"""Longer than the decision log's flush interval: a decision made is in the log by then."""
STOP_S = 30.0
PREFILL_CHUNK = 5000
TEMPLATE_FIELDS = ("source", "line", "model_name", "model_version", "bundle_digest",
                   "backend", "config_hash", "outcome")  # fmt: skip


def agent_data(
    bundle: Path, video: str, fps: float, state: Path, workers: int | None,
    uplink: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The agent's configuration: one file camera looping ``video`` at ``fps``, one
    pipeline on ``bundle``, no thumbnails, ``/metrics`` on a free loopback port,
    ``uplink`` as its ``[uplink]`` section."""
    runtime: dict[str, Any] = {"heartbeat_timeout_s": 5.0}
    if workers:
        runtime["workers"] = workers
    data: dict[str, Any] = {
        "agent": {"device_id": DEVICE_ID, "state_dir": str(state.resolve())},
        "runtime": runtime,
        "http": {"port": free_port()},
        "decision_log": {"thumbnails": "none"},
        "cameras": [{"name": "cam", "kind": "file", "uri": str(Path(video).resolve())}],
        "pipelines": [{"name": "line", "source": "cam", "bundle": str(Path(bundle).resolve())}],
    }
    data["agent"]["log_level"] = "warning"
    data["cameras"][0] |= {"fps": fps, "loop": True}
    if uplink is not None:
        data["uplink"] = uplink
    return data


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for what a path or name holds
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise DrainBenchError(f"config value {value!r}: no TOML form here")


def to_toml(data: dict[str, Any]) -> str:
    """``data`` (tables of scalars, and lists of such tables) as TOML."""
    out: list[str] = []
    for name, body in data.items():
        tables = body if isinstance(body, list) else [body]
        header = f"[[{name}]]" if isinstance(body, list) else f"[{name}]"
        for table in tables:
            out.append(header)
            out.extend(f"{k} = {_toml_value(v)}" for k, v in table.items())
    return "\n".join(out) + "\n"


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=5.0)


def _ticks(pid: int) -> tuple[str, int] | None:
    """(name, user + system CPU ticks) of a process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat.rsplit(")", 1)[1].split()
    return name, int(fields[11]) + int(fields[12])  # fields 14 and 15: utime, stime


class DeviceAgent:
    """``edge-agent run --config DIR/agent.toml`` (``mode``: see :data:`MODES`), its
    output in ``DIR/agent.log``. The configuration is checked (and its state directory
    made) when the object is made.

    Raises:
        ConfigError: a value of ``data`` is not valid.
    """

    def __init__(self, directory: Path, data: dict[str, Any], mode: str) -> None:
        if mode not in MODES:
            raise DrainBenchError(f"mode {mode!r}: one of {', '.join(MODES)}")
        self.mode = mode
        self.config: AgentConfig = parse_agent_config(data)
        directory.mkdir(parents=True, exist_ok=True)
        self.config_file = directory / "agent.toml"
        self.config_file.write_text(to_toml(data))
        self.output = directory / "agent.log"
        self.http_port = int(data["http"]["port"])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def state_dir(self) -> Path:
        return Path(self.config.agent.state_dir)

    @property
    def log_path(self) -> Path:
        return self.state_dir / self.config.decision_log.path

    @property
    def outbox_path(self) -> Path:
        return self.config.uplink.outbox_path(self.state_dir)

    # -- the process --------------------------------------------------------------
    def start(self) -> None:
        """Start it; return past its first decision and :data:`SETTLE_S` of warm-up.

        Raises:
            DrainBenchError: it exited, or made no decision in :data:`FIRST_DECISION_S`.
        """
        argv = [str(BIN / "edge-agent"), "run", "--config", str(self.config_file)]
        if self.mode == "single-process":
            argv.append("--single-process")
        t0 = time.time()
        with self.output.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + FIRST_DECISION_S
        while self.count(t0, float("inf")) == 0:
            self.check_alive()
            if time.monotonic() > deadline:
                self.stop()
                raise DrainBenchError(
                    f"agent ({self.mode}): no decision within {FIRST_DECISION_S:g} s\n"
                    + self.output_tail()
                )
            time.sleep(0.1)
        time.sleep(SETTLE_S)
        self.check_alive()

    def output_tail(self) -> str:
        text = self.output.read_text(errors="replace") if self.output.exists() else ""
        return text[-2000:]

    def check_alive(self) -> None:
        """Raises: DrainBenchError: ``edge-agent run`` exited (with its output's tail)."""
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise DrainBenchError(f"edge-agent run exited ({code}):\n{self.output_tail()}")

    def stop(self) -> int | None:
        """SIGTERM, as systemd stops it; its exit code (None: it had to be killed)."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(STOP_S)
            return None

    def processes(self) -> Iterator[tuple[int, str, int]]:
        """(pid, role, CPU ticks) of ``edge-agent run`` and every process under it. The
        role: ``supervisor`` (``agent`` in one process), a child's ``ef-`` name without
        the prefix (``hotpath``, ``companion``, ``standby``), and ``<role>_workers`` for
        what a child started (the runtime's worker processes)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        top = "agent" if self.mode == "single-process" else "supervisor"
        stack: list[tuple[int, str | None]] = [(self.proc.pid, None)]
        while stack:
            pid, parent_role = stack.pop()
            got = _ticks(pid)
            if got is None:
                continue
            name, ticks = got
            if parent_role is None:
                role = top
            elif parent_role == "supervisor":
                role = name.removeprefix("ef-")
            else:
                role = parent_role.removesuffix("_workers") + "_workers"
            yield pid, role, ticks
            stack += [(kid, role) for kid in children(pid)]

    # -- what it wrote -------------------------------------------------------------
    def count(self, t0: float, t1: float) -> int:
        """Rows of the decision log decided in [t0, t1) (0 while there is no log)."""
        if not self.log_path.is_file():
            return 0
        sql = "SELECT count(*) FROM decisions WHERE decision_time >= ? AND decision_time < ?"
        try:
            with contextlib.closing(_read_only(self.log_path)) as conn:
                return int(conn.execute(sql, (t0, min(t1, 1e12))).fetchone()[0])
        except sqlite3.OperationalError:  # the table is not made yet
            return 0

    def latency(self, t0: float, t1: float) -> dict[str, float]:
        """e2e latency (capture timestamp to decision, the log's ``e2e_ms``) of the rows
        decided in [t0, t1): count, p50_ms, p99_ms, ..."""
        hist = new_histogram()
        sql = "SELECT e2e_ms FROM decisions WHERE decision_time >= ? AND decision_time < ?"
        with contextlib.closing(_read_only(self.log_path)) as conn:
            for (ms,) in conn.execute(sql, (t0, t1)):
                if ms is not None:
                    hist.record_value(max(1, round(float(ms) * 1000.0)))
        return summarize(hist)

    def template(self) -> dict[str, Any]:
        """One decision of the log, the fields :func:`prefill` copies.

        Raises:
            DrainBenchError: the log has none.
        """
        with contextlib.closing(_read_only(self.log_path)) as conn:
            conn.row_factory = sqlite3.Row
            sql = "SELECT * FROM decisions ORDER BY decision_time LIMIT 1"
            row: sqlite3.Row | None = conn.execute(sql).fetchone()
        if row is None:
            raise DrainBenchError(f"no decision in {self.log_path}")
        keep = {k: row[k] for k in TEMPLATE_FIELDS}
        keep.update({k: json.loads(row[k]) for k in ("outputs", "thresholds", "latencies_ms")})
        return keep

    def outbox_records(self, *kinds: str) -> int:
        """Records of these kinds in the outbox (read only)."""
        try:
            records = outbox_status(self.outbox_path, self.log_path)["records"]
        except EdgefleetError as exc:
            raise DrainBenchError(str(exc)) from exc
        return sum(int(records.get(k, {}).get("count", 0)) for k in kinds)

    def uplink_figures(self) -> dict[str, Any]:
        """The uplink's counters as ``/metrics`` shows them (records delivered by kind,
        connected) and the decision log's rows marked uploaded. The companion takes its
        gauges once every :data:`agent.status.STATS_INTERVAL_S`: this waits that long
        (and a little) first."""
        time.sleep(STATS_INTERVAL_S + 0.5)
        out: dict[str, Any] = {}
        url = f"http://127.0.0.1:{self.http_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10.0) as resp:
                text = resp.read().decode("utf-8", "replace")
        except OSError as exc:
            out["metrics_error"] = str(exc)
            text = ""
        for kind, n in re.findall(r'^edgefleet_outbox_delivered_total\{kind="(\w+)"\} (\S+)',
                                  text, re.MULTILINE):  # fmt: skip
            out[f"delivered_{kind}"] = int(float(n))
        if found := re.search(r"^edgefleet_uplink_connected (\S+)", text, re.MULTILINE):
            out["connected"] = int(float(found.group(1)))
        out["decision_batches"] = out.get("delivered_decisions", 0)
        with contextlib.closing(_read_only(self.log_path)) as conn:
            sql = "SELECT count(*) FROM decisions WHERE uploaded = 1"
            out["decisions_uploaded"] = int(conn.execute(sql).fetchone()[0])
        return out


class Cpu:
    """Machine-wide busy share (``/proc/stat``) and the CPU of the agent's processes
    (cores, by role: see :meth:`DeviceAgent.processes`) over a phase."""

    def __init__(self, agent: DeviceAgent) -> None:
        self.agent = agent
        self._mark = self._now()

    def _now(self) -> tuple[float, float, dict[int, tuple[str, int]]]:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
        procs = {pid: (role, ticks) for pid, role, ticks in self.agent.processes()}
        return sum(fields), idle, procs

    def take(self, seconds: float) -> dict[str, Any]:
        """The phase's figures since the last call (or the start)."""
        now = self._now()
        (total0, idle0, procs0), (total1, idle1, procs1) = self._mark, now
        self._mark = now
        hz = os.sysconf("SC_CLK_TCK")
        by_role: dict[str, float] = {}
        for pid, (role, ticks) in procs1.items():
            before = procs0.get(pid)
            used = ticks - (before[1] if before is not None else 0)
            by_role[role] = by_role.get(role, 0.0) + used / hz
        total, idle = total1 - total0, idle1 - idle0
        cores = {r: round(s / seconds, 2) for r, s in sorted(by_role.items())} if seconds else {}
        return {
            "machine_busy_pct": round(100.0 * (1.0 - idle / total), 1) if total else 0.0,
            "agent_cores": round(sum(cores.values()), 2),
            "processes_cores": cores,
        }


def load_average() -> list[float]:
    """The machine's load average (``/proc/loadavg``: 1, 5 and 15 minutes)."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return []


def calibrate(
    bundle: Path, video: str, directory: Path, workers: int | None, seconds: float,
    mode: str, bars: bool,
) -> tuple[float, dict[str, Any]]:  # fmt: skip
    """The agent's capacity (decisions/s with the camera unpaced: rows decided in a
    window of the log) and one of its decisions (the fields :func:`prefill` copies).

    Raises:
        DrainBenchError: the agent did not start or decide.
    """
    data = agent_data(bundle, video, MAX_FPS, directory / "state", workers)
    agent = DeviceAgent(directory, data, mode)
    agent.start()
    try:
        t0 = time.time()
        wait_phase(seconds, "capacity (unpaced camera)", bars, lambda: agent.mode)
        t1 = time.time()
        time.sleep(COMMIT_S)
        agent.check_alive()
        capacity = agent.count(t0, t1) / (t1 - t0)
    finally:
        agent.stop()
    return capacity, agent.template()


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
