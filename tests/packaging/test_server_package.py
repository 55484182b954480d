"""edgefleet-server's .deb on a booted Debian bookworm, with a device enrolled against it.

One container for the module (loopback only: no PyPI, no Debian archive), in order:
install, not started while unconfigured, ``fleet-server setup`` (secrets as credential
files), the service up under systemd with its credentials from ``LoadCredential=``, the
hardening score measured by the booted systemd, the agent package installed beside it and
enrolled with a one-time token from ``fleetctl``, its decisions at the fleet, the brokers
unit (shipped disabled) running the config's broker, a SIGSTOPped server restarted by the
watchdog, an upgrade that keeps config, database and keys, and
``apt purge`` deleting the state.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator

import pytest

from tests.agent.installer.installer_helpers import make_bundle
from tests.packaging.debs import NEXT_VERSION, Debs
from tests.packaging.nspawn import Container, booted, rootfs_tarball, wait_for

UNIT = "edgefleet-fleet-server.service"
BROKERS_UNIT = "edgefleet-fleet-brokers.service"
AGENT_UNIT = "edgefleet-agent.service"
CONFIG = "/etc/edgefleet/fleet.toml"
STATE = "/var/lib/edgefleet/server"
CREDS = "/etc/edgefleet/credentials/server"
API = "http://127.0.0.1:8080"
BUNDLE = "/srv/edgefleet/bundles/cls"
DEVICE = "cam-1"
SERVER_EXPOSURE_MAX = 3.0
WATCHDOG_TEST_S = 5
START_S = 120.0

_GET = (
    "import sys, urllib.request\n"
    "req = urllib.request.Request(sys.argv[1])\n"
    "req.add_header('Authorization', 'Bearer ' + open(sys.argv[2]).read().strip())\n"
    "with urllib.request.urlopen(req, timeout=10) as r:\n"
    "    print(r.read().decode())\n"
)


def _active(box: Container) -> bool:
    return box.active(UNIT)


def _api(box: Container, path: str) -> object:
    done = box.run(["python3", "-c", _GET, API + path, f"{CREDS}/EDGEFLEET_API_TOKEN"], check=False)
    if done.returncode != 0:
        return None
    return json.loads(done.stdout)


def _up(box: Container) -> bool:
    return _active(box) and _api(box, "/api/v1/devices") is not None


def _sha(box: Container, inside: str) -> str:
    return hashlib.sha256(box.path(inside).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def box(debs: Debs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    wanted = [*debs.depends("server"), *debs.depends("agent"), "python3"]
    work = tmp_path_factory.mktemp("server-box")
    with booted(rootfs_tarball(wanted), work, "ef-server-test") as container:
        container.put(make_bundle(work, name="cls", version="1.0.0").path, BUNDLE)
        yield container


def test_install_and_not_started_while_unconfigured(box: Container, debs: Debs) -> None:
    box.install(debs("server"))
    for cmd in ("fleet-server", "fleetctl"):
        box.run([cmd, "--help"])
    assert box.path(f"{CONFIG}.example").is_file()
    assert box.run(["systemctl", "is-enabled", UNIT], check=False).stdout.strip() == "enabled"
    assert not _active(box), "an unconfigured server must not run"


def test_setup_then_the_service_serves_with_its_credentials(box: Container) -> None:
    box.run(
        [
            "fleet-server",
            "setup",
            "--admin",
            "alice",
            "--password-stdin",
            "--listen",
            "127.0.0.1",
            "--advertise-host",
            "127.0.0.1",
        ],
        input_text="correct horse battery staple\n",
        timeout_s=300,
    )
    assert box.path(CONFIG).is_file()
    secrets = {p.name for p in box.path(CREDS).iterdir()}
    assert {"EDGEFLEET_API_TOKEN", "EDGEFLEET_KEY_PASSPHRASE"} <= secrets
    token = box.path(f"{CREDS}/EDGEFLEET_API_TOKEN").read_text().strip()
    assert token, "an empty API token"
    assert token not in box.path(CONFIG).read_text(), "the config names secrets, never holds them"
    box.run(["systemctl", "restart", UNIT], timeout_s=START_S)
    wait_for(lambda: _up(box), START_S, f"{UNIT} serving ({box.journal(UNIT)})")


def test_the_booted_systemd_rates_the_unit_within_the_target(box: Container) -> None:
    out = box.run(["systemd-analyze", "security", UNIT, "--no-pager"], check=False).stdout
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out)
    assert found, out[-2000:]
    assert float(found[1]) <= SERVER_EXPOSURE_MAX, out[-3000:]


def test_a_device_enrolls_and_its_decisions_reach_the_fleet(box: Container, debs: Debs) -> None:
    token_file = f"{CREDS}/EDGEFLEET_API_TOKEN"
    token = box.path(token_file).read_text().strip()
    enrolled = box.run(
        ["fleetctl", "devices", "enroll", DEVICE, "--server", API, "--json"],
        env={"EDGEFLEET_API_TOKEN": token},
    )
    one_time = json.loads(enrolled.stdout)["token"]
    box.install(debs("agent"))
    box.run(
        [
            "edge-agent",
            "setup",
            "--camera",
            "test",
            "--bundle",
            BUNDLE,
            "--device-id",
            DEVICE,
            "--fleet",
            API,
            "--token",
            "-",
        ],
        input_text=one_time + "\n",
        timeout_s=300,
    )
    box.run(["systemctl", "restart", AGENT_UNIT], timeout_s=START_S)
    wait_for(lambda: box.active(AGENT_UNIT), START_S, f"{AGENT_UNIT} ({box.journal(AGENT_UNIT)})")

    def decided_at_fleet() -> bool:
        page = _api(box, f"/api/v1/decisions?device={DEVICE}&limit=5")
        return isinstance(page, dict) and bool(page.get("rows"))

    wait_for(decided_at_fleet, 120, f"{DEVICE}'s decisions at the fleet ({box.journal(UNIT)})")


_CONNECT = (
    "import socket, sys\n"
    "socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).close()\n"
)


def test_the_brokers_unit_is_shipped_disabled_and_runs_the_configs_broker(
    box: Container,
) -> None:
    state = box.run(["systemctl", "is-enabled", BROKERS_UNIT], check=False).stdout.strip()
    assert state == "disabled", state
    assert not box.active(BROKERS_UNIT)
    box.run(["systemctl", "stop", UNIT], timeout_s=START_S)  # its own Mosquitto has the port
    assert box.run(["python3", "-c", _CONNECT, "8883"], check=False).returncode != 0
    try:
        # Type=notify: start returns once fleet-server brokers said READY=1
        box.run(["systemctl", "start", BROKERS_UNIT], timeout_s=START_S)
        assert box.active(BROKERS_UNIT), box.journal(BROKERS_UNIT)
        assert box.run(["python3", "-c", _CONNECT, "8883"], check=False).returncode == 0
        assert "fleet-server: brokers main :8883" in box.journal(BROKERS_UNIT)
        box.run(["systemctl", "stop", BROKERS_UNIT], timeout_s=START_S)
        assert not box.active(BROKERS_UNIT)
        assert box.run(["python3", "-c", _CONNECT, "8883"], check=False).returncode != 0
    finally:
        box.run(["systemctl", "stop", BROKERS_UNIT], timeout_s=START_S, check=False)
        box.run(["systemctl", "start", UNIT], timeout_s=START_S)
    wait_for(lambda: _up(box), START_S, f"{UNIT} serving again ({box.journal(UNIT)})")


def test_a_stopped_server_is_restarted_by_the_watchdog(box: Container) -> None:
    dropin = box.path(f"/run/systemd/system/{UNIT}.d/50-test-watchdog.conf")
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text(f"[Service]\nWatchdogSec={WATCHDOG_TEST_S}\n")
    box.run(["systemctl", "daemon-reload"])
    box.run(["systemctl", "restart", UNIT], timeout_s=START_S)
    wait_for(lambda: _up(box), START_S, f"{UNIT} serving again")
    restarts = int(box.unit(UNIT, "NRestarts"))
    main = box.unit(UNIT, "MainPID")
    box.run(["kill", "-STOP", main])
    wait_for(
        lambda: int(box.unit(UNIT, "NRestarts")) > restarts,
        WATCHDOG_TEST_S * 3 + 30,
        f"the watchdog's restart ({box.journal(UNIT)})",
    )
    wait_for(lambda: _up(box), START_S, f"{UNIT} serving after the watchdog")
    assert box.unit(UNIT, "MainPID") != main
    dropin.unlink()
    box.run(["systemctl", "daemon-reload"])


def test_an_upgrade_keeps_config_database_and_keys(box: Container, debs: Debs) -> None:
    kept = {p: _sha(box, p) for p in (CONFIG, f"{CREDS}/EDGEFLEET_API_TOKEN")}
    state = {p.relative_to(box.path(STATE)) for p in box.path(STATE).rglob("*") if p.is_file()}
    pid = box.unit(UNIT, "MainPID")
    box.install(debs("server", NEXT_VERSION))
    version = box.run(["dpkg-query", "-W", "-f=${Version}", "edgefleet-server"]).stdout
    assert version == NEXT_VERSION
    wait_for(lambda: _up(box), START_S, f"{UNIT} serving after the upgrade")
    assert box.unit(UNIT, "MainPID") != pid, "the upgrade must restart the service"
    assert {p: _sha(box, p) for p in kept} == kept
    after = {p.relative_to(box.path(STATE)) for p in box.path(STATE).rglob("*") if p.is_file()}
    missing = {p for p in state - after if p.suffix not in (".pid", ".sock")}
    assert not missing, f"the upgrade lost {sorted(map(str, missing))}"
    devices = _api(box, "/api/v1/devices")
    assert DEVICE in json.dumps(devices), devices


def test_purge_deletes_the_state(box: Container) -> None:
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    box.run(["apt-get", "purge", "-y", "edgefleet-server"], env=env, timeout_s=300)
    assert not _active(box)
    assert not box.path(STATE).exists()
    assert not box.path(CONFIG).exists()
    assert not box.path(CREDS).exists()
    assert box.path("/etc/edgefleet/agent.toml").is_file(), "the agent's config is not ours"
