"""The packaged systemd units, checked on the host by the real systemd-analyze: the
hardening exposure within the targets (agent <= 2.0, server and brokers <= 3.0), no key systemd
does not know or can't parse, and the settings the packaging contract and the code rely
on (Type=notify with a watchdog, NotifyAccess=main, the config condition, the state
directory, the credentials directory under the ID agent/kernel/secrets.py reads)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.kernel.secrets import CREDENTIAL_DIR_ID
from agent.supervisor import EXIT_RESTART

UNITS = Path(__file__).resolve().parents[2] / "packaging" / "systemd"
AGENT = UNITS / "edgefleet-agent.service"
SERVER = UNITS / "edgefleet-fleet-server.service"
BROKERS = UNITS / "edgefleet-fleet-brokers.service"
EXPOSURE_MAX = {AGENT: 2.0, SERVER: 3.0, BROKERS: 3.0}
SERVER_USER = "edgefleet-server"
ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"


def _settings(unit: Path) -> dict[str, list[str]]:
    """Every ``Key=value`` of the unit, by key, in order (keys may repeat)."""
    out: dict[str, list[str]] = {}
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def _exposure(unit: Path) -> float:
    done = subprocess.run(
        [ANALYZE, "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    return float(found[1])


@pytest.mark.parametrize("unit", [AGENT, SERVER, BROKERS], ids=lambda u: u.name)
def test_the_exposure_is_within_the_target(unit: Path) -> None:
    assert _exposure(unit) <= EXPOSURE_MAX[unit]


@pytest.mark.parametrize("unit", [AGENT, SERVER, BROKERS], ids=lambda u: u.name)
def test_systemd_knows_and_parses_every_setting(unit: Path) -> None:
    done = subprocess.run(
        [ANALYZE, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # the commands are installed by the package, not on this host: that is the only
    # complaint allowed
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    other = [ln for ln in lines if not re.search(r"Command /usr/bin/\S+ is not executable", ln)]
    assert not other, "\n".join(other)


def test_a_unit_with_an_unknown_key_is_caught(tmp_path: Path) -> None:
    """The check above can fail: a misspelt setting is reported by verify."""
    bad = tmp_path / "edgefleet-agent.service"
    bad.write_text(AGENT.read_text().replace("ProtectHome=yes", "ProtectHomes=yes"))
    done = subprocess.run(
        [ANALYZE, "verify", "--man=no", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "ProtectHomes" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("unit", "command", "config", "state", "user"),
    [
        (AGENT, "/usr/bin/edge-agent run", "agent.toml", "edgefleet/agent", "edgefleet"),
        (SERVER, "/usr/bin/fleet-server serve", "fleet.toml", "edgefleet/server", SERVER_USER),
        (BROKERS, "/usr/bin/fleet-server brokers", "fleet.toml", "edgefleet/server", SERVER_USER),
    ],
    ids=["agent", "server", "brokers"],
)
def test_the_contract_settings(
    unit: Path, command: str, config: str, state: str, user: str
) -> None:
    s = _settings(unit)
    path = f"/etc/edgefleet/{config}"
    assert s["ExecStart"] == [f"{command} --config {path}"]
    assert s["ConditionPathExists"] == [path]
    assert s["Type"] == ["notify"]
    assert s["NotifyAccess"] == ["main"]
    # the brokers' command exits 1 when a Mosquitto dies; it has no loop to watch
    assert bool(s.get("WatchdogSec")) == (unit != BROKERS)
    assert s["Restart"] == ["on-failure"]
    assert s["StateDirectory"] == [state]
    assert s["StateDirectoryMode"] == ["0750"]
    assert s["User"] == [user]
    part = state.rsplit("/", 1)[1]
    assert s["LoadCredential"] == [f"{CREDENTIAL_DIR_ID}:/etc/edgefleet/credentials/{part}"]


def test_a_remote_restart_exits_with_the_status_the_unit_restarts_on() -> None:
    s = _settings(AGENT)
    assert s["RestartForceExitStatus"] == [str(EXIT_RESTART)]
    assert s["SuccessExitStatus"] == [str(EXIT_RESTART)]


def test_the_agent_reaches_cameras_by_class_and_only_raises_the_pool_thread() -> None:
    s = _settings(AGENT)
    assert s["DevicePolicy"] == ["closed"]
    assert s["DeviceAllow"] == ["char-video4linux rw"]
    assert s["SupplementaryGroups"] == ["video systemd-journal"]  # cameras; its journal
    assert s["CapabilityBoundingSet"] == ["CAP_SYS_NICE"]
    assert s["AmbientCapabilities"] == ["CAP_SYS_NICE"]
    assert "RestrictRealtime" not in s  # the pool's I/O thread runs SCHED_RR
