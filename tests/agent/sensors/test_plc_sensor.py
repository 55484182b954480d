"""A sensor read from a PLC (kind plc): windows of OPC UA node values at a rate, down
while the PLC is gone and up again after, and its configuration checked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.config import parse_config
from agent.kernel.errors import ConfigError
from agent.sensors import make_sensor
from hil.plc.opcua_plc import OpcUaPlc

WAIT_S = 15.0


@pytest.fixture
def plc(tmp_path: Path) -> Iterator[OpcUaPlc]:
    server = OpcUaPlc(tmp_path)
    server.start()
    yield server
    server.close()


def _config(server: OpcUaPlc, **sensor: object) -> dict[str, object]:
    return {
        "agent": {"device_id": "d", "state_dir": "/tmp/unused-state"},
        "plc": [
            {
                "name": "plc1",
                "driver": "opcua",
                "endpoint": server.endpoint,
                "security": "none",
                "timeout_ms": 500,
                "reconnect_max_s": 0.5,
            }
        ],
        "sensors": [
            {
                "name": "robot",
                "kind": "plc",
                "plc": "plc1",
                "fields": ["torque", "axis"],
                "points": [
                    {"point": server.node_id("Value_float32"), "type": "float32"},
                    {"point": server.node_id("Value_int16"), "type": "int16"},
                ],
                "window": 2,
                "rate_hz": 50,
                **sensor,
            }
        ],
    }


def test_a_plc_sensor_windows_the_nodes_and_comes_back_after_the_plc_does(plc: OpcUaPlc) -> None:
    plc.set("Value_float32", 1.5)
    plc.set("Value_int16", -7)
    cfg = parse_config(_config(plc))
    sensor = make_sensor(cfg.sensors[0], cfg.mqtt, {link.name: link for link in cfg.plc})
    sensor.start()
    try:
        window = sensor.latest(WAIT_S)
        assert window is not None
        assert window.values.shape == (1, 2, 2)
        np.testing.assert_allclose(window.values[0, -1], [1.5, -7.0])
        assert sensor.up
        plc.stop()
        deadline = time.monotonic() + WAIT_S
        while sensor.up and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not sensor.up
        assert sensor.stats()["errors"] >= 1
        plc.start()
        plc.set("Value_float32", 2.25)
        deadline = time.monotonic() + WAIT_S
        got = None
        while time.monotonic() < deadline:
            got = sensor.latest(0.5)
            if got is not None and got.values[0, -1, 0] == 2.25:
                break
        assert got is not None
        assert got.values[0, -1, 0] == 2.25
        assert sensor.up
    finally:
        sensor.stop()


def test_a_plc_sensor_needs_one_numeric_point_per_field_and_a_known_connection(
    plc: OpcUaPlc,
) -> None:
    with pytest.raises(ConfigError, match="points for 2 fields"):
        parse_config(_config(plc, points=[{"point": "ns=2;s=A", "type": "float32"}]))
    with pytest.raises(ConfigError, match="string"):
        parse_config(
            _config(
                plc,
                points=[
                    {"point": "ns=2;s=A", "type": "string"},
                    {"point": "ns=2;s=B", "type": "int16"},
                ],
            )
        )
    with pytest.raises(ConfigError, match="no \\[\\[plc\\]\\] 'nope'"):
        parse_config(_config(plc, plc="nope"))
    with pytest.raises(ConfigError, match=r"sensors\[0\].points\[0\].point"):
        parse_config(
            _config(
                plc,
                points=[
                    {"point": "not a node id", "type": "float32"},
                    {"point": "ns=2;s=B", "type": "int16"},
                ],
            )
        )
