"""docs/stations.md can't rot: every TOML example is a configuration the agent accepts,
and its tables name every configuration key, output value, status and reason word the
code has.

The page's first TOML block is the camera and pipeline the others build on; every other
block is parsed on top of it (its arrays of tables appended to the first block's, its
tables added), read and checked as ``edge-agent check-config`` reads a file
(:func:`agent.kernel.toml.parse_toml`, :func:`agent.config.parse_config`). Bundle and
certificate paths are placeholders: the parser checks that they can be paths, not that
they exist.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, get_args

import pytest

from agent.config import AgentConfig, parse_config
from agent.kernel.toml import parse_toml
from agent.line.config import InputConfig, OutputConfig, OutputValue, StationConfig, TriggerConfig
from agent.line.drivers import DRIVERS
from agent.line.drivers.base import LinkConfig
from agent.line.drivers.configs import (
    LogixLinkConfig,
    ModbusLinkConfig,
    MqttLinkConfig,
    OpcUaLinkConfig,
    S7LinkConfig,
)
from agent.line.errors import REASONS
from agent.line.results import STATUS_CODES
from agent.line.servers.config import ModbusServerConfig, OpcUaServerConfig

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "stations.md"
TEXT = PAGE.read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```toml\n(.*?)^```", TEXT, flags=re.DOTALL | re.MULTILINE)


def _toml(block: str) -> dict[str, Any]:
    """A block read as ``edge-agent`` reads its configuration file."""
    return parse_toml(block, str(PAGE))


def _merged(base: dict[str, Any], block: dict[str, Any]) -> dict[str, Any]:
    """``block`` on top of ``base``: arrays of tables appended, other keys added."""
    out = copy.deepcopy(base)
    for key, value in block.items():
        if isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = [*out[key], *value]
        else:
            assert key not in out, f"a block redefines [{key}] of the first block"
            out[key] = value
    return out


def _configs() -> list[tuple[str, AgentConfig]]:
    """Each block after the first, parsed on top of the first: (its first line, config)."""
    base = _toml(BLOCKS[0])
    out = []
    for block in BLOCKS[1:]:
        first = block.strip().splitlines()[0]
        out.append((first, parse_config(_merged(base, _toml(block)), str(PAGE))))
    return out


def test_the_first_block_is_a_camera_and_pipeline_the_others_build_on() -> None:
    cfg = parse_config(_toml(BLOCKS[0]), str(PAGE))
    assert [c.name for c in cfg.cameras] == ["line1-cam"]
    assert [p.name for p in cfg.pipelines] == ["labels"]
    assert cfg.stations == []
    assert cfg.plc == []


def test_every_toml_block_is_a_configuration_the_agent_accepts() -> None:
    configs = _configs()
    assert len(configs) >= 9, [first for first, _ in configs]
    stations = [s for _, cfg in configs for s in cfg.stations]
    assert len(stations) >= 8
    assert any(s.plc is None for s in stations)  # a station the servers alone trigger
    assert any(s.capture == "software_trigger" for s in stations)


def test_there_is_a_worked_station_for_every_driver() -> None:
    with_station: dict[str, list[str]] = {}
    for _, cfg in _configs():
        links = {link.name: link.driver for link in cfg.plc}
        for st in cfg.stations:
            if st.plc is not None:
                with_station.setdefault(links[st.plc], []).append(st.name)
    assert sorted(with_station) == sorted(DRIVERS), with_station


def test_the_opcua_example_is_signed_and_encrypted_with_a_user_and_a_password_secret() -> None:
    opcua = [
        link
        for _, cfg in _configs()
        for link in cfg.plc
        if isinstance(link, OpcUaLinkConfig) and link.security == "sign_and_encrypt"
    ]
    assert opcua, "no OPC UA example with sign_and_encrypt"
    link = opcua[0]
    assert link.certificate is not None
    assert link.private_key is not None
    assert link.username
    assert link.password_env


def test_the_modbus_example_has_a_word_order_and_a_string_part_id() -> None:
    found = []
    for _, cfg in _configs():
        links = {link.name: link for link in cfg.plc}
        for st in cfg.stations:
            link = links.get(st.plc or "")
            if isinstance(link, ModbusLinkConfig) and st.part_id is not None:
                found.append((link.word_order, st.part_id.type, st.part_id.point))
    assert ("little", "string", "hr:2:10") in found, found


def test_every_output_value_is_in_a_worked_example_and_in_the_values_table() -> None:
    kinds = set(get_args(OutputValue))
    used = {out.value for _, cfg in _configs() for st in cfg.stations for out in st.outputs}
    assert kinds <= used, f"no worked example writes {sorted(kinds - used)}"
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", _section("### Output values"), flags=re.M))
    assert kinds == rows, f"the output values table differs from the code: {kinds ^ rows}"


def test_the_status_table_is_status_codes() -> None:
    rows = re.findall(r"^\| `([a-z_]+)` \| (\d+) \|", _section("### Status codes"), flags=re.M)
    assert {name: int(n) for name, n in rows} == STATUS_CODES


def test_the_reason_table_names_every_reason_word() -> None:
    section = _section("## When something goes wrong: reason words")
    rows = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)
    assert rows == list(REASONS)


@pytest.mark.parametrize(
    "model",
    [
        StationConfig,
        InputConfig,
        TriggerConfig,
        OutputConfig,
        LinkConfig,
        OpcUaLinkConfig,
        ModbusLinkConfig,
        LogixLinkConfig,
        S7LinkConfig,
        MqttLinkConfig,
        OpcUaServerConfig,
        ModbusServerConfig,
    ],
    ids=lambda m: m.__name__,
)
def test_every_configuration_key_is_in_a_table(model: type[Any]) -> None:
    missing = sorted(set(model.model_fields) - _table_keys())
    assert not missing, f"docs/stations.md has no table row for {model.__name__}: {missing}"


def _table_keys() -> set[str]:
    """The first cell of every table row, in backticks (the second where the first is a
    driver's key: the per-driver settings' table)."""
    keys = set()
    for line in TEXT.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].strip("`") in DRIVERS and cells[1].startswith("`"):
            cells = cells[1:]
        if cells and re.fullmatch(r"`[a-z0-9_]+`", cells[0]):
            keys.add(cells[0].strip("`"))
    return keys


def _section(heading: str) -> str:
    """The page's text from ``heading`` to the next heading of its level or above."""
    level = heading.split(" ", 1)[0]
    start = TEXT.index(f"\n{heading}\n")
    ends = [
        m.start()
        for m in re.finditer(r"^(#+) ", TEXT[start + 1 :], flags=re.M)
        if len(m.group(1)) <= len(level) and m.start() > 0
    ]
    return TEXT[start : start + 1 + ends[0]] if ends else TEXT[start:]
