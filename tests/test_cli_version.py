"""Every console tool answers ``--version`` with its name and the installed edgefleet's
version, and exits 0."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

import pytest

from agent.cli import main as edge_agent
from fleet_server.cli.fleetctl import main as fleetctl
from fleet_server.cli.server import main as fleet_server
from runtime.cli import main as edge_runtime

TOOLS: dict[str, Callable[[list[str]], int]] = {
    "edge-agent": edge_agent,
    "fleetctl": fleetctl,
    "fleet-server": fleet_server,
    "edge-runtime": edge_runtime,
}


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_each_tool_prints_its_version(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        TOOLS[name](["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"{name} {metadata.version('edgefleet')}\n"
