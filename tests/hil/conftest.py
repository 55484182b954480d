"""Fixtures of the HIL harness tests: a simulated LAN (a bridge of its own, not the one
``hil run`` makes) and simulated devices on it, in real network namespaces.

Network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN). Run by a user other than
root, the tests that need them are skipped, naming the uid and what ``ip netns add`` said;
run as root (as CI is), a failure to make one, a missing ``ip`` included (``make sysdeps``
installs iproute2), fails them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil import netns, shell
from hil.device import RunningProc
from hil.sim import SimDevice

# `make test` runs the test files in several pytest-xdist workers at once: each worker has
# a bridge and a slice of device indexes of its own, so one worker's session can't delete
# another's LAN (``hil run`` numbers its devices from 0; 197-199 are fixed in tests).
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
TEST_BRIDGE = f"efhil-tbr{WORKER}"
SLICE = 10
FIRST_INDEX = 150 + SLICE * (WORKER % 4)


@pytest.fixture(scope="session")
def lan() -> Iterator[netns.Lan]:
    why = netns.netns_supported()
    if why is not None:
        if os.geteuid() != 0:  # a privilege CI (root) has, not a package to install
            pytest.skip(f"network namespaces need root (CAP_NET_ADMIN); uid {os.geteuid()}: {why}")
        pytest.fail(f"root can't make network namespaces here: {why}")
    shell.run(["ip", "link", "del", TEST_BRIDGE], check=False)  # an earlier session's
    net = netns.create_lan(TEST_BRIDGE)  # under a lock: other workers and `hil run` too
    try:
        yield net
    finally:
        net.destroy()


_free = list(range(FIRST_INDEX, FIRST_INDEX + SLICE))


@pytest.fixture
def sim(lan: netns.Lan, tmp_path: Path) -> Iterator[SimDevice]:
    """A device namespace on the LAN (no broker, no agent: tests start what they need)."""
    index = _free.pop(0)
    netns.cleanup_stale([f"{netns.PREFIX}-{index}"])  # an earlier session's
    dev = SimDevice(f"t{index}", lan, index, tmp_path)
    Path(dev.home).mkdir(parents=True)
    dev.ns.create()
    try:
        yield dev
    finally:
        dev.teardown()
        _free.append(index)


def serve_in(dev: SimDevice, code: str, name: str) -> RunningProc:
    """A Python program run inside the device's namespace, kept running (stopped with
    the device)."""
    return dev.spawn([sys.executable, "-c", code], name=name)


def wait_listening(dev: SimDevice, port: int, proc: RunningProc) -> None:
    deadline = time.monotonic() + 10
    while not dev.listening(port):
        assert proc.alive(), proc.tail()
        assert time.monotonic() < deadline, f"nothing listens on {port} in {dev.ns.name}"
        time.sleep(0.05)


def run_in(dev: SimDevice, code: str, timeout_s: float = 30) -> str:
    """Run a Python snippet inside the namespace; its stdout."""
    done = subprocess.run(
        dev.ns.exec_argv([sys.executable, "-c", code]),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    return done.stdout
