"""The store-and-forward drain bench (``make bench``): how fast a long outage's backlog
goes from a device into the fleet database, and what draining it does to that device's
live decision latency, in one run.

The fleet side runs in a child process (:mod:`hil.bench.drain_fleet`) at the lowest
CPU priority (nice 19, SCHED_IDLE where allowed: it stands for a remote server): a fleet
server with its managed Mosquitto (TLS), one ingest worker and an SQLite fleet database,
and in front of the broker a TCP forwarder, the network link the bench cuts and restores.
The device (:mod:`hil.bench.drain_device`) runs as the product runs it: ``edge-agent run
--config F`` as a subprocess, the supervisor with its hot path (capture -> pool ->
post-processing -> policy -> decision log) and its companion (the uplink, its drain
paced by the hot path's live p99 over the control channel); ``--single-process``
(``mode``) runs ``edge-agent run --single-process`` instead, for comparison. It is
enrolled through the API and decides on a looped video at ``load`` x its capacity
(measured first, camera unpaced, in the same mode), its uplink towards the forwarder
with the drain settings of :class:`agent.uplink.UplinkConfig` (defaults unless
overridden).

1. Backlog: ``backlog`` decisions shaped like the agent's own (a decision of the
   calibration run, with fresh ids, times and input digests) go into the decision log
   before the agent starts, not uploaded: what the device decided during an outage.
2. Idle: the link is down, the agent decides for ``duration_s``; its decisions and the
   health reports piling up in the outbox join the backlog.
3. Drain: the link comes back, until the last backlog record (every decision made
   before link-up, every outbox record queued before it) is stored in the fleet database.

The live latency of each phase is read from the device's decision log (read only): the
``e2e_ms`` (capture timestamp to decision) of the rows decided in the idle window and in
the drain window. Drain rate = backlog records / seconds from link-up to the last one
stored. The fleet's copy is checked at the end: backlog decisions missing from it,
stored twice, and the ingest worker's ``duplicates`` counter.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import ValidationError

from agent.enrollment.identity import enroll
from agent.errors import AgentError
from agent.kernel.errors import EdgefleetError
from agent.uplink import UplinkConfig
from agent.uplink.outbox import KIND_EVENT, KIND_HEALTH
from agent.wire.messages import error_text
from hil.bench.drain_device import (
    COMMIT_S,
    MODES,
    Cpu,
    DeviceAgent,
    agent_data,
    calibrate,
    load_average,
    prefill,
    wait_phase,
)
from hil.bench.drain_fleet import DEVICE_ID, FLEET_START_S, DrainBenchError, FleetSide
from runtime.bench import Progress

log = logging.getLogger(__name__)

__all__ = ["DrainBenchError", "bench_drain", "format_report", "main"]

TARGET_RECORDS_PER_S = 5000.0
TARGET_P99_RATIO = 1.20
_POLL_S = 0.2
_POLL_NEAR_S = 0.02


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=5.0)


class _Watch:
    """Counts in the fleet database what the device made before link-up."""

    SQL = (
        "SELECT (SELECT count(*) FROM decisions WHERE device_id = :d AND ts < :t), "
        "(SELECT count(*) FROM telemetry WHERE device_id = :d AND ts < :t) + "
        "(SELECT count(*) FROM events WHERE device_id = :d AND ts < :t "
        "AND kind != 'connection')"  # the device's own, not the server's connection events
    )

    def __init__(self, db: Path, before: float) -> None:
        self.conn = _read_only(db)
        self.args = {"d": DEVICE_ID, "t": before}

    def counts(self) -> tuple[int, int]:
        """(decisions, health and event records) stored."""
        decisions, others = self.conn.execute(self.SQL, self.args).fetchone()
        return int(decisions), int(others)


def _check(fleet_db: Path, device_log: Path, before: float) -> dict[str, int]:
    """The fleet's copy of the backlog decisions against the device's log."""
    conn = _read_only(fleet_db)
    try:
        conn.execute("ATTACH DATABASE ? AS device", (device_log.resolve().as_uri() + "?mode=ro",))
        args = {"d": DEVICE_ID, "t": before}

        def one(sql: str) -> int:
            return int(conn.execute(sql, args).fetchone()[0])

        return {
            "backlog_decisions": one(
                "SELECT count(*) FROM device.decisions WHERE decision_time < :t"
            ),
            "stored_decisions": one(
                "SELECT count(*) FROM main.decisions WHERE device_id = :d AND ts < :t"
            ),
            "missing": one(
                "SELECT count(*) FROM device.decisions l WHERE l.decision_time < :t AND NOT "
                "EXISTS (SELECT 1 FROM main.decisions f WHERE f.device_id = :d AND f.id = l.id)"
            ),
            "stored_twice": one(
                "SELECT count(*) - count(DISTINCT id) FROM main.decisions WHERE device_id = :d"
            ),
            "not_in_device_log": one(
                "SELECT count(*) FROM main.decisions f WHERE f.device_id = :d AND NOT EXISTS "
                "(SELECT 1 FROM device.decisions l WHERE l.id = f.id)"
            ),
        }
    finally:
        conn.close()


def _drain_phase(
    agent: DeviceAgent, fleet: FleetSide, timeout_s: float, bars: bool
) -> dict[str, Any]:
    """Restore the link; wait until the backlog is stored (or ``timeout_s``)."""
    outbox_records = agent.outbox_records(KIND_HEALTH, KIND_EVENT)
    links = int(fleet.call("status")["connections"])
    before = time.time()
    t_up = time.monotonic()
    fleet.call("restore")
    watch = _Watch(Path(fleet.hello["db"]), before)
    bar = Progress("drain (link up)", timeout_s, bars)
    connected = first = done = None
    expected = last = stored = others = 0
    try:
        while (now := time.monotonic()) < t_up + timeout_s:
            agent.check_alive()
            if now < t_up + COMMIT_S or not expected:  # decided before link-up, committed
                expected = agent.count(0.0, before)
            if connected is None and int(fleet.call("status")["connections"]) > links:
                connected = now
            stored, others = watch.counts()
            if first is None and stored:
                first = now
            if now >= t_up + COMMIT_S and stored >= expected and others >= outbox_records:
                done = now
                break
            near = stored - last >= expected - stored
            last = stored
            bar.update(now - t_up, f"{stored}/{expected} decisions stored")
            time.sleep(_POLL_NEAR_S if near or connected is None else _POLL_S)
    finally:
        watch.conn.close()
        bar.done()
    end = done if done is not None else time.monotonic()
    records = stored + min(others, outbox_records)
    return {
        "before": before,
        "after": before + (end - t_up),
        "backlog_outbox_records": outbox_records,
        "drained": done is not None,
        "drain_s": round(end - t_up, 3),
        "records_per_s": round(records / (end - t_up), 1),
        "reconnect_s": round(connected - t_up, 3) if connected is not None else None,
        "first_stored_s": round(first - t_up, 3) if first is not None else None,
        "records_per_s_from_first_stored": (
            round(records / (end - first), 1) if first is not None and end > first else None
        ),
        "records_stored": records,
    }


def bench_drain(
    bundle: Path,
    video: str,
    *,
    backlog: int = 100_000,
    duration_s: float = 20.0,
    load: float = 0.6,
    fps: float | None = None,
    uplink: dict[str, Any] | None = None,
    workers: int | None = None,
    calibrate_s: float = 3.0,
    drain_timeout_s: float = 300.0,
    work_dir: Path | None = None,
    progress: Callable[[str], None] = lambda _m: None,
    bars: bool = False,
    fleet_lowest: bool = True,
    mode: str = "two-process",
) -> dict[str, Any]:
    """Run the scenario of the module docstring; the figures as a JSON-able dict.
    ``uplink``: settings of :class:`agent.uplink.UplinkConfig` to use instead of its
    defaults (``drain_rate_per_s``, ``decisions_batch``, ``drain_window`` ...).
    ``fleet_lowest``: the fleet side at the lowest CPU priority (it stands for a remote
    server); False only to see what that priority costs the drain rate. ``mode``: one of
    :data:`hil.bench.drain_device.MODES`.

    Raises:
        DrainBenchError: bad arguments, or a part failed to start or run.
    """
    if backlog < 1 or duration_s <= 0 or not 0 < load <= 1 or (fps is not None and fps <= 0):
        raise DrainBenchError(
            f"backlog ({backlog}) must be >= 1, duration ({duration_s}) > 0, load ({load}) "
            f"in (0, 1] and fps ({fps}) > 0"
        )
    if mode not in MODES:
        raise DrainBenchError(f"mode {mode!r}: one of {', '.join(MODES)}")
    overrides = dict(uplink or {})
    try:
        settings = UplinkConfig(**overrides)
    except ValidationError as exc:
        raise DrainBenchError(f"[uplink] settings: {error_text(exc)}") from exc
    if not (Path(bundle) / "manifest.json").is_file():
        raise DrainBenchError(f"bundle {bundle}: no manifest.json (make it: make bench)")
    if not Path(video).is_file():
        raise DrainBenchError(f"video {video}: no such file (make it: make bench)")
    budget_s = FLEET_START_S + calibrate_s + duration_s + drain_timeout_s + 600.0
    with tempfile.TemporaryDirectory(prefix="drain-bench-", dir=work_dir) as tmp:
        root = Path(tmp)
        progress("starting the fleet side: fleet server, Mosquitto (TLS), ingest, link")
        fleet = FleetSide(root / "fleet", budget_s, lowest=fleet_lowest)
        try:
            state = root / "device"
            try:
                enroll(fleet.hello["url"], fleet.hello["token"], state, DEVICE_ID,
                       trust_dir=state / "trust")  # fmt: skip
            except AgentError as exc:
                raise DrainBenchError(f"enrollment: {exc}") from exc
            progress(f"enrolled {DEVICE_ID}; measuring the agent's capacity ({mode})")
            capacity, template = calibrate(
                Path(bundle), video, root / "calibrate", workers, calibrate_s, mode, bars
            )
            offered = fps or max(1.0, load * capacity)
            link = {"enabled": True, "broker_host": "127.0.0.1",
                    "broker_port": fleet.hello["port"], "reconnect_max_s": 1}  # fmt: skip
            data = agent_data(Path(bundle), video, offered, state, workers, overrides | link)
            agent = DeviceAgent(root / "run", data, mode)
            progress(f"capacity {capacity:.0f} decisions/s; writing a backlog of {backlog}")
            t0 = time.monotonic()
            prefill(agent.config, template, backlog, offered)
            prefill_s = time.monotonic() - t0
            fleet.call("cut")
            progress(f"link down; edge-agent run ({mode}) decides at {offered:.0f} fps")
            agent.start()
            try:
                cpu = Cpu(agent)
                load_idle = load_average()
                idle_t0 = time.time()
                wait_phase(duration_s, "idle (link down)", bars, lambda: "backlog waits")
                idle_t1 = time.time()
                idle_cpu = cpu.take(idle_t1 - idle_t0)
                progress("link up: draining")
                drain = _drain_phase(agent, fleet, drain_timeout_s, bars)
                drain_cpu = cpu.take(drain["drain_s"])
                load_drain = load_average()
                uplink_figures = agent.uplink_figures()
            finally:
                exit_code = agent.stop()
            idle = agent.latency(idle_t0, idle_t1)
            live = agent.latency(drain["before"], drain.pop("after"))
            check = _check(Path(fleet.hello["db"]), agent.log_path, drain.pop("before"))
        finally:
            ingest = fleet.close().get("ingest", [])
    ratio = live["p99_ms"] / idle["p99_ms"] if idle["p99_ms"] else 0.0
    records = check["backlog_decisions"] + drain["backlog_outbox_records"]
    rate = drain["records_per_s"] if drain["drained"] else 0.0
    return {
        "mode": mode,
        "machine": _machine(),
        "load_average": {"idle_start": load_idle, "drain_end": load_drain},
        "agent_exit_code": exit_code,
        "model": template["model_name"],
        "model_version": template["model_version"],
        "capacity_fps": round(capacity, 1),
        "offered_fps": round(offered, 1),
        "load": round(offered / capacity, 3) if capacity else None,
        "backlog_written": backlog,
        "backlog_written_s": round(prefill_s, 2),
        "backlog_decided_offline": check["backlog_decisions"] - backlog,
        **check,
        "backlog_records": records,
        **drain,
        "ingest_duplicates": sum(int(s["duplicates"]) for s in ingest),
        "ingest_quarantined": sum(int(s["quarantined"]) for s in ingest),
        "ingest_stored": sum(int(s["stored"]) for s in ingest),
        "idle_decisions": int(idle["count"]),
        "idle_p50_ms": idle["p50_ms"],
        "idle_p99_ms": idle["p99_ms"],
        "drain_decisions": int(live["count"]),
        "drain_p50_ms": live["p50_ms"],
        "drain_p99_ms": live["p99_ms"],
        "p99_ratio": round(ratio, 3),
        "uplink": uplink_figures,
        "fleet_priority": fleet.hello.get("priority", ""),
        "cpu_idle": idle_cpu,
        "cpu_drain": drain_cpu,
        "settings": {k: getattr(settings, k) for k in SETTINGS},
        "target_records_per_s": TARGET_RECORDS_PER_S,
        "target_p99_ratio": TARGET_P99_RATIO,
        "rate_met": rate >= TARGET_RECORDS_PER_S,
        "ratio_met": 0 < ratio < TARGET_P99_RATIO,
        "target_met": rate >= TARGET_RECORDS_PER_S and 0 < ratio < TARGET_P99_RATIO,
    }


SETTINGS = ("decisions_batch", "decisions_interval_s", "drain_rate_per_s", "drain_window",
            "drain_pacing", "drain_target_p99_ratio", "drain_min_rate_per_s")  # fmt: skip


def _machine() -> dict[str, Any]:
    model = platform.processor()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        model = next(
            (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model
        )
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def format_report(r: dict[str, Any]) -> str:
    """The figures as a few readable lines."""
    m, s = r["machine"], r["settings"]
    verdict = "met" if r["target_met"] else "NOT met"
    parts = ", ".join(f"{k} {'met' if r[k + '_met'] else 'not met'}" for k in ("rate", "ratio"))
    first = r["first_stored_s"]
    return "\n".join(
        [
            f"machine: {m['cores']} cores, {m['cpu']}; edge-agent run as {r['mode']}",
            f"agent: {r['model']} {r['model_version']}, capacity {r['capacity_fps']:.0f} "
            f"decisions/s, live at {r['offered_fps']:.0f} fps",
            f"backlog: {r['backlog_written']} decisions written + {r['backlog_decided_offline']} "
            f"decided offline + {r['backlog_outbox_records']} outbox records "
            f"= {r['backlog_records']} records",
            f"drain: {r['records_stored']} stored in {r['drain_s']:.2f} s from link-up = "
            f"{r['records_per_s']:.0f} records/s (reconnected after {r['reconnect_s']} s, "
            f"first stored after {first} s; {r['records_per_s_from_first_stored']} records/s "
            f"from then){'' if r['drained'] else '  -- NOT all drained'}",
            f"fleet copy: {r['missing']} missing, {r['stored_twice']} stored twice, "
            f"ingest duplicates {r['ingest_duplicates']}, quarantined {r['ingest_quarantined']}",
            f"live e2e: idle p99 {r['idle_p99_ms']:.3f} ms (p50 {r['idle_p50_ms']:.3f}, "
            f"{r['idle_decisions']} decisions), during drain p99 {r['drain_p99_ms']:.3f} ms "
            f"(p50 {r['drain_p50_ms']:.3f}, {r['drain_decisions']}) = x{r['p99_ratio']:.2f}",
            f"CPU: idle {_cpu_text(r['cpu_idle'])}; drain {_cpu_text(r['cpu_drain'])}",
            f"load average (1, 5, 15 min): {r['load_average']['idle_start']} at the idle "
            f"phase's start, {r['load_average']['drain_end']} at the drain's end",
            f"fleet side (stands for a remote server): {r['fleet_priority'] or 'default priority'}",
            "uplink: " + ", ".join(f"{k} {v}" for k, v in s.items()),
            "uplink delivered: " + ", ".join(f"{k} {v}" for k, v in r["uplink"].items()),
            f"target >= {r['target_records_per_s']:.0f} records/s and p99 ratio < "
            f"{r['target_p99_ratio']:.2f}: {verdict} ({parts})",
        ]
    )


def _cpu_text(c: dict[str, Any]) -> str:
    procs = ", ".join(f"{k} {v}" for k, v in c["processes_cores"].items())
    return f"{c['machine_busy_pct']} % of the machine, agent {c['agent_cores']} cores ({procs})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hil bench drain",
        description="Store-and-forward drain bench: a device's outage backlog drained into "
        "the fleet database, and the device's live e2e p99 while it drains.",
        epilog="example: hil bench drain --bundle .cache/demo/bundles/"
        "text-cls --source .cache/demo/line.avi --backlog 100000 --duration 20 "
        "--json .cache/bench-drain.json",
    )
    parser.add_argument("--bundle", type=Path, default=Path(".cache/demo/bundles/text-cls"),
                        help="model bundle the agent runs (default: %(default)s)")  # fmt: skip
    parser.add_argument("--source", default=".cache/demo/line.avi",
                        help="video the agent's camera loops (default: %(default)s)")  # fmt: skip
    parser.add_argument("--backlog", type=int, default=100_000, help="decisions written first")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of the idle phase")
    parser.add_argument("--load", type=float, default=0.6, help="live load x capacity")
    parser.add_argument("--fps", type=float, default=None, help="live fps (instead of --load)")
    parser.add_argument("--workers", type=int, default=None, help="runtime workers")
    parser.add_argument("--drain-timeout", type=float, default=300.0, help="longest drain, s")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="an [uplink] setting instead of its default, e.g. "
                        "drain_rate_per_s=500 (repeatable)")  # fmt: skip
    parser.add_argument("--fleet-priority", choices=("lowest", "default"), default="lowest",
                        help="the fleet side's CPU priority: lowest (nice 19, SCHED_IDLE; "
                        "it stands for a remote server) or default (what that costs)")  # fmt: skip
    parser.add_argument("--single-process", action="store_true",
                        help="run the agent as edge-agent run --single-process (for "
                        "comparison; default: the supervisor and its two processes)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _terminated)  # stop the agent and the fleet side in order
    try:
        uplink = dict(_setting(s) for s in args.set)
    except ValueError as exc:
        parser.error(str(exc))

    def say(message: str) -> None:
        if not args.quiet:
            print(f"bench-drain: {message}", file=sys.stderr, flush=True)

    try:
        result = bench_drain(
            args.bundle, args.source, backlog=args.backlog, duration_s=args.duration,
            load=args.load, fps=args.fps, uplink=uplink, workers=args.workers,
            drain_timeout_s=args.drain_timeout, progress=say, bars=not args.quiet,
            fleet_lowest=args.fleet_priority == "lowest",
            mode="single-process" if args.single_process else "two-process",
        )  # fmt: skip
    except EdgefleetError as exc:
        print(f"bench-drain: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench-drain: interrupted", file=sys.stderr)
        return 130
    print(format_report(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _terminated(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _setting(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"--set {text!r}: expected FIELD=VALUE")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


if __name__ == "__main__":
    sys.exit(main())
