"""Each network, fleet and process fault injector does what it says, seen from real
sockets and real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil import netns, shell
from hil.errors import FaultUnavailable
from hil.faults import AgentKill, BrokerRestart, Latency, LinkDown, PacketLoss, Throttle
from hil.fleet import Fleet
from hil.sim import SimDevice
from tests.hil.conftest import run_in, serve_in, wait_listening

ECHO = """
import socketserver
class H(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(self.request.recv(64))
socketserver.TCPServer(("{ip}", {port}), H).serve_forever()
"""
UDP_COUNT = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE: a slow reader drops none
s.bind(("{ip}", {port}))
print("ready", flush=True)
s.settimeout({first})
n = 0
try:
    while True:
        s.recv(64)
        n += 1
        s.settimeout(1.0)
except OSError:
    pass
print(n)
"""
SEND = 400
SO_RCVBUFFORCE = 33  # Linux; root may set a buffer above rmem_max


def _echo(ip: str, port: int, timeout_s: float = 2.0) -> bytes:
    with socket.create_connection((ip, port), timeout=timeout_s) as c:
        c.sendall(b"ping")
        return c.recv(64)


def _send_udp(ip: str, port: int, n: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for i in range(n):
            s.sendto(f"{i}".encode(), (ip, port))
            if i % 20 == 0:
                time.sleep(0.01)


def _count_in_device(sim: SimDevice, port: int) -> int:
    """Send SEND datagrams from this machine to a counter in the device."""
    counter = serve_in(sim, UDP_COUNT.format(ip=sim.address, port=port, first=10), "udp")
    deadline = time.monotonic() + 15
    while "ready" not in counter.tail(1) and counter.alive() and time.monotonic() < deadline:
        time.sleep(0.05)  # bound before anything is sent
    _send_udp(sim.address, port, SEND)
    deadline = time.monotonic() + 15
    while counter.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    return int(counter.tail(1).strip())


def _count_from_device(lan: netns.Lan, sim: SimDevice) -> int:
    """Send SEND datagrams from the device to a counter here (reading as they come)."""
    got: list[int] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
        s.bind((lan.host_ip, 0))
        port = s.getsockname()[1]

        def count() -> None:
            s.settimeout(10.0)
            n = 0
            try:
                while n < SEND:
                    s.recv(64)
                    n += 1
                    s.settimeout(1.0)
            except TimeoutError:
                pass
            got.append(n)

        reader = threading.Thread(target=count, daemon=True)
        reader.start()
        send = f"for i in range({SEND}): s.sendto(b'x', ('{lan.host_ip}', {port}))"
        run_in(sim, f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n{send}")
        reader.join(30)
    return got[0]


def test_link_down_cuts_the_device_off_and_up_brings_it_back(sim: SimDevice) -> None:
    port = 7001
    server = serve_in(sim, ECHO.format(ip=sim.address, port=port), "echo")
    wait_listening(sim, port, server)
    assert _echo(sim.address, port) == b"ping"
    fault = LinkDown(sim)
    with fault:
        with pytest.raises(OSError):  # noqa: PT011 - unreachable or timed out, both fine
            _echo(sim.address, port)
        # the device's own loopback is not cut
        assert run_in(sim, f"import socket; print(socket.create_connection(('{sim.address}', "
                           f"{port}), 2).send(b'x'))").strip() == "1"  # fmt: skip
    for _ in range(40):
        try:
            assert _echo(sim.address, port) == b"ping"
            break
        except OSError:
            time.sleep(0.25)
    else:
        pytest.fail("the device is not reachable after the link came back")
    assert fault.record()["method"] == "ip link"


@pytest.fixture
def static_arp(lan: netns.Lan, sim: SimDevice) -> Iterator[None]:
    """Fixed neighbour entries both ways: a lost ARP request would hold back (and its
    queue overflow would drop) the datagrams counted, on top of the loss measured."""
    dev_mac = str(json.loads(shell.run(["ip", "-n", sim.ns.name, "-j", "link", "show",
                                        sim.ns.device_end]).stdout)[0]["address"])  # fmt: skip
    br_mac = str(json.loads(shell.run(["ip", "-j", "link", "show", lan.name]).stdout)[0]["address"])
    shell.run(["ip", "neigh", "replace", sim.address, "lladdr", dev_mac, "dev", lan.name,
               "nud", "permanent"])  # fmt: skip
    shell.run(["ip", "-n", sim.ns.name, "neigh", "replace", lan.host_ip, "lladdr", br_mac,
               "dev", sim.ns.device_end, "nud", "permanent"])  # fmt: skip
    try:
        yield
    finally:
        shell.run(["ip", "neigh", "del", sim.address, "dev", lan.name], check=False)


@pytest.mark.usefixtures("static_arp")
def test_packet_loss_drops_about_that_share_both_ways_and_nothing_once_cleared(
    lan: netns.Lan, sim: SimDevice
) -> None:
    loss = PacketLoss(sim, 30)
    loss.apply()
    into = _count_in_device(sim, 7002)
    out_of = _count_from_device(lan, sim)
    dropped = loss.dropped()
    loss.clear()
    # 400 packets at 30 %: 280 expected, sd ~9; the bounds are 8 sd wide
    assert 200 < into < 360, into
    assert 200 < out_of < 360, out_of
    if loss.method == "nftables numgen":
        assert dropped["in"] > 0
        assert dropped["out"] > 0
        assert "netem_missing" in loss.record()
    else:
        assert loss.method == "tc netem"
    assert _count_in_device(sim, 7003) == SEND
    assert _count_from_device(lan, sim) == SEND


def test_packet_loss_refuses_a_share_out_of_range(sim: SimDevice) -> None:
    with pytest.raises(ValueError, match="not in"):
        PacketLoss(sim, 100)


def test_latency_is_netem_or_says_why_it_is_unavailable(sim: SimDevice) -> None:
    fault = Latency(sim, 50)
    why = fault.unavailable()
    if why is not None:
        assert "netem" in why
        with pytest.raises(FaultUnavailable, match="latency unavailable"):
            fault.apply()
        return
    with fault:
        shown = sim.run(["tc", "qdisc", "show", "dev", sim.uplink_iface]).stdout
        assert "netem" in shown
        assert "delay 50ms" in shown


def test_throttle_shapes_traffic_towards_the_device(sim: SimDevice) -> None:
    port = 7004
    sink = serve_in(
        sim,
        f"import socket\ns = socket.create_server(('{sim.address}', {port}))\n"
        "c, _ = s.accept()\nn = 0\nwhile (b := c.recv(65536)):\n    n += len(b)\nprint(n)",
        "sink",
    )
    wait_listening(sim, port, sink)
    throttle = Throttle(sim, 8000)
    with throttle:
        host = sim.host_egress()
        assert host is not None
        with socket.create_connection((sim.address, port), timeout=10) as c:
            c.sendall(b"\0" * 1_000_000)
        deadline = time.monotonic() + 30
        while sink.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sink.tail(1).strip() == "1000000"
        stats = shell.run(["tc", "-s", "qdisc", "show", "dev", host[1]]).stdout
    assert "tbf" in stats
    assert "rate 8Mbit" in stats
    sent = int(stats.split("Sent ")[1].split()[0])
    assert sent >= 1_000_000  # the transfer went through the shaper
    after = shell.run(["tc", "qdisc", "show", "dev", host[1]]).stdout
    assert "tbf" not in after


@pytest.fixture
def fleet(lan: netns.Lan, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path / "fleet", broker_host=lan.host_ip)
    f.prepare([])
    f.start()
    try:
        yield f
    finally:
        f.stop()


def test_broker_restart_takes_the_broker_away_and_back(fleet: Fleet) -> None:
    addr = (fleet.broker_host, fleet.broker_port)
    socket.create_connection(addr, timeout=5).close()
    fault = BrokerRestart(fleet)
    fault.apply()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(addr, timeout=5)
    assert not fleet.healthy()
    fault.clear()
    socket.create_connection(addr, timeout=5).close()
    assert fleet.healthy()
    assert fault.record()["start_s"] > 0


class _ScriptAgent(SimDevice):
    """A device whose "agent" is a process that only sleeps: the injector under test
    kills and restarts whatever runs as the agent."""

    @property
    def edge_agent(self) -> str:
        script = Path(self.home) / "fake-agent"
        script.write_text("#!/bin/sh\nexec sleep 600\n")
        script.chmod(0o755)
        return str(script)


def test_agent_kill_sigkills_the_agent_and_starts_a_new_one(lan: netns.Lan, tmp_path: Path) -> None:
    dev = _ScriptAgent("tkill", lan, 197, tmp_path)
    netns.cleanup_stale([dev.ns.name])
    Path(dev.home).mkdir(parents=True)
    dev.ns.create()
    try:
        dev.start_agent()
        first = dev.agent
        assert isinstance(first, shell.Proc)
        fault = AgentKill(dev)
        fault.apply()
        first.popen.wait(10)
        assert first.returncode == -signal.SIGKILL
        fault.clear()
        second = dev.agent
        assert isinstance(second, shell.Proc)
        assert second.alive()
        assert second.pid != first.pid
        os.kill(second.pid, 0)
    finally:
        dev.teardown()
