"""``hil`` on the command line, and the pieces it is configured with: device URLs, the
agent.toml it writes (checked by the agent's own config loader)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import load_config
from agent.line.drivers.configs import ModbusLinkConfig
from hil import agentconf
from hil.errors import UsageError
from hil.runner import check_names
from hil.ssh import SshTarget

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def _hil(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "hil"), *args], capture_output=True, text=True, timeout=60, check=False
    )


CI_SET = ["offline", "download-cut", "rollout-cut", "broker-restart", "disk-full", "packet-loss"]


def test_list_names_the_scenarios_with_their_invariants_and_which_ci_runs() -> None:
    done = _hil("list", "--json")
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)
    assert [i["name"] for i in items] == [*CI_SET, "plc-link-cut"]
    assert all(i["invariants"] for i in items)
    assert [i["name"] for i in items if i["in_ci"]] == CI_SET


def test_ci_is_what_make_hil_runs_and_all_is_every_scenario() -> None:
    assert check_names(["ci"]) == CI_SET  # plc-link-cut (~90 s) runs by name
    assert check_names(["all"]) == [*CI_SET, "plc-link-cut"]
    assert check_names(["plc-link-cut"]) == ["plc-link-cut"]
    assert "hil run ci --short" in (REPO / "Makefile").read_text()


def test_an_unknown_scenario_is_a_clear_error() -> None:
    done = _hil("run", "ofline")
    assert done.returncode == 2
    assert "unknown ofline" in done.stderr
    assert "known: offline" in done.stderr


def test_a_real_device_without_a_fleet_address_is_refused() -> None:
    done = _hil("run", "offline", "--device", "ssh://nvidia@192.0.2.1")
    assert done.returncode == 2
    assert "--fleet-host" in done.stderr


def test_ssh_urls() -> None:
    t = SshTarget.parse("ssh://nvidia@192.168.55.1:2222?iface=eth1&link=ip&dir=hil")
    assert (t.user, t.host, t.port, t.iface, t.link, t.directory) == (
        "nvidia", "192.168.55.1", 2222, "eth1", "ip", "hil"
    )  # fmt: skip
    assert t.ssh("true")[-3:] == ["nvidia@192.168.55.1", "--", "true"]
    for bad, why in (
        ("nvidia@host", "give sim or ssh://"),
        ("ssh://host", "give sim or ssh://"),
        ("ssh://u@host?speed=1", "unknown option"),
        ("ssh://u@host?link=cable", "nft or ip"),
    ):
        with pytest.raises(UsageError, match=why):
            SshTarget.parse(bad)


def test_the_agent_accepts_the_config_the_harness_writes(tmp_path: Path) -> None:
    settings = agentconf.AgentSettings(
        device_id="hil-x",
        video=str(tmp_path / "line.avi"),
        bundle_dir=str(tmp_path / "bundle"),
        camera_url="http://127.0.0.1:8090/cam",
        decisions_batch=20,
        outbox={"drain_rate_per_s": 2.0, "outbox_max_mb": 8.0},
        drop_order=("event", "health", "decisions"),
    )
    path = tmp_path / "agent.toml"
    path.write_text(agentconf.render(settings))
    cfg = load_config(path)
    assert cfg.agent.device_id == "hil-x"
    assert cfg.cameras[0].kind == "http"
    assert cfg.uplink.drain_rate_per_s == 2.0
    assert cfg.uplink.drop_order == ["thumbnail", "quality", "event", "health", "decisions"]
    assert cfg.actions.actions[0].outcomes == ["pass", "reject", "review"]


def test_the_agent_accepts_the_station_the_harness_writes(tmp_path: Path) -> None:
    settings = agentconf.AgentSettings(
        device_id="hil-plc",
        video=str(tmp_path / "line.avi"),
        bundle_dir=str(tmp_path / "bundle"),
        station=agentconf.StationSettings(host="10.231.0.1", port=15020),
    )
    path = tmp_path / "agent.toml"
    path.write_text(agentconf.render(settings))
    cfg = load_config(path)
    assert [c.name for c in cfg.cameras] == ["cam1", agentconf.STATION_CAMERA]
    assert cfg.cameras[1].trigger_mode == "software"
    (link,) = cfg.plc
    assert isinstance(link, ModbusLinkConfig)
    assert (link.name, link.host, link.port) == ("plc1", "10.231.0.1", 15020)
    (station,) = cfg.stations
    assert (station.name, station.pipeline, station.plc) == ("gate", "station", "plc1")
    assert station.trigger is not None
    assert (station.trigger.point, station.trigger.edge) == ("hr:0", "change")
    assert [o.value for o in station.outputs] == [
        "outcome_code", "status", "seq", "part_id", "result_valid"
    ]  # fmt: skip
