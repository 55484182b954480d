"""The line bench: a simulated PLC on loopback triggers a station of ``edge-agent run`` on
a real model; trigger -> result is measured as the PLC sees it (from stepping the trigger
counter to the station's ``result_valid`` write reaching the PLC).

Steps, for each protocol (``--protocol opcua modbus``):

1. bare: the bundle's model in a one-worker pool of this process on the camera's frame;
   its p50 and p99 (``bare_p50_ms``, ``bare_p99_ms``);
2. the agent (``edge-agent run --single-process``, one worker) with a software-triggered
   synthetic camera and a station on the PLC, deadline 3 x bare p99 (``deadline_ms``);
3. capacity: triggers one after the other, each after the last result; the station's
   capacity is 1000 / their mean (``capacity_per_s``: the rate it sustains one after the
   other; their p50 is ``closed_loop_p50_ms``);
4. load: ``--triggers`` triggers paced at 80 % of capacity: ``trigger_to_result_p50_ms``,
   ``trigger_to_result_p99_ms`` (every result as the PLC saw it, the fail-safe ones
   included), ``agent_seen_to_queued_mean_ms`` (inside the agent: from seeing the trigger
   to queueing the result's writes; the rest is the poll and the writes),
   ``deadline_missed`` and ``overruns`` among them, and the agent process's CPU over them
   per decision, less what the idle station costs in that time (measured for
   :data:`IDLE_S` just before: ``agent_idle_cpu_ms_per_s``, the poll and the timers):
   ``agent_cpu_ms_per_decision`` (capture, pipeline, station, link, decision log;
   inference runs in the worker process); ``agent_cpu_ms_per_decision_with_idle`` keeps
   the idle share in;
5. overload: as many triggers at 150 % of capacity: every trigger must be answered exactly
   once (result or fail-safe) and the overruns counted (``overload``).

``triggers`` and ``answered`` count both phases. Targets (issue 27): p99 <= bare p99 + 2 ms
at 80 %, no missed deadline there, everything answered once at 150 %, agent CPU per
decision <= 1 ms. The JSON says which held (``targets``).

``hil bench line --bundle DIR --json PATH`` (or ``python -m hil.bench.line``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from agent.capture.synthetic import Pattern
from agent.kernel.bundle import load_bundle
from agent.line.results import STATUS_CODES
from hil.bench.line_plcs import BenchModbusPlc, BenchOpcUaPlc, BenchPlc
from hil.errors import HilError
from hil.loopback import free_port
from runtime import PoolConfig, WorkerPool

BIN = Path(sys.executable).parent
WIDTH, HEIGHT = 320, 240
START_S = 60.0
RESULT_WAIT_S = 10.0
CLOSED_LOOP = 60
IDLE_S = 3.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


class LineBenchError(HilError):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"line bench: {reason}")


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values), q)), 3) if values else 0.0


def bare(bundle_dir: Path, runs: int) -> dict[str, float]:
    """The model alone in a one-worker pool on the camera's frame: p50 and p99 in ms."""
    bundle = load_bundle(bundle_dir)
    frame = Pattern(WIDTH, HEIGHT, "bars").render(0)
    pool = WorkerPool(
        [bundle.model_config("m", max_frame_bytes=frame.nbytes)], PoolConfig(workers=1)
    )
    pool.start()
    try:
        for _ in range(20):
            pool.infer("m", frame=frame)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter_ns()
            pool.infer("m", frame=frame)
            times.append((time.perf_counter_ns() - t0) / 1e6)
    finally:
        pool.close()
    return {"bare_p50_ms": _pct(times, 50), "bare_p99_ms": _pct(times, 99)}


class Agent:
    """``edge-agent run --single-process`` with one station on the bench's PLC."""

    def __init__(self, directory: Path, bundle: Path, plc: BenchPlc, deadline_ms: float) -> None:
        self.dir = directory
        self.http_port = free_port()
        station = plc.station()
        link = station.pop("plc")
        cfg = {
            "agent": {
                "device_id": "line-bench",
                "state_dir": str(directory / "state"),
                "log_level": "warning",
            },
            "runtime": {"workers": 1},
            "http": {"port": self.http_port},
            "decision_log": {"thumbnails": "none"},
            "cameras": [
                {
                    "name": "cam",
                    "kind": "synthetic",
                    "width": WIDTH,
                    "height": HEIGHT,
                    "trigger_mode": "software",
                }
            ],
            "pipelines": [{"name": "p", "source": "cam", "bundle": str(bundle.resolve())}],
            "plc": [link],
            "stations": [
                {
                    "name": "bench",
                    "pipeline": "p",
                    "plc": "plc1",
                    "capture": "software_trigger",
                    "deadline_ms": deadline_ms,
                    "fail_safe": "reject",
                    **station,
                }
            ],
        }
        self.config = directory / "agent.json"
        self.config.write_text(json.dumps(cfg))
        self.toml = directory / "agent.toml"
        self.toml.write_text(_toml(cfg))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.dir / "agent.log").open("wb")
        argv = [str(BIN / "edge-agent")]
        if os.environ.get("LINE_BENCH_WRAP"):  # a profiler's wrapper (not for the figures)
            argv = [sys.executable, os.environ["LINE_BENCH_WRAP"]]
        self.proc = subprocess.Popen(
            [*argv, "run", "--single-process", "--config", str(self.toml)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LineBenchError(f"the agent exited: {self._tail()}")
            health = self.healthz()
            line = (health or {}).get("line", {})
            if line.get("plc", {}).get("plc1", {}).get("connected"):
                time.sleep(0.3)  # the trigger's baseline read
                return
            time.sleep(0.1)
        raise LineBenchError(f"the station's PLC link did not connect: {self._tail()}")

    def _tail(self) -> str:
        path = self.dir / "agent.log"
        return path.read_text(errors="replace")[-1500:] if path.exists() else ""

    def healthz(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(  # the bench's own agent on loopback
                f"http://127.0.0.1:{self.http_port}/healthz", timeout=2
            ) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as exc:
            return dict(json.loads(exc.read()))
        except OSError:
            return None

    def station_sum_count(self) -> tuple[float, float]:
        """The station's ``trigger_to_result_seconds`` histogram: (sum, count) so far —
        from the agent seeing a trigger to queueing its result's writes."""
        with urllib.request.urlopen(  # the bench's own agent on loopback
            f"http://127.0.0.1:{self.http_port}/metrics", timeout=5
        ) as resp:
            text = resp.read().decode()
        total = count = 0.0
        for line in text.splitlines():
            if line.startswith("edgefleet_station_trigger_to_result_seconds_sum"):
                total = float(line.rsplit(" ", 1)[1])
            elif line.startswith("edgefleet_station_trigger_to_result_seconds_count"):
                count = float(line.rsplit(" ", 1)[1])
        return total, count

    def cpu_s(self) -> float:
        """The agent process's own CPU seconds (its workers are processes of their own)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def _toml(cfg: dict[str, Any]) -> str:
    """The bench's config as TOML (inline tables; the agent reads TOML only)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"

    out = []
    for key, section in cfg.items():
        if isinstance(section, list):
            for item in section:
                out.append(f"[[{key}]]")
                out += [f"{k} = {value(v)}" for k, v in item.items()]
        else:
            out.append(f"[{key}]")
            out += [f"{k} = {value(v)}" for k, v in section.items()]
    return "\n".join(out) + "\n"


def _wait_results(plc: BenchPlc, n: int) -> bool:
    """Wait until a result with sequence number ``n`` or later reached the PLC."""
    deadline = time.monotonic() + RESULT_WAIT_S
    while plc.clock.top() < n and time.monotonic() < deadline:
        time.sleep(0.001)
    return plc.clock.top() >= n


def _phase(plc: BenchPlc, triggers: int, rate: float | None) -> list[tuple[int, int]]:
    """``triggers`` triggers, paced at ``rate`` a second (None: each after the last
    result); their (trigger number, perf_counter_ns)."""
    sent = []
    period_ns = int(1e9 / rate) if rate else 0
    next_ns = time.perf_counter_ns()
    for _ in range(triggers):
        if rate:
            while time.perf_counter_ns() < next_ns:
                time.sleep(max(0.0, (next_ns - time.perf_counter_ns()) / 1e9 - 0.0003))
            next_ns += period_ns
        number = plc.count + 1
        sent.append((number, plc.trigger(f"PART-{number:06d}")))
        if not rate and not _wait_results(plc, number):
            raise LineBenchError(f"trigger {number} was not answered in {RESULT_WAIT_S:g} s")
    return sent


def _judge(plc: BenchPlc, sent: list[tuple[int, int]]) -> dict[str, Any]:
    """What the PLC saw for ``sent``: a result with sequence number n answers trigger n
    and every trigger before it (a station writes only the last of results it makes at
    once, a result and the overruns answered after it); latency for the ones whose own
    result was written."""
    _wait_results(plc, sent[-1][0])
    with plc.clock.lock:
        seen = list(plc.clock.seen)
    by_seq = {s.seq: s for s in seen}
    top = max((s.seq for s in seen), default=0)
    latencies: list[float] = []
    every: list[float] = []
    statuses = dict.fromkeys(STATUS_CODES, 0)
    names = {code: name for name, code in STATUS_CODES.items()}
    for number, t_ns in sent:
        s = by_seq.get(number)
        if s is None:
            if number <= top:  # answered inside a later write: an overrun's fail-safe
                statuses["overrun"] += 1
            continue
        word = names.get(s.status, "unknown")
        statuses[word] = statuses.get(word, 0) + 1
        every.append((s.t_ns - t_ns) / 1e6)
        if word == "ok":
            latencies.append((s.t_ns - t_ns) / 1e6)
    answered = sum(1 for n, _ in sent if n <= top)
    seqs = [s.seq for s in seen]
    once = seqs == sorted(set(seqs))  # no sequence number written twice, none backwards
    return {
        "triggers": len(sent),
        "answered": answered,
        "answered_once": once and answered == len(sent),
        "by_status": statuses,
        "mean_ms": round(float(np.mean(every)), 3) if every else 0.0,
        "p50_ms": _pct(every, 50),
        "p99_ms": _pct(every, 99),
        "ok_p50_ms": _pct(latencies, 50),
        "ok_p99_ms": _pct(latencies, 99),
        "max_ms": round(max(every), 3) if every else 0.0,
    }


def run_protocol(
    protocol: str, bundle: Path, triggers: int, work: Path, keep: bool = False
) -> dict[str, Any]:
    figures = bare(bundle, runs=max(200, triggers))
    deadline_ms = round(3 * figures["bare_p99_ms"], 3)
    plc: BenchPlc = BenchOpcUaPlc(work / "plc") if protocol == "opcua" else BenchModbusPlc()
    plc.start()
    agent = Agent(work, bundle, plc, deadline_ms)
    try:
        agent.start()
        closed = _judge(plc, _phase(plc, CLOSED_LOOP, None))
        service_ms = closed["mean_ms"] or 1.0  # the rate it sustains back to back
        capacity = 1000.0 / service_ms
        idle0, t_idle0 = agent.cpu_s(), time.monotonic()
        time.sleep(IDLE_S)
        idle_cpu_ms_per_s = (agent.cpu_s() - idle0) * 1000 / (time.monotonic() - t_idle0)
        cpu0, t0 = agent.cpu_s(), time.monotonic()
        sum0, n0 = agent.station_sum_count()
        load = _judge(plc, _phase(plc, triggers, 0.8 * capacity))
        cpu1, t1 = agent.cpu_s(), time.monotonic()
        sum1, n1 = agent.station_sum_count()
        over = _judge(plc, _phase(plc, triggers, 1.5 * capacity))
    finally:
        agent.stop()
        plc.close()
    decided = load["by_status"]["ok"] + load["by_status"]["deadline_missed"]
    all_ms = (cpu1 - cpu0) * 1000 / max(1, decided)
    # What the decisions cost on top of the idle station (reading the trigger every
    # poll_ms, keep-alives, the agent's own timers), which runs with or without parts.
    marginal_ms = ((cpu1 - cpu0) * 1000 - idle_cpu_ms_per_s * (t1 - t0)) / max(1, decided)
    return {
        "protocol": protocol,
        **figures,
        "deadline_ms": deadline_ms,
        "capacity_per_s": round(capacity, 1),
        "closed_loop_p50_ms": closed["p50_ms"],
        "closed_loop_mean_ms": closed["mean_ms"],
        "agent_seen_to_queued_mean_ms": round((sum1 - sum0) * 1000 / max(1.0, n1 - n0), 3),
        "trigger_to_result_p50_ms": load["p50_ms"],
        "trigger_to_result_p99_ms": load["p99_ms"],
        "deadline_missed": load["by_status"]["deadline_missed"],
        "overruns": load["by_status"]["overrun"],
        "triggers": load["triggers"] + over["triggers"],
        "answered": load["answered"] + over["answered"],
        "agent_cpu_ms_per_decision": round(marginal_ms, 3),
        "agent_cpu_ms_per_decision_with_idle": round(all_ms, 3),
        "agent_idle_cpu_ms_per_s": round(idle_cpu_ms_per_s, 1),
        "load": load,
        "overload": over,
        "targets": {
            "p99_within_bare_plus_2ms": load["p99_ms"] <= figures["bare_p99_ms"] + 2.0,
            "no_missed_deadline_at_80pct": load["by_status"]["deadline_missed"] == 0,
            "all_answered_once_at_150pct": bool(over["answered_once"]),
            "agent_cpu_within_1ms": marginal_ms <= 1.0,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hil bench line",
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="example: hil bench line --bundle .cache/demo/bundles/text-cls --json out.json",
    )
    parser.add_argument("--bundle", type=Path, required=True, help="the model's bundle")
    parser.add_argument(
        "--protocol",
        nargs="+",
        choices=("opcua", "modbus"),
        default=["opcua", "modbus"],
        help="the PLC's protocol(s)",
    )
    parser.add_argument("--triggers", type=int, default=300, help="triggers per phase")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if not 10 <= args.triggers <= 100_000:
        parser.error("--triggers must be 10..100000")
    logging.getLogger("asyncua").setLevel(logging.ERROR)
    out: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    try:
        for protocol in args.protocol:
            with tempfile.TemporaryDirectory(prefix=f"line-bench-{protocol}-") as tmp:
                r = run_protocol(protocol, args.bundle, args.triggers, Path(tmp))
            out[protocol] = r
            print(
                f"{protocol}: trigger->result p50 {r['trigger_to_result_p50_ms']} ms, "
                f"p99 {r['trigger_to_result_p99_ms']} ms (bare p99 {r['bare_p99_ms']} ms); "
                f"deadline {r['deadline_ms']} ms missed {r['deadline_missed']}; "
                f"capacity {r['capacity_per_s']}/s; at 150 %: {r['overload']['answered']} of "
                f"{r['overload']['triggers']} answered once={r['overload']['answered_once']}, "
                f"overruns {r['overload']['by_status']['overrun']}; agent CPU "
                f"{r['agent_cpu_ms_per_decision']} ms/decision (idle station "
                f"{r['agent_idle_cpu_ms_per_s']} ms/s)",
                flush=True,
            )
    except LineBenchError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
