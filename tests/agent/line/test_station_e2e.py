"""A station end to end, in one agent: a PLC (asyncua's server, :mod:`hil.plc.opcua_plc`)
triggers it with a part id, the agent takes a frame at or after the trigger (the
camera's software trigger), decides on a real model, writes the result back over OPC UA
with result_valid last, and logs the decision with the station, the part id and the id
the PLC read. A deadline the model can't meet gets the fail-safe result, and the late
decision is still logged, marked."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.app import Agent
from agent.config import parse_config
from agent.kernel.bundle import init_bundle
from hil.plc.opcua_plc import OpcUaPlc

REPO = Path(__file__).resolve().parents[3]
TINY_TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"
WAIT_S = 20.0


@pytest.fixture(scope="module")
def plc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpcUaPlc]:
    server = OpcUaPlc(tmp_path_factory.mktemp("plc"))
    server.start()
    yield server
    server.close()


def _config(tmp: Path, plc: OpcUaPlc, **station: Any) -> dict[str, Any]:
    bundle = init_bundle(TINY_TFLITE, tmp / "tiny")
    node = plc.node_id
    outputs = [
        {"point": node("Busy"), "type": "bool", "value": "busy"},
        {"point": node("ResultValid"), "type": "bool", "value": "result_valid"},
        {"point": node("OutcomeCode"), "type": "int16", "value": "outcome_code"},
        {"point": node("Score"), "type": "float32", "value": "score"},
        {"point": node("DecisionId"), "type": "string", "value": "decision_id"},
        {"point": node("Seq"), "type": "uint32", "value": "seq"},
        {"point": node("Value_bool"), "type": "bool", "value": "outcome_is", "outcome": "reject"},
    ]
    return {
        "agent": {"device_id": "d", "state_dir": str(tmp / "state")},
        "runtime": {"workers": 1, "heartbeat_timeout_s": 30},
        "decision_log": {"thumbnails": "none"},
        "cameras": [
            {
                "name": "cam",
                "kind": "synthetic",
                "fps": 5,
                "width": 32,
                "height": 24,
                "trigger_mode": "software",
            }
        ],
        "pipelines": [{"name": "p", "source": "cam", "bundle": str(bundle.path)}],
        "plc": [
            {
                "name": "plc1",
                "driver": "opcua",
                "endpoint": plc.endpoint,
                "security": "none",
                "timeout_ms": 2000,
            }
        ],
        "stations": [
            {
                "name": "gate",
                "pipeline": "p",
                "plc": "plc1",
                "capture": "software_trigger",
                "trigger": {"point": node("Trigger"), "type": "bool", "poll_ms": 5},
                "part_id": {"point": node("PartId"), "type": "string"},
                "outputs": outputs,
                "outcome_codes": {"pass": 1, "reject": 2, "review": 3, "unknown": 9},
                **station,
            }
        ],
    }


def _reset(plc: OpcUaPlc) -> None:
    for name, value in (("Trigger", False), ("ResultValid", False), ("Seq", 0),
                        ("DecisionId", ""), ("Busy", False), ("OutcomeCode", 0),
                        ("Value_bool", False)):  # fmt: skip
        plc.set(name, value)


def _rows(state: Path) -> list[sqlite3.Row]:
    conn = sqlite3.connect(state / "decisions.db")
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(
            "SELECT id, outcome, station, part_id, deadline_missed FROM decisions ORDER BY id"
        ).fetchall()
    finally:
        conn.close()


def _connected(agent: Agent) -> bool:
    stats = agent.hotpath.line.stats()
    return bool(stats["plc"]["plc1"]["connected"])


def _start(cfg: dict[str, Any]) -> Agent:
    agent = Agent(parse_config(cfg), http=False)
    agent.start()
    deadline = time.monotonic() + WAIT_S
    while not _connected(agent) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _connected(agent), agent.hotpath.line.stats()
    time.sleep(0.1)  # a first read: the trigger's baseline
    return agent


def test_a_trigger_is_answered_with_the_decision_and_its_id_reaches_the_log(
    tmp_path: Path, plc: OpcUaPlc
) -> None:
    _reset(plc)
    agent = _start(_config(tmp_path, plc, deadline_ms=10_000))
    try:
        for n, part in enumerate(["P-0001", "P-0002"], start=1):
            plc.set("PartId", part)
            plc.set("Trigger", True)
            assert plc.wait_for("ResultValid", True, WAIT_S), agent.hotpath.line.stats()
            assert plc.get("Seq") == n
            assert plc.get("Busy") is False
            decision_id = plc.get("DecisionId")
            code = plc.get("OutcomeCode")
            plc.set("Trigger", False)  # the PLC acknowledges: result_valid goes back
            assert plc.wait_for("ResultValid", False, WAIT_S)
            agent.hotpath.log.flush()
            row = next(r for r in _rows(tmp_path / "state") if r["id"] == decision_id)
            assert (row["station"], row["part_id"], row["deadline_missed"]) == ("gate", part, 0)
            assert code == {"pass": 1, "reject": 2, "review": 3}.get(row["outcome"], 0)
            assert plc.get("Value_bool") is (row["outcome"] == "reject")  # the reject bit
        stats = agent.hotpath.line.stats()["stations"]["gate"]
        assert (stats["triggers"], stats["answered"], stats["ok"]) == (2, 2, 2)
        assert stats["write_failures"] == {}
        text = agent.metrics.render().decode()
        assert 'edgefleet_station_results_total{station="gate",status="ok"} 2.0' in text
    finally:
        agent.stop()


def test_a_deadline_the_model_cant_meet_writes_the_fail_safe_and_marks_the_decision(
    tmp_path: Path, plc: OpcUaPlc
) -> None:
    _reset(plc)
    agent = _start(_config(tmp_path, plc, deadline_ms=0.001, fail_safe="reject"))
    try:
        plc.set("PartId", "P-LATE")
        plc.set("Trigger", True)
        assert plc.wait_for("ResultValid", True, WAIT_S)
        assert plc.get("OutcomeCode") == 2  # reject: the fail-safe
        assert plc.get("Value_bool") is True  # the reject gate's bit
        assert plc.get("DecisionId") == ""  # nothing was decided in time
        deadline = time.monotonic() + WAIT_S
        rows: list[sqlite3.Row] = []
        while time.monotonic() < deadline:
            agent.hotpath.log.flush()
            rows = [r for r in _rows(tmp_path / "state") if r["part_id"] == "P-LATE"]
            if rows:
                break
            time.sleep(0.05)
        assert len(rows) == 1
        assert rows[0]["deadline_missed"] == 1
        assert rows[0]["station"] == "gate"
        stats = agent.hotpath.line.stats()["stations"]["gate"]
        assert stats["deadline_missed"] == 1
        assert stats["answered"] == 1
    finally:
        agent.stop()
        plc.set("Trigger", False)
