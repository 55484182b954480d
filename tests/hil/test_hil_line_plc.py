"""The plc-link-cut scenario's PLC (:class:`hil.scenarios.line.LinePlc`), against the
agent's own Modbus driver with the station the harness configures: its triggers read as
the station reads them, and each result recorded as the PLC saw it (the sequence number,
status and part id written before ``result_valid``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import load_config
from agent.line.drivers.configs import ModbusLinkConfig
from agent.line.drivers.modbus import ModbusDriver
from agent.line.points import parse_point
from agent.line.station import part_id_text
from hil import agentconf
from hil.scenarios.line import LinePlc


@pytest.fixture
def plc() -> Iterator[LinePlc]:
    server = LinePlc("127.0.0.1")
    server.start()
    yield server
    server.close()


def test_the_line_plc_records_results_as_the_agents_driver_writes_them(
    tmp_path: Path, plc: LinePlc
) -> None:
    settings = agentconf.AgentSettings(
        device_id="hil-plc",
        video=str(tmp_path / "line.avi"),
        bundle_dir=str(tmp_path / "bundle"),
        station=agentconf.StationSettings(host="127.0.0.1", port=plc.port),
    )
    (tmp_path / "agent.toml").write_text(agentconf.render(settings))
    cfg = load_config(tmp_path / "agent.toml")
    (link,) = cfg.plc
    assert isinstance(link, ModbusLinkConfig)
    (station,) = cfg.stations
    assert station.trigger is not None
    assert station.part_id is not None
    inputs = [
        parse_point("modbus", station.trigger.point, station.trigger.type),
        parse_point("modbus", station.part_id.point, station.part_id.type),
    ]
    outputs = {o.value: parse_point("modbus", o.point, o.type) for o in station.outputs}
    driver = ModbusDriver(link)
    driver.open()
    try:
        assert driver.read(inputs) == [0, ""]
        made = [plc.trigger("P-000001"), plc.trigger("P-000002")]
        assert [m.number for m in made] == [1, 2]
        count, part = driver.read(inputs)
        assert (count, part_id_text(part)) == (2, "P-000002")
        for seq, (status, part_id) in enumerate([(1, "P-000001"), (3, "P-000002")], start=1):
            driver.write(
                [
                    (outputs["outcome_code"], 2),
                    (outputs["status"], status),
                    (outputs["seq"], seq + 65536),  # both words of the uint32
                    (outputs["part_id"], part_id),
                    (outputs["result_valid"], True),
                ]
            )
            driver.write([(outputs["result_valid"], False)])  # not a result
    finally:
        driver.close()
    seen = plc.results()
    assert [(s.seq, s.status, s.part) for s in seen] == [
        (65537, 1, "P-000001"),
        (65538, 3, "P-000002"),
    ]
    assert seen[0].t <= seen[1].t
