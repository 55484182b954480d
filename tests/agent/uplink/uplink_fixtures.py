"""Fixtures of the uplink tests: identities enrolled through a real HTTP endpoint and
fleet CA, a managed Mosquitto with TLS and per-device ACLs, the fleet's own identity as
a subscriber, a real decision log."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.decisionlog import DecisionLog, DecisionLogConfig
from agent.enrollment.identity import Identity, enroll
from agent.uplink import Uplink, UplinkConfig
from fleet_server.broker import ManagedBroker, MosquittoConfig
from tests.agent.decisionlog.decisionlog_driver import make_record
from tests.agent.enrollment.fleet_enroll_server import EnrollServer
from tests.agent.update.tuf_repo import TufRepo
from tests.support.broker import free_port
from tests.support.tls_peers import WAIT_S, Peer, Pki, make_ca

FAST = UplinkConfig(
    enabled=True,
    heartbeat_interval_s=0.1,
    health_interval_s=0.3,
    decisions_interval_s=0.1,
    ack_timeout_s=5.0,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    return Pki(directory, make_ca(directory))


def _broker_config(pki: Pki, state_dir: Path) -> MosquittoConfig:
    return MosquittoConfig(
        port=free_port(),
        state_dir=state_dir,
        cafile=pki.ca.cert_path,
        crlfile=pki.ca.crl_path,
        certfile=pki.cert("server"),
        keyfile=pki.key("server"),
    )


@pytest.fixture(scope="module")
def broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedBroker]:
    with ManagedBroker(_broker_config(pki, tmp_path_factory.mktemp("broker"))) as managed:
        yield managed


@pytest.fixture(scope="module")
def server(
    pki: Pki, broker: ManagedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EnrollServer]:
    repo = TufRepo(tmp_path_factory.mktemp("repo"))
    root = (repo.metadata_dir / "root.json").read_bytes()
    srv = EnrollServer(pki.ca, broker.config.port, root).start()
    yield srv
    srv.stop()


@pytest.fixture
def enrolled(server: EnrollServer, tmp_path: Path) -> Callable[[str], Identity]:
    def _enroll(device_id: str) -> Identity:
        state = tmp_path / device_id
        token = server.issue(device_id, {"line": "3"}, "jetson-orin")
        return enroll(server.url, token, state, device_id, trust_dir=state / "trust")

    return _enroll


@pytest.fixture
def fleet(pki: Pki, broker: ManagedBroker) -> Iterator[Callable[..., Peer]]:
    peers: list[Peer] = []

    def _connect(port: int | None = None) -> Peer:
        peer = Peer(
            port or broker.config.port,
            pki.ca.cert_path,
            pki.cert("fleet-server"),
            pki.key("fleet-server"),
        )
        assert peer.connect(), "the fleet's own identity was refused"
        peers.append(peer)
        return peer

    yield _connect
    for peer in peers:
        peer.close()


@pytest.fixture
def uplinks() -> Iterator[list[Uplink]]:
    started: list[Uplink] = []
    yield started
    for uplink in started:
        uplink.stop()


def collect(
    peer: Peer, done: Callable[[list[tuple[str, bytes]]], bool], timeout_s: float = WAIT_S
) -> list[tuple[str, bytes]]:
    """Messages received until ``done(messages)`` (or the timeout)."""
    got: list[tuple[str, bytes]] = []
    end = time.monotonic() + timeout_s
    while not done(got):
        left = end - time.monotonic()
        if left <= 0:
            raise AssertionError(f"not done within {timeout_s} s; got {[t for t, _ in got]}")
        try:
            got.append(peer.inbox.get(timeout=min(left, 0.2)))
        except queue.Empty:
            continue
    return got


def wait_until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.02)


def on(topic: str) -> Callable[[list[tuple[str, bytes]]], list[bytes]]:
    return lambda got: [p for t, p in got if t == topic]


def thermal_tree(root: Path) -> Path:
    for zone, kind, temp in (("thermal_zone0", "cpu-thermal", "45500\n"),
                             ("thermal_zone1", "gpu-thermal", "off\n"),
                             ("thermal_zone2", "cpu-thermal", "-2000\n")):  # fmt: skip
        (root / zone).mkdir(parents=True)
        (root / zone / "type").write_text(kind + "\n")
        (root / zone / "temp").write_text(temp)
    return root


def open_log(state: Path, device_id: str, count: int) -> tuple[DecisionLog, list[str]]:
    dlog = DecisionLog(state, DecisionLogConfig(thumbnails="none"), device_id=device_id)
    dlog.open()
    now = time.time()
    ids = [dlog.append(make_record(i, now - 10 + i * 0.01)) for i in range(count)]
    assert dlog.flush()
    return dlog, ids
