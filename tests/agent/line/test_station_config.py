"""A station's configuration is checked at load: every address in its driver's syntax
for its type, nothing written to a read-only area, no output named twice."""

from __future__ import annotations


def test_check_config_refuses_an_output_on_a_read_only_modbus_area() -> None:
    import pytest

    from agent.config import parse_config
    from agent.kernel.errors import ConfigError

    cfg = {
        "agent": {"device_id": "d", "state_dir": "/tmp/unused-state"},
        "cameras": [{"name": "cam", "kind": "synthetic"}],
        "pipelines": [{"name": "p", "source": "cam", "bundle": "/nonexistent"}],
        "plc": [{"name": "plc1", "driver": "modbus", "host": "127.0.0.1"}],
        "stations": [
            {
                "name": "st",
                "pipeline": "p",
                "plc": "plc1",
                "deadline_ms": 100,
                "trigger": {"point": "coil:0"},
                "outputs": [{"point": "ir:3", "type": "uint16", "value": "seq"}],
            }
        ],
    }
    with pytest.raises(ConfigError, match=r"stations\[0\]\.outputs\[0\]\.point.*read only"):
        parse_config(cfg)
    cfg["stations"][0]["outputs"] = [  # type: ignore[index]
        {"point": "hr:3", "type": "uint16", "value": "seq"},
        {"point": "hr:3", "type": "uint16", "value": "status"},
    ]
    with pytest.raises(ConfigError, match="named twice"):
        parse_config(cfg)
    cfg["stations"][0]["outputs"] = [{"point": "hr:3", "type": "string", "value": "seq"}]  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"outputs\[0\]\.point"):
        parse_config(cfg)
