"""A station end to end with a GenICam camera: ``edge-agent run`` (its own process) with a
station whose camera is a GigE Vision camera (``arv-fake-gv-camera-0.8`` in a network
namespace of its own, reached over a veth pair: :mod:`hil.gige_camera`) fired by
``TriggerSoftware`` (``capture = "software_trigger"``), triggered by a PLC (asyncua's
server, :mod:`hil.plc.opcua_plc`). Each trigger gets its result written back over OPC UA,
and its decision is logged with the part id and a capture time that is the camera's own
timestamp mapped to the host clock: after the PLC raised the trigger and before the
decision, and the record says so (``outputs.capture``)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.kernel.bundle import init_bundle
from hil.gige_camera import GigeCamera
from hil.loopback import free_port
from hil.plc.opcua_plc import OpcUaPlc

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[3]
TINY_TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"
EDGE_AGENT = str(Path(sys.executable).parent / "edge-agent")
WAIT_S = 30.0
PARTS = ("P-0001", "P-0002", "P-0003")


@pytest.fixture(scope="module")
def gige(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GigeCamera]:
    with GigeCamera(serial="GVLINE01", log=tmp_path_factory.mktemp("gige") / "camera.log") as c:
        yield c


@pytest.fixture(scope="module")
def plc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpcUaPlc]:
    server = OpcUaPlc(tmp_path_factory.mktemp("plc"))
    server.start()
    yield server
    server.close()


def _config(tmp: Path, camera: GigeCamera, plc: OpcUaPlc, http_port: int) -> Path:
    bundle = init_bundle(TINY_TFLITE, tmp / "tiny")
    node = plc.node_id
    outputs = [
        ("Busy", "bool", "busy"),
        ("ResultValid", "bool", "result_valid"),
        ("OutcomeCode", "int16", "outcome_code"),
        ("DecisionId", "string", "decision_id"),
        ("Seq", "uint32", "seq"),
    ]
    lines = ",\n  ".join(
        f'{{ point = "{node(name)}", type = "{vtype}", value = "{value}" }}'
        for name, vtype, value in outputs
    )
    path = tmp / "agent.toml"
    path.write_text(f"""
[agent]
device_id = "gige-station"
state_dir = "{tmp / "state"}"
log_level = "info"

[runtime]
workers = 1
pin = false

[http]
port = {http_port}

[decision_log]
thumbnails = "none"

[[cameras]]
name = "cam"
kind = "genicam"
uri = "{camera.ip}"
trigger_mode = "software"
stall_timeout_s = 2.0
backoff_initial_s = 0.2
backoff_max_s = 1.0

[cameras.genicam]
pixel_format = "BayerRG8"
exposure_us = 1000
roi = [0, 0, 320, 240]

[[pipelines]]
name = "p"
source = "cam"
bundle = "{bundle.path}"

[[plc]]
name = "plc1"
driver = "opcua"
endpoint = "{plc.endpoint}"
security = "none"
timeout_ms = 2000

[[stations]]
name = "gate"
pipeline = "p"
plc = "plc1"
capture = "software_trigger"
deadline_ms = 5000
trigger = {{ point = "{node("Trigger")}", type = "bool", poll_ms = 5 }}
part_id = {{ point = "{node("PartId")}", type = "string" }}
outputs = [
  {lines},
]
""")
    return path


def _get(port: int, path: str) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            body: bytes = resp.read()
            return body
    except urllib.error.HTTPError as exc:  # 503 while not ready: the body still says why
        return exc.read()
    except OSError:
        return None


def _health(port: int) -> dict[str, Any]:
    body = _get(port, "/healthz")
    return dict(json.loads(body)) if body else {}


@pytest.fixture
def agent(
    tmp_path: Path, gige: GigeCamera, plc: OpcUaPlc
) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    for name, value in (("Trigger", False), ("ResultValid", False), ("Seq", 0),
                        ("DecisionId", ""), ("Busy", False), ("OutcomeCode", 0)):  # fmt: skip
        plc.set(name, value)
    port = free_port()
    config = _config(tmp_path, gige, plc, port)
    log = (tmp_path / "agent.log").open("wb")
    proc = subprocess.Popen(
        [EDGE_AGENT, "run", "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT_S
        ready = False
        while not ready and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            health = _health(port)
            line = health.get("line", {})
            connected = bool(line.get("plc", {}).get("plc1", {}).get("connected"))
            camera = health.get("cameras", {}).get("cam", {})
            ready = connected and bool(camera.get("genicam", {}).get("read_back"))  # opened
            time.sleep(0.1)
        assert ready, (tmp_path / "agent.log").read_text()[-3000:]
        time.sleep(0.2)  # the station's first read of the trigger: its baseline
        yield proc, port, tmp_path
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def _metrics_with(port: int, name: str) -> str:
    """/metrics once it has ``name`` (the gauges are brought up to date every few s)."""
    deadline = time.monotonic() + WAIT_S
    text = ""
    while name not in text and time.monotonic() < deadline:
        text = (_get(port, "/metrics") or b"").decode()
        time.sleep(0.2)
    return text


def _decisions(state: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"file:{state / 'decisions.db'}?mode=ro", uri=True, timeout=5)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(
            "SELECT id, station, part_id, capture_time, decision_time, deadline_missed, "
            "outputs FROM decisions ORDER BY id"
        ).fetchall()
    finally:
        conn.close()
    return [dict(r) for r in rows]


def test_a_plc_trigger_fires_the_gige_camera_and_the_decision_carries_the_camera_time(
    agent: tuple[subprocess.Popen[bytes], int, Path], plc: OpcUaPlc
) -> None:
    proc, port, tmp = agent
    raised: dict[str, float] = {}
    answered: dict[str, tuple[str, float]] = {}
    for n, part in enumerate(PARTS, start=1):
        plc.set("PartId", part)
        raised[part] = time.time()
        plc.set("Trigger", True)
        assert plc.wait_for("ResultValid", True, WAIT_S), _health(port).get("line")
        answered[part] = (plc.get("DecisionId"), time.time())
        assert plc.get("Seq") == n
        assert plc.get("OutcomeCode") in (1, 2, 3)  # a decision's outcome, not 0
        plc.set("Trigger", False)  # the PLC acknowledges: result_valid goes back
        assert plc.wait_for("ResultValid", False, WAIT_S)
    health = _health(port)
    metrics = _metrics_with(port, "edgefleet_camera_missed_triggers_total")
    proc.send_signal(signal.SIGTERM)  # the decision log is flushed on the way out
    assert proc.wait(30) == 0, (tmp / "agent.log").read_text()[-3000:]

    station = health["line"]["stations"]["gate"]
    assert (station["triggers"], station["ok"], station["no_frame"]) == (3, 3, 0)
    g = health["cameras"]["cam"]["genicam"]
    assert g["device"] == "Aravis Fake GVLINE01"
    assert g["read_back"]["TriggerSource"] == "Software"
    assert g["read_back"]["PixelFormat"] == "BayerRG8"
    assert (g["software_triggers"], g["frames"], g["missed_triggers"]) == (3, 3, 0)
    assert g["clock"]["samples"] == 3
    assert 'edgefleet_camera_missed_triggers_total{camera="cam"} 0.0' in metrics
    assert 'edgefleet_camera_resent_packets_total{camera="cam"} 0.0' in metrics
    assert 'edgefleet_camera_clock_error_seconds{camera="cam"}' in metrics

    rows = {r["id"]: r for r in _decisions(tmp / "state")}
    for part in PARTS:
        decision_id, result_seen = answered[part]
        row = rows[decision_id]
        assert (row["station"], row["part_id"], row["deadline_missed"]) == ("gate", part, 0)
        capture = json.loads(row["outputs"])["capture"]
        # the camera's own timestamp, mapped: not the arrival, not clamped to the trigger
        assert capture["clock"] == "camera", capture
        assert capture["after_trigger_ms"] >= 0  # exposed after the station saw the trigger
        assert raised[part] <= row["capture_time"] <= row["decision_time"] <= result_seen
