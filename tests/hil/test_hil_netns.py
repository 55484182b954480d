"""The simulated network: a device namespace reaches the fleet's address over its veth,
is cut off when its link goes down, and leaves nothing behind."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

from hil import netns, shell
from hil.sim import SimDevice
from tests.hil.conftest import run_in


def _links() -> set[str]:
    return {x["ifname"] for x in json.loads(shell.run(["ip", "-j", "link", "show"]).stdout)}


def _namespaces() -> set[str]:
    return {x["name"] for x in json.loads(shell.run(["ip", "-j", "netns", "list"]).stdout or "[]")}


def test_a_device_reaches_the_fleet_address_and_only_over_its_link(
    lan: netns.Lan, sim: SimDevice
) -> None:
    server = socket.create_server((lan.host_ip, 0))
    port = server.getsockname()[1]
    got: list[bytes] = []

    def accept() -> None:
        conn, peer = server.accept()
        with conn:
            got.append(conn.recv(64) + f" from {peer[0]}".encode())

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    run_in(
        sim, f"import socket; socket.create_connection(('{lan.host_ip}', {port}), 5).send(b'hi')"
    )
    thread.join(5)
    server.close()
    assert got == [f"hi from {sim.address}".encode()]
    # the device has its own loopback: nothing of this machine's listens there
    out = run_in(sim, "import socket; print(socket.gethostbyname('localhost'))")
    assert out.strip() == "127.0.0.1"
    assert sim.listening(port) is False


def test_link_down_and_up_is_seen_on_the_switch_port(sim: SimDevice) -> None:
    assert sim.ns.link_up()
    sim.set_link(False)
    assert not sim.ns.link_up()
    sim.set_link(True)
    assert sim.ns.link_up()


def test_destroy_removes_the_namespace_its_links_and_its_processes(
    lan: netns.Lan, tmp_path: Path
) -> None:
    dev = SimDevice("tgone", lan, 199, tmp_path)
    (tmp_path / "devices" / "tgone").mkdir(parents=True)
    dev.ns.create()
    proc = dev.spawn(["sleep", "60"], name="sleeper")
    assert dev.ns.name in _namespaces()
    assert dev.ns.host_end in _links()
    dev.teardown()
    assert not proc.alive()
    assert dev.ns.name not in _namespaces()
    assert dev.ns.host_end not in _links()


def test_cleanup_stale_removes_what_a_crashed_run_left(lan: netns.Lan, tmp_path: Path) -> None:
    left = netns.Netns(lan, 198)
    left.create()  # a run that died without tearing down
    proc = shell.Proc(left.exec_argv(["sleep", "60"]), tmp_path / "sleep.log")
    # `ip netns exec` enters the namespace after it started: wait until it is in there
    deadline = time.monotonic() + 30
    while not left.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left.pids(), "the process never entered its namespace"
    removed = netns.cleanup_stale([left.name])
    assert f"netns {left.name} (1 processes killed)" in removed
    assert f"link {left.host_end}" in removed or left.host_end not in _links()
    proc.popen.wait(5)
    assert proc.returncode == -9
    assert left.name not in _namespaces()
    assert left.host_end not in _links()


def test_the_subnet_picked_overlaps_nothing_on_this_machine(lan: netns.Lan) -> None:
    picked = netns.pick_subnet()
    assert not picked.overlaps(lan.subnet)  # the test LAN holds its own /24 already
