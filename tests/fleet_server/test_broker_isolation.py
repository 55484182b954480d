"""One enrolled device's certificate can't hurt the rest of the fleet on the managed
Mosquitto (issue 13): it can't take over another client's session (with
``clientid_is_identity``), can't divert ingest's shared subscription (the group is a
secret), and each fleet service holds its own identity with only the topics it uses.
Real broker, real TLS identities from the fleet CA, real paho clients; "not delivered"
is proven by :meth:`Peer.flush` (no sleeping)."""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.wire import topics
from fleet_server.broker import ManagedBroker, MosquittoConfig, acl_text, identity, mosquitto_conf
from fleet_server.ca import NameRefused
from fleet_server.ca.names import check_name
from fleet_server.config import IngestSection
from tests.support.broker import free_port
from tests.support.tls_peers import Peer, Pki, enroll, make_ca, save_identity

NOT_AUTHORIZED = 0x87
WAIT_S = 10.0
SERVICES = identity.services_for(2)
GUESSES = ("ingest", "fleet", "edgefleet", "fleet-ingest", "ingest-0")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory)
    for device in ("dev-a", "dev-b"):
        enroll(ca, directory, device)
    for service in SERVICES:
        key_pem, issued = ca.issue_service(identity.service_cn(service))
        save_identity(directory, f"svc-{service}", key_pem, issued.cert_pem)
    return Pki(directory, ca)


def _broker(pki: Pki, state_dir: Path, **extra: Any) -> ManagedBroker:
    config = MosquittoConfig(
        port=free_port(),
        state_dir=state_dir,
        cafile=pki.ca.cert_path,
        crlfile=pki.ca.crl_path,
        certfile=pki.cert("server"),
        keyfile=pki.key("server"),
        **extra,
    )
    return ManagedBroker(config, services=SERVICES)


@pytest.fixture(scope="module")
def strict(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedBroker]:
    """The broker with clientid_is_identity: the client id is the certificate's CN."""
    broker = _broker(pki, tmp_path_factory.mktemp("strict"), clientid_is_identity=True)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def loose(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedBroker]:
    """The broker with clientid_is_identity turned off (the default is on)."""
    broker = _broker(pki, tmp_path_factory.mktemp("loose"), clientid_is_identity=False)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def peers() -> Iterator[list[Peer]]:
    made: list[Peer] = []
    yield made
    for peer in made:
        peer.close()


def _connect(
    peers: list[Peer], pki: Pki, broker: ManagedBroker, name: str, client_id: str = ""
) -> Peer:
    peer = Peer(broker.config.port, pki.ca.cert_path, pki.cert(name), pki.key(name), client_id)
    peers.append(peer)
    assert peer.connect(), f"{name} was refused"
    return peer


def _wait_log(broker: ManagedBroker, text: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if any(text in line for line in broker.log_tail()):
            return
        time.sleep(0.02)
    raise AssertionError(f"mosquitto never logged {text!r}: {broker.log_tail()[-5:]}")


# --- sessions: no takeover ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("victim", "victim_topic"),
    [
        ("dev-a", topics.state("dev-a")),
        ("svc-files", topics.fetch_response("dev-a")),
        ("svc-ingest-0", None),
    ],
)
def test_a_device_naming_another_clients_id_does_not_kick_it(
    peers: list[Peer], pki: Pki, strict: ManagedBroker, victim: str, victim_topic: str | None
) -> None:
    target = _connect(peers, pki, strict, victim)
    victim_id = "dev-a" if victim == "dev-a" else identity.service_cn(victim.removeprefix("svc-"))
    attacker = _connect(peers, pki, strict, "dev-b", client_id=victim_id)
    # the attacker's session took its own CN, not the victim's client id
    _wait_log(strict, "as dev-b (")
    if victim_topic is not None:
        assert not target.publish(victim_topic, b"still here").is_failure
    target.flush()  # a PUBACK on the victim's own connection: it was not closed
    assert not target.closed
    assert not attacker.closed


def test_without_clientid_is_identity_the_same_attack_kicks_the_victim(
    peers: list[Peer], pki: Pki, loose: ManagedBroker
) -> None:
    """Why the option exists (and proof the test above can fail)."""
    target = _connect(peers, pki, loose, "svc-files", client_id=identity.service_cn("files"))
    _connect(peers, pki, loose, "dev-b", client_id=identity.service_cn("files"))
    target.wait_closed()


# --- the ingest group ------------------------------------------------------------------


def _ingest(peers: list[Peer], pki: Pki, broker: ManagedBroker, group: str) -> list[Peer]:
    workers = [_connect(peers, pki, broker, f"svc-ingest-{i}") for i in range(2)]
    for worker in workers:
        codes = worker.subscribe(topics.shared(group, topics.device_filter(topics.heartbeat)))
        assert not codes[0].is_failure
    return workers


def _heartbeats(peers: list[Peer], pki: Pki, broker: ManagedBroker, count: int) -> None:
    dev_a = _connect(peers, pki, broker, "dev-a")
    for i in range(count):
        assert not dev_a.publish(topics.heartbeat("dev-a"), str(i).encode()).is_failure


def test_a_device_in_a_guessed_group_does_not_reduce_what_ingest_receives(
    peers: list[Peer], pki: Pki, strict: ManagedBroker, tmp_path: Path
) -> None:
    group = identity.ingest_group(tmp_path)  # what fleet-server serve generates
    workers = _ingest(peers, pki, strict, group)
    attacker = _connect(peers, pki, strict, "dev-b")
    for guess in GUESSES:
        heartbeats = topics.device_filter(topics.heartbeat)
        assert not attacker.subscribe(topics.shared(guess, heartbeats))[0].is_failure
    attacker.subscribe("#")  # granted by Mosquitto 2.0 (checked only at delivery)
    _heartbeats(peers, pki, strict, 20)
    got = sorted(int(p) for w in workers for _, p in w.flush())
    assert got == list(range(20))
    assert attacker.flush() == []


def test_a_device_that_knows_the_group_takes_a_share_of_the_reports(
    peers: list[Peer], pki: Pki, strict: ManagedBroker, tmp_path: Path
) -> None:
    """The measured behaviour that makes the group a secret: the broker hands the
    device its share, then drops it (the device may not read it): those reports are
    lost although dev-a got its PUBACKs."""
    group = identity.ingest_group(tmp_path)
    workers = _ingest(peers, pki, strict, group)
    attacker = _connect(peers, pki, strict, "dev-b")
    attacker.subscribe(topics.shared(group, topics.device_filter(topics.heartbeat)))
    _heartbeats(peers, pki, strict, 30)
    got = [p for w in workers for _, p in w.flush()]
    assert attacker.flush() == []
    assert len(got) < 30


def test_the_ingest_group_is_generated_kept_and_private(tmp_path: Path) -> None:
    group = identity.ingest_group(tmp_path / "state")
    kept = tmp_path / "state" / identity.GROUP_FILE
    assert kept.read_text().strip() == group
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert group.startswith("ingest-")
    assert len(group.removeprefix("ingest-")) == 32  # 128 bits, hex
    int(group.removeprefix("ingest-"), 16)
    assert identity.ingest_group(tmp_path / "state") == group  # the same after a restart
    assert identity.ingest_group(tmp_path / "other") != group
    assert identity.ingest_group(tmp_path / "state", "x" * 3 + group) == "x" * 3 + group


def test_a_kept_group_that_is_not_generated_is_refused(tmp_path: Path) -> None:
    (tmp_path / identity.GROUP_FILE).write_text("ingest\n")
    with pytest.raises(identity.IdentityError, match="does not hold a generated group"):
        identity.ingest_group(tmp_path)


@pytest.mark.parametrize("group", ["ingest", "fleet-ingest-group", "aaaaaaaaaaaaaaaaaaaa"])
def test_a_guessable_configured_group_is_refused_unless_allowed(group: str) -> None:
    with pytest.raises(ValidationError, match="guessable"):
        IngestSection(group=group)
    assert IngestSection(group=group, allow_guessable_group=True).group == group
    assert IngestSection(group="q7Fz2LmXw9Rt4KpVb3Nd").group == "q7Fz2LmXw9Rt4KpVb3Nd"
    assert IngestSection().group is None  # generated by the server


# --- fleet service identities --------------------------------------------------------


def test_each_service_reaches_only_the_topics_it_uses(
    peers: list[Peer], pki: Pki, strict: ManagedBroker
) -> None:
    files = _connect(peers, pki, strict, "svc-files")
    rollouts = _connect(peers, pki, strict, "svc-rollouts")
    ingest = _connect(peers, pki, strict, "svc-ingest-1")
    assert not files.publish(topics.fetch_response("dev-a"), b"chunk").is_failure
    assert files.publish(topics.directive("dev-a"), b"forged").value == NOT_AUTHORIZED
    assert not rollouts.publish(topics.directive("dev-a"), b"").is_failure
    assert rollouts.publish(topics.fetch_response("dev-a"), b"x").value == NOT_AUTHORIZED
    assert ingest.publish(topics.directive("dev-a"), b"x").value == NOT_AUTHORIZED
    assert ingest.publish(topics.heartbeat("dev-a"), b"x").value == NOT_AUTHORIZED


def test_a_device_certificate_cannot_carry_a_service_name(pki: Pki) -> None:
    for service in SERVICES:
        with pytest.raises(NameRefused):
            check_name(identity.service_cn(service))
    with pytest.raises(NameRefused, match="service identity"):
        pki.ca.issue_service("fleet:Not a name")
    with pytest.raises(NameRefused):
        pki.ca.issue_service("dev-a")


def test_acl_and_conf_name_each_service_and_the_limits(tmp_path: Path) -> None:
    blocks: dict[str, list[str]] = {}
    user = ""
    for line in acl_text("fleet-server", SERVICES).splitlines():
        if line.startswith("user "):
            user = line
            blocks[user] = []
        elif line.startswith("topic "):
            blocks[user].append(line)
    assert blocks["user fleet:files"] == [
        "topic read edgefleet/devices/+/fetch/request",
        "topic write edgefleet/devices/+/fetch/response",
    ]
    assert blocks["user fleet:rollouts"] == ["topic write edgefleet/devices/+/directive"]
    ingest = blocks["user fleet:ingest-1"]
    assert "topic read edgefleet/devices/+/heartbeat" in ingest
    assert all(line.startswith("topic read edgefleet/devices/+/") for line in ingest)
    assert "topic read edgefleet/devices/+/fetch/request" not in ingest
    assert blocks["user fleet-server"][0] == "topic readwrite edgefleet/#"
    with pytest.raises(ValueError, match="not a fleet service"):
        acl_text("fleet-server", ["mallory"])
    base = {"state_dir": tmp_path}
    conf = mosquitto_conf(MosquittoConfig(**base))
    assert "\nuse_identity_as_username true\nuse_username_as_clientid true\n" in conf  # default
    loose = mosquitto_conf(MosquittoConfig(**base, clientid_is_identity=False))
    assert "use_username_as_clientid" not in loose
    assert "\nmax_queued_bytes 268435456\n" in conf
    assert "\nmax_queued_messages 100000\n" in conf
    assert "\nmax_packet_size 1048576\n" in conf
    assert "\nmax_inflight_bytes 67108864\n" in conf  # in flight counts (issue 26)
    strict = mosquitto_conf(MosquittoConfig(**base, clientid_is_identity=True))
    assert strict == conf
