"""The station's trigger -> result with a GenICam camera: the line bench's station
(:mod:`hil.bench.line`: ``edge-agent run --single-process``, one worker, a simulated PLC
stepping a trigger counter) with its camera a GigE Vision camera fired by
``TriggerSoftware`` (``arv-fake-gv-camera-0.8`` in a namespace of its own on a veth pair:
:mod:`hil.gige_camera`), and the same station on the line bench's synthetic camera as the
baseline, both on this machine in one run.

For each camera, ``--triggers`` triggers one after the other (each after the last
result), as the PLC sees them: ``trigger_to_result_p50_ms``, ``_p99_ms``, ``_mean_ms``
(from stepping the counter to ``result_valid`` reaching the PLC), and from the decision
log: ``seen_to_capture_p50_ms`` (the station seeing the trigger -> the frame's capture
time: firing the camera, its exposure), ``capture_to_decision_p50_ms`` (the capture time
-> the decision: the frame's transfer and conversion, the model, the policy) and the
clocks the capture times are on (``clock``: ``camera`` for the camera's own timestamp);
for the GenICam camera, its counters from ``/healthz`` (frames, missed triggers, the
clock mapping's error). ``genicam_over_synthetic_ms``: what the GenICam camera adds to
trigger -> result at p50.

The simulator answers a software trigger on its own 25 Hz acquisition loop (0-40 ms,
``seen_to_capture``); a real camera answers within its exposure. The model alone on the
frame: ``bare_p50_ms``, ``bare_p99_ms``.

``hil bench genicam-station --bundle DIR --json PATH`` (or
``python -m hil.bench.genicam_station``). Needs root (the namespace) and aravis-tools.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hil.bench import line
from hil.bench.line_plcs import BenchModbusPlc, BenchOpcUaPlc, BenchPlc
from hil.errors import HilError
from hil.gige_camera import GigeCamera

DEADLINE_MS = 500.0
"""Generous: every trigger is decided (the figure is the latency, not the misses)."""


class GenicamAgent(line.Agent):
    """The line bench's agent with its camera a GenICam camera at ``address``."""

    def __init__(
        self, directory: Path, bundle: Path, plc: BenchPlc, deadline_ms: float, address: str
    ) -> None:
        super().__init__(directory, bundle, plc, deadline_ms)
        cfg = json.loads(self.config.read_text())
        cfg["cameras"] = [
            {
                "name": "cam",
                "kind": "genicam",
                "uri": address,
                "trigger_mode": "software",
                "stall_timeout_s": 2.0,
                "genicam": {
                    "pixel_format": "BayerRG8",
                    "roi": [0, 0, line.WIDTH, line.HEIGHT],
                },
            }
        ]
        self.config.write_text(json.dumps(cfg))
        self.toml.write_text(line._toml(cfg))

    def start(self) -> None:
        """Start the agent and wait until its camera opened too (a software-triggered
        camera is "up" only once a trigger's frame came: its features read back say it
        opened)."""
        super().start()
        deadline = time.monotonic() + line.START_S
        camera: dict[str, Any] = {}
        while time.monotonic() < deadline:
            camera = ((self.healthz() or {}).get("cameras") or {}).get("cam", {})
            if camera.get("genicam", {}).get("read_back"):
                return
            time.sleep(0.1)
        raise line.LineBenchError(f"the GenICam camera did not open: {camera}")


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values), q)), 3) if values else 0.0


def _log_figures(state: Path) -> dict[str, Any]:
    """From the decision log: where each capture time falls (see the module)."""
    conn = sqlite3.connect(f"file:{state / 'decisions.db'}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute("SELECT outputs, e2e_ms FROM decisions").fetchall()
    finally:
        conn.close()
    seen_to_capture: list[float] = []
    to_decision: list[float] = []
    clocks: dict[str, int] = {}
    for outputs, e2e_ms in rows:
        capture = json.loads(outputs).get("capture", {})
        clocks[capture.get("clock", "?")] = clocks.get(capture.get("clock", "?"), 0) + 1
        if "after_trigger_ms" in capture:
            seen_to_capture.append(float(capture["after_trigger_ms"]))
        if e2e_ms is not None:
            to_decision.append(float(e2e_ms))
    return {
        "decisions": len(rows),
        "clock": clocks,
        "seen_to_capture_p50_ms": _pct(seen_to_capture, 50),
        "seen_to_capture_max_ms": round(max(seen_to_capture), 3) if seen_to_capture else 0.0,
        "capture_to_decision_p50_ms": _pct(to_decision, 50),
    }


def run_camera(
    kind: str, protocol: str, bundle: Path, triggers: int, work: Path, address: str
) -> dict[str, Any]:
    """One camera's closed loop (``kind``: ``genicam`` at ``address``, or ``synthetic``)."""
    plc: BenchPlc = BenchOpcUaPlc(work / "plc") if protocol == "opcua" else BenchModbusPlc()
    plc.start()
    agent = (
        GenicamAgent(work, bundle, plc, DEADLINE_MS, address)
        if kind == "genicam"
        else line.Agent(work, bundle, plc, DEADLINE_MS)
    )
    health: dict[str, Any] = {}
    try:
        agent.start()
        judged = line._judge(plc, line._phase(plc, triggers, None))
        health = agent.healthz() or {}
    finally:
        agent.stop()
        plc.close()
    cam_health = health.get("cameras", {}).get("cam", {})
    camera = cam_health.get("genicam", {})
    station = health.get("line", {}).get("stations", {}).get("bench", {})
    out = {
        "trigger_to_result_p50_ms": judged["p50_ms"],
        "trigger_to_result_p99_ms": judged["p99_ms"],
        "trigger_to_result_mean_ms": judged["mean_ms"],
        "answered": judged["answered"],
        "by_status": judged["by_status"],
        "no_frame": station.get("no_frame"),
        "camera_failures": cam_health.get("failures"),
        **_log_figures(work / "state"),
    }
    if camera:
        out["camera"] = {
            "frames": camera["frames"],
            "software_triggers": camera["software_triggers"],
            "missed_triggers": camera["missed_triggers"],
            "incomplete_frames": camera["incomplete_frames"],
            "convert_cpu_per_frame_ms": camera["convert_cpu_per_frame_ms"],
            "clock_error_us": camera["clock"]["error_us"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hil bench genicam-station",
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="example: hil bench genicam-station --bundle .cache/demo/bundles/text-cls "
        "--json out.json",
    )
    parser.add_argument("--bundle", type=Path, required=True, help="the model's bundle")
    parser.add_argument(
        "--protocol", choices=("opcua", "modbus"), default="modbus", help="the PLC's protocol"
    )
    parser.add_argument("--triggers", type=int, default=200, help="triggers per camera")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if not 10 <= args.triggers <= 100_000:
        parser.error("--triggers must be 10..100000")
    logging.getLogger("asyncua").setLevel(logging.ERROR)
    out: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "protocol": args.protocol,
        "triggers": args.triggers,
        **line.bare(args.bundle, runs=200),
    }
    try:
        with (
            tempfile.TemporaryDirectory(prefix="genicam-station-") as tmp,
            GigeCamera(serial="GVBENCH1", log=Path(tmp) / "camera.log") as gige,
        ):
            for kind in ("synthetic", "genicam"):
                work = Path(tmp) / kind
                work.mkdir()
                out[kind] = run_camera(
                    kind, args.protocol, args.bundle, args.triggers, work, gige.ip
                )
    except HilError as exc:
        print(exc, file=sys.stderr)
        return 1
    out["genicam_over_synthetic_ms"] = round(
        out["genicam"]["trigger_to_result_p50_ms"] - out["synthetic"]["trigger_to_result_p50_ms"],
        3,
    )
    for kind in ("synthetic", "genicam"):
        r = out[kind]
        print(
            f"{kind}: trigger->result p50 {r['trigger_to_result_p50_ms']} ms, p99 "
            f"{r['trigger_to_result_p99_ms']} ms ({r['answered']} answered); seen->capture "
            f"p50 {r['seen_to_capture_p50_ms']} ms, capture->decision p50 "
            f"{r['capture_to_decision_p50_ms']} ms; clocks {r['clock']}",
            flush=True,
        )
    print(f"the GenICam camera adds {out['genicam_over_synthetic_ms']} ms at p50", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
