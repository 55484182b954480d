"""A station with no PLC connection, triggered through the agent's own servers: a PLC
that polls writes the station's trigger coil on the agent's Modbus server (with Debian's
mbpoll, an independent master), the agent decides on a real model and the result lands
in the station's registers and in the OPC UA server's VisionSystem (read by an OPC UA
client); Halt over the station's command makes the next trigger refused."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from asyncua.client.client import Client

from agent.app import Agent
from agent.config import parse_config
from agent.kernel.bundle import init_bundle
from tests.support.broker import free_port

REPO = Path(__file__).resolve().parents[3]
TINY_TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"
WAIT_S = 20.0
BASE, BLOCK = 100, 40


def _mbpoll(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["mbpoll", "-m", "tcp", "-p", str(port), "-a", "1", "-0", "-1", "-o", "2", *args],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )


def _registers(port: int, ref: int, count: int) -> list[int]:
    done = _mbpoll(port, "-t", "4", "-r", str(ref), "-c", str(count), "127.0.0.1")
    assert done.returncode == 0, done.stdout + done.stderr
    return [int(v) for v in re.findall(r"^\[\d+\]:\s+(-?\d+)", done.stdout, re.M)]


def _text(registers: list[int]) -> str:
    return b"".join(r.to_bytes(2, "big") for r in registers).rstrip(b"\0").decode()


async def _opcua_latest(endpoint: str) -> dict[str, Any]:
    """Browse the station's VisionSystem anonymously and read its state variables."""
    async with Client(endpoint, timeout=10) as client:
        objects = client.nodes.objects
        found: dict[str, Any] = {}
        for child in await objects.get_children():
            name = (await child.read_browse_name()).Name
            if name == "gate":
                found["vision_system"] = True
                for sub in await child.get_children():
                    found[(await sub.read_browse_name()).Name] = True
        return found


def test_a_station_triggered_through_the_modbus_server_answers_in_its_registers(
    tmp_path: Path,
) -> None:
    bundle = init_bundle(TINY_TFLITE, tmp_path / "tiny")
    modbus_port, opcua_port = free_port(), free_port()
    cfg = parse_config(
        {
            "agent": {"device_id": "d", "state_dir": str(tmp_path / "state")},
            "runtime": {"workers": 1, "heartbeat_timeout_s": 30},
            "decision_log": {"thumbnails": "none"},
            "cameras": [
                {
                    "name": "cam",
                    "kind": "synthetic",
                    "width": 32,
                    "height": 24,
                    "trigger_mode": "software",
                }
            ],
            "pipelines": [{"name": "p", "source": "cam", "bundle": str(bundle.path)}],
            "stations": [
                {
                    "name": "gate",
                    "pipeline": "p",
                    "deadline_ms": 10_000,
                    "capture": "software_trigger",
                }
            ],
            "modbus_server": {
                "enabled": True,
                "port": modbus_port,
                "station_base": BASE,
                "block_size": BLOCK,
            },
            "opcua_server": {
                "enabled": True,
                "port": opcua_port,
                "security": "none",
                "allow_anonymous_read": True,
            },
        }
    )
    agent = Agent(cfg, http=False)
    agent.start()
    try:
        line = agent.hotpath.line
        assert line.problems == []
        assert line.modbus is not None
        assert line.opcua is not None
        # the VisionSystem is Ready from the start (its first state told): a single job
        # may start before any PLC trigger
        deadline = time.monotonic() + WAIT_S
        while line.opcua.stats()["states_set"] < 1:
            assert time.monotonic() < deadline, line.opcua.stats()
            time.sleep(0.05)
        assert line.stations["gate"].state40100 == "Ready"
        for n in (1, 2):
            done = _mbpoll(modbus_port, "-t", "0", "-r", "0", "127.0.0.1", "--", "1")
            assert done.returncode == 0, done.stdout + done.stderr
            deadline = time.monotonic() + WAIT_S
            block = _registers(modbus_port, BASE, BLOCK)
            while (block[0] << 16 | block[1]) < n and time.monotonic() < deadline:
                time.sleep(0.05)
                block = _registers(modbus_port, BASE, BLOCK)
            assert (block[0] << 16 | block[1]) == n, block
            assert block[2] == 1  # status ok
            assert block[5] == 1  # result valid
            decision_id = _text(block[22:40])
            agent.hotpath.log.flush()
            conn = sqlite3.connect(tmp_path / "state" / "decisions.db")
            try:
                row = conn.execute(
                    "SELECT station FROM decisions WHERE id = ?", (decision_id,)
                ).fetchone()
            finally:
                conn.close()
            assert row == ("gate",)
        stats = line.stats()["stations"]["gate"]
        assert (stats["triggers"], stats["answered"], stats["ok"]) == (2, 2, 2)
        seen = asyncio.run(_opcua_latest(f"opc.tcp://127.0.0.1:{opcua_port}/"))
        assert seen.get("vision_system"), seen
        deadline = time.monotonic() + WAIT_S
        while line.stats()["opcua_server"]["results_published"] < 2:
            assert time.monotonic() < deadline, line.stats()["opcua_server"]
            time.sleep(0.05)
        assert line.stats()["opcua_server"]["states_set"] >= 2  # executing, ready
        # halted: the server's trigger is refused (exception 06), nothing is decided
        assert line.stations["gate"].command("halt") is None
        done = _mbpoll(modbus_port, "-t", "0", "-r", "0", "127.0.0.1", "--", "1")
        assert done.returncode != 0
        assert line.stations["gate"].stats()["ignored_triggers"] == 1
        assert line.stations["gate"].command("reset") is None
    finally:
        agent.stop()
