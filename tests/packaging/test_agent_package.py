"""edgefleet-agent's .deb on a booted Debian bookworm, as a field engineer meets it.

One container for the module, and the package's life in order: install with no network
(the container has loopback only: no PyPI, no Debian archive — only the dependencies the
.deb declares are there), the service not started while unconfigured, ``edge-agent
setup`` with a synthetic camera and a bundle, the service up with decisions in the log and
``/healthz`` ok, the hardening score measured by the booted systemd, a SIGSTOPped hot path
restarted by the watchdog, an upgrade that keeps config, decision log and outbox and
restarts into the new version, ``apt remove`` keeping state, ``apt purge`` deleting it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

import pytest

from tests.agent.installer.installer_helpers import make_bundle
from tests.packaging.debs import NEXT_VERSION, Debs
from tests.packaging.nspawn import Container, ContainerError, booted, rootfs_tarball, wait_for

UNIT = "edgefleet-agent.service"
CONFIG = "/etc/edgefleet/agent.toml"
STATE = "/var/lib/edgefleet/agent"
LOG = f"{STATE}/decisions.db"
BUNDLE = "/srv/edgefleet/bundles/cls"
HTTP_PORT = 8091
AGENT_EXPOSURE_MAX = 2.0
WATCHDOG_TEST_S = 4
"""The test's drop-in shortens WatchdogSec (the unit's own value is longer) to keep the
test short; the mechanism measured is the same."""
START_S = 120.0


def _count_decisions(box: Container) -> int:
    out = box.run(
        ["python3", "-c", _SQL_COUNT, LOG],
        check=False,
    )
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else 0


_SQL_COUNT = (
    "import sqlite3, sys\n"
    "c = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)\n"
    "print(c.execute('SELECT count(*) FROM decisions').fetchone()[0])\n"
)
_HEALTHZ = (
    "import json, sys, urllib.request\n"
    "with urllib.request.urlopen(sys.argv[1], timeout=5) as r:\n"
    "    print(r.status, r.read().decode())\n"
)


def _healthz(box: Container) -> tuple[int, str]:
    done = box.run(
        ["python3", "-c", _HEALTHZ, f"http://127.0.0.1:{HTTP_PORT}/healthz"], check=False
    )
    if done.returncode != 0:
        return 0, done.stderr[-300:]
    status, _, body = done.stdout.partition(" ")
    return int(status), body


def _active(box: Container) -> bool:
    return box.active(UNIT)


def _sha(box: Container, inside: str) -> str:
    return hashlib.sha256(box.path(inside).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def box(debs: Debs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    tarball = rootfs_tarball([*debs.depends("agent"), "python3"])
    work = tmp_path_factory.mktemp("agent-box")
    with booted(tarball, work, "ef-agent-test") as container:
        bundle = make_bundle(work, name="cls", version="1.0.0")
        container.put(bundle.path, BUNDLE)
        yield container


def test_install_without_network_and_not_started_while_unconfigured(
    box: Container, debs: Debs
) -> None:
    box.install(debs("agent"))
    assert box.path("/opt/edgefleet/agent/bin/python").exists()
    for cmd in ("edge-agent", "edge-runtime"):
        box.run([cmd, "--help"])
    assert box.run(["id", "-nG", "edgefleet"]).stdout.split().count("video") == 1
    assert box.path(f"{CONFIG}.example").is_file()
    assert not box.path(CONFIG).exists()
    assert box.run(["systemctl", "is-enabled", UNIT], check=False).stdout.strip() == "enabled"
    assert not _active(box), "an unconfigured agent must not run"


def test_setup_writes_the_config_and_the_service_decides(box: Container) -> None:
    box.run(
        [
            "edge-agent",
            "setup",
            "--profile",
            "x86-gateway",
            "--camera",
            "synthetic",
            "--bundle",
            BUNDLE,
            "--http-port",
            str(HTTP_PORT),
        ],
        timeout_s=300,
    )
    assert box.path(CONFIG).is_file()
    box.run(["systemctl", "restart", UNIT], timeout_s=START_S)
    wait_for(lambda: _active(box), START_S, f"{UNIT} active ({box.journal(UNIT)})")
    wait_for(lambda: _count_decisions(box) > 0, 60, f"decisions in {LOG} ({box.journal(UNIT)})")
    # The hot path decides before the companion (uplink, HTTP) has always started: the
    # supervisor starts them side by side, and /healthz answers once the companion runs.
    answers: list[tuple[int, str]] = []

    def healthy() -> bool:
        answers.append(_healthz(box))
        return answers[-1][0] == 200

    try:
        wait_for(healthy, 60, "/healthz to answer 200")
    except ContainerError as exc:
        raise AssertionError(f"{exc}; last: {answers[-1:]}; {box.journal(UNIT)}") from exc


_JOURNAL_TAIL = (
    "import sys\n"
    "from agent.remote.logread import JournalSource, LogQuery\n"
    "for e in JournalSource(sys.argv[1]).tail(LogQuery(0.0, 3, sys.argv[2])):\n"
    "    print(e.text)\n"
)


def test_a_remote_logs_request_reads_the_journal_of_the_unit_as_the_unit_runs(
    box: Container,
) -> None:
    # as the service's processes run: its user, and the group the unit gives them
    # (SupplementaryGroups=systemd-journal); the agent's own reader
    as_unit = ["systemd-run", "--wait", "--pipe", "--quiet", "-p", "User=edgefleet",
               "-p", "SupplementaryGroups=systemd-journal"]  # fmt: skip
    read = ["/opt/edgefleet/agent/bin/python", "-c", _JOURNAL_TAIL, UNIT, "companion: pid"]
    out = box.run([*as_unit, *read], check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines, box.journal(UNIT)
    assert all("companion: pid" in x for x in lines)
    # without the group the journal is not readable, and the reader says so
    denied = box.run(["systemd-run", "--wait", "--pipe", "--quiet", "-p", "User=edgefleet",
                      *read], check=False)  # fmt: skip
    assert denied.returncode != 0
    assert (
        "LogReadError: journalctl exited 1: No journal files were opened due to "
        "insufficient permissions" in denied.stderr
    )


def test_the_booted_systemd_rates_the_unit_within_the_target(box: Container) -> None:
    out = box.run(["systemd-analyze", "security", UNIT, "--no-pager"], check=False).stdout
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out)
    assert found, out[-2000:]
    assert float(found[1]) <= AGENT_EXPOSURE_MAX, out[-3000:]


def _hotpath_pid(box: Container) -> int:
    main = int(box.unit(UNIT, "MainPID"))
    out = box.run(["ps", "-o", "pid=,comm=", "--ppid", str(main)]).stdout
    rows = (line.split() for line in out.splitlines())
    pids = [int(pid) for pid, comm in rows if comm == "ef-hotpath"]
    assert len(pids) == 1, out
    return pids[0]


def test_a_stopped_hot_path_gets_the_service_restarted_by_the_watchdog(box: Container) -> None:
    dropin = box.path(f"/run/systemd/system/{UNIT}.d/50-test-watchdog.conf")
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text(f"[Service]\nWatchdogSec={WATCHDOG_TEST_S}\n")
    box.run(["systemctl", "daemon-reload"])
    box.run(["systemctl", "restart", UNIT], timeout_s=START_S)
    wait_for(lambda: _active(box), START_S, f"{UNIT} active again")
    # An idle stretch longer than the watchdog interval: a live pipeline keeps it petted.
    restarts = int(box.unit(UNIT, "NRestarts"))
    before = int(box.unit(UNIT, "MainPID"))
    wait_for(lambda: _count_decisions(box) > 0, 60, "decisions after the restart")
    hot = _hotpath_pid(box)
    box.run(["kill", "-STOP", str(hot)])
    wait_for(
        lambda: int(box.unit(UNIT, "NRestarts")) > restarts,
        WATCHDOG_TEST_S * 3 + 30,
        f"the watchdog's restart ({box.journal(UNIT)})",
    )
    wait_for(lambda: _active(box), START_S, f"{UNIT} active after the watchdog")
    assert int(box.unit(UNIT, "MainPID")) != before
    assert "watchdog" in box.journal(UNIT, 200).lower()
    dropin.unlink()
    box.run(["systemctl", "daemon-reload"])


def test_an_upgrade_keeps_config_log_and_outbox_and_runs_the_new_version(
    box: Container, debs: Debs
) -> None:
    config_sha = _sha(box, CONFIG)
    wait_for(lambda: _count_decisions(box) > 0, 60, "decisions before the upgrade")
    box.run(["systemctl", "restart", UNIT], timeout_s=START_S)  # a clean state to compare
    wait_for(lambda: _active(box), START_S, f"{UNIT} active")
    pid = int(box.unit(UNIT, "MainPID"))
    kept = {p.name for p in box.path(STATE).iterdir()}
    decided = _count_decisions(box)
    box.install(debs("agent", NEXT_VERSION))
    version = box.run(["dpkg-query", "-W", "-f=${Version}", "edgefleet-agent"]).stdout
    assert version == NEXT_VERSION
    wait_for(lambda: _active(box), START_S, f"{UNIT} active after the upgrade")
    assert int(box.unit(UNIT, "MainPID")) != pid, "the upgrade must restart the service"
    assert _sha(box, CONFIG) == config_sha
    assert kept <= {p.name for p in box.path(STATE).iterdir()}
    assert _count_decisions(box) >= decided
    out = box.run(["/opt/edgefleet/agent/bin/python", "-c", _WHICH_VERSION]).stdout.strip()
    assert out == NEXT_VERSION, f"the venv carries {out}, not {NEXT_VERSION}"
    integrity = box.run(["python3", "-c", _SQL_CHECK, LOG]).stdout.strip()
    assert integrity == "ok"


_WHICH_VERSION = "import importlib.metadata as m; print(m.version('edgefleet'))"
_SQL_CHECK = (
    "import sqlite3, sys\n"
    "c = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)\n"
    "print(c.execute('PRAGMA quick_check').fetchone()[0])\n"
)


def test_remove_keeps_state_and_purge_deletes_it(box: Container) -> None:
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    box.run(["apt-get", "remove", "-y", "edgefleet-agent"], env=env, timeout_s=300)
    assert not _active(box)
    assert box.path(LOG).is_file()
    assert box.path(CONFIG).is_file()
    assert not box.path("/opt/edgefleet/agent/bin/python").exists()
    box.run(["apt-get", "purge", "-y", "edgefleet-agent"], env=env, timeout_s=300)
    assert not box.path(STATE).exists()
    assert not box.path(CONFIG).exists()
    assert not box.path("/etc/edgefleet/credentials/agent").exists()
    listed = box.run(["dpkg-query", "-W", "edgefleet-agent"], check=False)
    assert listed.returncode != 0, listed.stdout
