"""The managed Mosquitto keeps devices apart: a real broker (ManagedBroker on a free
loopback port), real TLS identities from the fleet CA, real clients (paho-mqtt 2 with
MQTT 5, mosquitto_pub / mosquitto_sub). "Not delivered" is proven by
:meth:`tests.support.tls_peers.Peer.flush`, without sleeping.
"""

from __future__ import annotations

import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from agent.wire import topics
from fleet_server.broker import (
    DEVICE_READS,
    DEVICE_WRITES,
    BrokerError,
    ManagedBroker,
    MosquittoConfig,
    acl_text,
    identity,
    mosquitto_conf,
)
from fleet_server.ca import FleetCA, NameRefused, make_device_key_and_csr
from tests.support.broker import free_port
from tests.support.tls_peers import (
    WAIT_S,
    Peer,
    Pki,
    bypass_certificate,
    enroll,
    make_ca,
    save_identity,
)

NOT_AUTHORIZED = 0x87
SERVICES = identity.services_for(2)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory)
    for device in ("dev-a", "dev-b"):
        enroll(ca, directory, device)
    for service in SERVICES:
        key_pem, issued = ca.issue_service(identity.service_cn(service))
        save_identity(directory, f"svc-{service}", key_pem, issued.cert_pem)
    bypass_certificate(ca, directory, "#", "cn-hash")
    bypass_certificate(ca, directory, "+", "cn-plus")
    bypass_certificate(ca, directory, "dev-b/install", "cn-slash")
    foreign = make_ca(directory / "foreign")
    enroll(foreign, directory, "dev-a", name="foreign-dev-a")
    return Pki(directory, ca)


def _config(pki: Pki, state_dir: Path, **extra: Any) -> MosquittoConfig:
    return MosquittoConfig(
        port=free_port(),
        state_dir=state_dir,
        cafile=pki.ca.cert_path,
        crlfile=pki.ca.crl_path,
        certfile=pki.cert("server"),
        keyfile=pki.key("server"),
        **extra,
    )


@pytest.fixture(scope="module")
def broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedBroker]:
    managed = ManagedBroker(_config(pki, tmp_path_factory.mktemp("broker")), services=SERVICES)
    managed.start()
    yield managed
    managed.stop()


@pytest.fixture
def connect(pki: Pki, broker: ManagedBroker) -> Iterator[Any]:
    peers: list[Peer] = []

    def _connect(name: str, client_id: str = "", *, port: int | None = None) -> Peer:
        peer = Peer(
            port or broker.config.port, pki.ca.cert_path, pki.cert(name), pki.key(name), client_id
        )
        peers.append(peer)
        assert peer.connect(), f"{name} was refused"
        return peer

    yield _connect
    for peer in peers:
        peer.close()


def _own_topics(device: str) -> list[str]:
    return [t(device) for t in (*DEVICE_WRITES, *DEVICE_READS)]


# --- what a device may do ---------------------------------------------------------------


def test_device_reads_its_directive_and_writes_its_reports(connect: Any) -> None:
    fleet = connect("fleet-server")
    dev_a = connect("dev-a")
    assert not dev_a.subscribe(topics.directive("dev-a"))[0].is_failure
    assert not dev_a.subscribe(topics.fetch_response("dev-a"))[0].is_failure
    assert not fleet.subscribe(f"{topics.PREFIX}/devices/dev-a/#")[0].is_failure

    assert not fleet.publish(topics.directive("dev-a"), b"run v2").is_failure
    assert not fleet.publish(topics.fetch_response("dev-a"), b"chunk").is_failure
    assert sorted(dev_a.flush()) == sorted(
        [(topics.directive("dev-a"), b"run v2"), (topics.fetch_response("dev-a"), b"chunk")]
    )
    for topic_of in DEVICE_WRITES:
        assert not dev_a.publish(topic_of("dev-a"), b"report").is_failure, topic_of.__name__
    got = {t for t, _ in fleet.flush()}
    assert {t("dev-a") for t in DEVICE_WRITES} <= got


def test_device_cannot_forge_its_own_directive_or_fetch_response(connect: Any) -> None:
    fleet = connect("fleet-server")
    fleet.subscribe(f"{topics.PREFIX}/devices/dev-a/#")
    dev_a = connect("dev-a")
    for topic_of in DEVICE_READS:
        assert dev_a.publish(topic_of("dev-a"), b"forged").value == NOT_AUTHORIZED
    assert fleet.flush() == []


# --- device A against device B ----------------------------------------------------------


def test_publish_to_another_devices_topics_is_refused_and_never_delivered(connect: Any) -> None:
    fleet = connect("fleet-server")
    dev_b = connect("dev-b")
    fleet.subscribe(f"{topics.PREFIX}/devices/dev-b/#")
    dev_b.subscribe(topics.directive("dev-b"))
    dev_b.subscribe(topics.fetch_response("dev-b"))
    dev_a = connect("dev-a")
    for topic in _own_topics("dev-b"):
        rc = dev_a.publish(topic, b"from dev-a")
        assert rc.is_failure, topic
        assert rc.value == NOT_AUTHORIZED, topic
    assert dev_a.publish(topics.directive("dev-b"), b"retained", retain=True).is_failure
    assert fleet.flush() == []
    assert dev_b.flush() == []
    late = connect("dev-b", "dev-b-late")  # a retained forgery would reach a new subscriber
    late.subscribe(topics.directive("dev-b"))
    assert late.flush() == []


@pytest.mark.parametrize(
    "pattern",
    [
        f"{topics.PREFIX}/devices/dev-b/#",
        f"{topics.PREFIX}/devices/+/directive",
        f"{topics.PREFIX}/#",
        "#",
        "$SYS/#",
    ],
)
def test_subscribing_to_another_devices_topics_receives_nothing(connect: Any, pattern: str) -> None:
    fleet = connect("fleet-server")
    fleet.publish(topics.directive("dev-b"), b"retained for dev-b", retain=True)
    dev_a = connect("dev-a")
    codes = dev_a.subscribe(pattern)
    # Mosquitto 2.0 grants the subscription and filters each message by the read ACL
    # at delivery; a broker that refuses it in the SUBACK is as good.
    assert len(codes) == 1
    dev_b = connect("dev-b")
    for topic in _own_topics("dev-b"):
        (dev_b if topic in {t("dev-b") for t in DEVICE_WRITES} else fleet).publish(topic, b"b")
    fleet.publish(topics.directive("dev-a"), b"for dev-a")
    got = dev_a.flush()
    fleet.publish(topics.directive("dev-b"), b"", retain=True)  # clear it for other tests
    assert all(t == topics.directive("dev-a") for t, _ in got), got
    assert not any(t.startswith("$SYS") or "dev-b" in t for t, _ in got)


# --- identities the ACL patterns must not be fooled by -----------------------------------


@pytest.mark.parametrize("client_id", ["#", "+", "dev-b/#"])
def test_client_id_with_wildcards_gets_no_access_even_with_a_valid_certificate(
    connect: Any, client_id: str
) -> None:
    fleet = connect("fleet-server")
    fleet.subscribe(f"{topics.PREFIX}/devices/#")
    sneaky = connect("dev-a", client_id)
    sneaky.subscribe(f"{topics.PREFIX}/#")
    # The broker binds the client id to the certificate (clientid_is_identity, on by
    # default): the id is dev-a's CN whatever was asked, so dev-a's own topics stay its own.
    for topic in (topics.state("dev-b"), topics.directive("dev-b"), topics.events("dev-b")):
        assert sneaky.publish(topic, b"attack").value == NOT_AUTHORIZED
    fleet.publish(topics.directive("dev-b"), b"for dev-b")
    fleet.publish(topics.directive("dev-a"), b"for dev-a")
    got = sneaky.flush()
    assert got == [(topics.directive("dev-a"), b"for dev-a")]  # dev-a's own, nothing else
    assert all(p != b"attack" for _, p in fleet.flush())


@pytest.mark.parametrize("identity", ["cn-hash", "cn-plus"])
def test_certificate_named_with_a_wildcard_gets_no_access(connect: Any, identity: str) -> None:
    """CN '#' would turn edgefleet/devices/%u/state into a filter over every device; the
    CA refuses such names, and Mosquitto 2 denies pattern access to such a user too."""
    fleet = connect("fleet-server")
    fleet.subscribe(f"{topics.PREFIX}/devices/#")
    wild = connect(identity)
    wild.subscribe(f"{topics.PREFIX}/#")
    wild.subscribe(f"{topics.PREFIX}/devices/+/directive")
    for topic in _own_topics("dev-b"):
        assert wild.publish(topic, b"attack").value == NOT_AUTHORIZED, topic
    fleet.publish(topics.directive("dev-b"), b"for dev-b")
    assert wild.flush() == []
    seen = fleet.flush()  # (a retained directive of an earlier test may come too)
    assert (topics.directive("dev-b"), b"for dev-b") in seen
    assert all(p != b"attack" for _, p in seen)


def test_slash_in_a_cn_would_reach_another_device_so_the_ca_refuses_it(
    connect: Any, pki: Pki
) -> None:
    """The broker does not stop this one: CN 'dev-b/install' matches the pattern
    edgefleet/devices/%u/state as dev-b's install/state. Refusing '/' at issue time is
    what keeps device ids one topic level."""
    fleet = connect("fleet-server")
    fleet.subscribe(topics.install_state("dev-b"))
    slash = connect("cn-slash")
    assert not slash.publish(topics.install_state("dev-b"), b"forged").is_failure
    assert fleet.flush() == [(topics.install_state("dev-b"), b"forged")]
    _, csr = make_device_key_and_csr("dev-c")
    with pytest.raises(NameRefused):
        pki.ca.sign_device_csr(csr, "dev-b/install")


def test_denied_qos1_publish_is_a_failure_for_a_paho_client(connect: Any) -> None:
    dev_a = connect("dev-a")
    rc = dev_a.publish(topics.directive("dev-b"), b"x")
    assert rc.is_failure
    assert rc == ReasonCode(PacketTypes.PUBACK, "Not authorized")
    assert not dev_a.closed, "a refused publish does not cost the connection"


def _with_will(pki: Pki, broker: ManagedBroker, name: str, will_topic: str) -> Peer:
    peer = Peer(broker.config.port, pki.ca.cert_path, pki.cert(name), pki.key(name))
    peer.client.will_set(will_topic, b"offline", qos=1, retain=True)
    return peer


def test_last_will_marks_only_the_devices_own_availability(
    connect: Any, pki: Pki, broker: ManagedBroker
) -> None:
    fleet = connect("fleet-server")
    fleet.subscribe(topics.device_filter(topics.availability))
    will = ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message")
    for target in ("dev-a", "dev-b"):
        dev_a = _with_will(pki, broker, "dev-a", topics.availability(target))
        if dev_a.connect():  # a broker may refuse the forged will at CONNECT instead
            dev_a.client.disconnect(reasoncode=will)
            dev_a.wait_closed()
        dev_a.close()
    got = fleet.flush()
    fleet.publish(topics.availability("dev-a"), b"", retain=True)  # clear for other tests
    assert got == [(topics.availability("dev-a"), b"offline")]


def test_fleet_server_reads_device_reports_on_a_shared_subscription(connect: Any) -> None:
    workers = [connect(f"svc-ingest-{i}") for i in range(2)]
    group = identity.new_group()
    for worker in workers:
        codes = worker.subscribe(topics.shared(group, topics.device_filter(topics.heartbeat)))
        assert not codes[0].is_failure
    dev_a = connect("dev-a")
    for i in range(10):
        assert not dev_a.publish(topics.heartbeat("dev-a"), str(i).encode()).is_failure
    got = [m for worker in workers for m in worker.flush()]
    assert sorted(p for _, p in got) == [str(i).encode() for i in range(10)]


# --- certificates the broker must refuse ------------------------------------------------


def test_certificate_from_a_foreign_ca_is_refused(pki: Pki, broker: ManagedBroker) -> None:
    peer = Peer(
        broker.config.port, pki.ca.cert_path, pki.cert("foreign-dev-a"), pki.key("foreign-dev-a")
    )
    assert not peer.connect()
    peer.close()


def test_broker_server_certificate_is_not_a_client_identity(
    pki: Pki, broker: ManagedBroker
) -> None:
    peer = Peer(broker.config.port, pki.ca.cert_path, pki.cert("server"), pki.key("server"))
    assert not peer.connect()
    peer.close()
    why = subprocess.run(
        ["openssl", "verify", "-purpose", "sslclient", "-CAfile", str(pki.ca.cert_path),
         str(pki.cert("server"))],
        capture_output=True, text=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert "certificate purpose" in why.stdout + why.stderr  # the reason: no clientAuth


def test_client_without_a_certificate_is_refused(pki: Pki, broker: ManagedBroker) -> None:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    c.tls_set(ca_certs=str(pki.ca.cert_path))
    refused = threading.Event()
    c.on_connect = lambda *a: refused.set() if a[3].is_failure else None
    c.on_disconnect = lambda *a: refused.set()
    try:
        c.connect("127.0.0.1", broker.config.port, keepalive=30)
    except OSError:
        refused.set()
    c.loop_start()
    assert refused.wait(WAIT_S)
    c.disconnect()
    c.loop_stop()


def _revocable(pki: Pki, tmp_path: Path) -> tuple[ManagedBroker, FleetCA, int]:
    broker = ManagedBroker(_config(pki, tmp_path / "broker"))
    serial = enroll(pki.ca, pki.dir, "dev-r", name=f"dev-r-{tmp_path.name}")
    broker.start()
    return broker, pki.ca, serial


def test_revoked_certificate_is_refused_once_the_broker_reloads_the_crl(
    pki: Pki, tmp_path: Path
) -> None:
    broker, ca, serial = _revocable(pki, tmp_path)
    name = f"dev-r-{tmp_path.name}"
    try:
        before = Peer(broker.config.port, ca.cert_path, pki.cert(name), pki.key(name))
        assert before.connect()
        ca.revoke(serial)
        broker.reload()
        after = Peer(broker.config.port, ca.cert_path, pki.cert(name), pki.key(name))
        assert not after.connect()
        after.close()
        assert not before.closed, "reload keeps live sessions (restart() cuts them)"
        other = Peer(broker.config.port, ca.cert_path, pki.cert("dev-b"), pki.key("dev-b"))
        assert other.connect(), "an unrevoked device still connects"
        other.close()
        before.close()
        assert "certificate verify failed" in " ".join(broker.log_tail())
    finally:
        broker.stop()


def test_restart_cuts_a_revoked_devices_live_session_and_keeps_retained_messages(
    pki: Pki, tmp_path: Path
) -> None:
    broker, ca, serial = _revocable(pki, tmp_path)
    name = f"dev-r-{tmp_path.name}"
    try:
        fleet = Peer(
            broker.config.port, ca.cert_path, pki.cert("fleet-server"), pki.key("fleet-server")
        )
        assert fleet.connect()
        fleet.publish(topics.directive("dev-b"), b"kept", retain=True)
        fleet.close()
        live = Peer(broker.config.port, ca.cert_path, pki.cert(name), pki.key(name))
        assert live.connect()
        ca.revoke(serial)
        broker.restart()
        live.wait_closed()
        live.close()
        again = Peer(broker.config.port, ca.cert_path, pki.cert(name), pki.key(name))
        assert not again.connect()
        again.close()
        dev_b = Peer(broker.config.port, ca.cert_path, pki.cert("dev-b"), pki.key("dev-b"))
        assert dev_b.connect()
        dev_b.subscribe(topics.directive("dev-b"))
        assert dev_b.flush() == [(topics.directive("dev-b"), b"kept")]
        dev_b.close()
    finally:
        broker.stop()


# --- the same with mosquitto_pub / mosquitto_sub -----------------------------------------


def _cli(pki: Pki, broker: ManagedBroker, name: str) -> list[str]:
    return ["-h", "127.0.0.1", "-p", str(broker.config.port), "-V", "mqttv5",
            "--cafile", str(pki.ca.cert_path),
            "--cert", str(pki.cert(name)), "--key", str(pki.key(name))]  # fmt: skip


def _pub(pki: Pki, broker: ManagedBroker, name: str, topic: str, *extra: str) -> str:
    done = subprocess.run(
        ["mosquitto_pub", *_cli(pki, broker, name), "-t", topic, "-m", "x", "-q", "1", "-d",
         *extra],
        capture_output=True, text=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    return done.stdout + done.stderr


def test_mosquitto_pub_to_another_device_is_not_authorized_and_mosquitto_sub_sees_nothing(
    pki: Pki, broker: ManagedBroker
) -> None:
    sub = subprocess.Popen(
        ["stdbuf", "-oL", "mosquitto_sub", *_cli(pki, broker, "dev-b"),
         "-t", topics.fetch_response("dev-b"),
         "-q", "1", "-C", "1", "-W", "20", "-v", "-d"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue(maxsize=1000)

    def read() -> None:
        for line in sub.stdout or []:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while "Subscribed" not in lines.get(timeout=WAIT_S):
            pass
        out = _pub(pki, broker, "dev-a", topics.fetch_response("dev-b"))
        assert "RC:135" in out, out
        assert "Not authorized" in out, out
        out = _pub(pki, broker, "dev-a", topics.state("dev-b"), "-i", "#")
        assert "RC:135" in out, f"client id '#' must get no other device's access: {out}"
        out = _pub(pki, broker, "fleet-server", topics.fetch_response("dev-b"))
        assert "RC:135" not in out, out
        assert "PUBACK" in out, out
        sub.wait(WAIT_S)
        reader.join(WAIT_S)
        received = [x.strip() for x in list(lines.queue) if x.startswith(topics.PREFIX)]
        assert received == [f"{topics.fetch_response('dev-b')} x"]
        assert sub.returncode == 0
    finally:
        sub.kill()
        sub.wait(WAIT_S)


def test_mosquitto_clients_with_a_foreign_ca_certificate_are_refused(
    pki: Pki, broker: ManagedBroker
) -> None:
    out = subprocess.run(
        ["mosquitto_pub", *_cli(pki, broker, "foreign-dev-a"), "-t", topics.state("dev-a"),
         "-m", "x", "-q", "1"],
        capture_output=True, text=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert out.returncode != 0
    sub = subprocess.run(
        ["mosquitto_sub", *_cli(pki, broker, "foreign-dev-a"), "-t", topics.directive("dev-a"),
         "-C", "1", "-W", "3"],
        capture_output=True, text=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert sub.returncode != 0
    assert sub.stdout == ""


# --- the broker's own files and process -----------------------------------------------


def test_acl_denies_by_default_and_grants_each_device_only_its_listed_topics() -> None:
    text = acl_text("fleet-server")
    rules = [x for x in text.splitlines() if x and not x.startswith("#")]
    patterns = [x for x in rules if x.startswith("pattern")]
    assert len(patterns) == len(DEVICE_WRITES) + len(DEVICE_READS)
    assert all(x.split()[2].startswith(f"{topics.PREFIX}/devices/%u/") for x in patterns)
    assert not any("#" in x.split()[2] or "+" in x.split()[2] for x in patterns)
    assert "pattern write edgefleet/devices/%u/state" in patterns
    assert "pattern read edgefleet/devices/%u/directive" in patterns
    assert not any(x.startswith("topic") for x in rules[: rules.index("user fleet-server")])
    with pytest.raises(ValueError, match="user name"):
        acl_text("evil\ntopic readwrite #")


def test_conf_requires_a_certificate_and_takes_the_cn_as_user_name(tmp_path: Path) -> None:
    conf = mosquitto_conf(MosquittoConfig(state_dir=tmp_path, port=8883, max_packet_size=4096))
    lines = conf.splitlines()
    for setting in ("require_certificate true", "use_identity_as_username true",
                    "allow_anonymous false", "max_packet_size 4096", "listener 8883 127.0.0.1",
                    f"acl_file {tmp_path / 'acl'}"):  # fmt: skip
        assert setting in lines
    with pytest.raises(ValueError, match="control character"):
        MosquittoConfig(state_dir=Path("/tmp/x\nallow_anonymous true"))
    with pytest.raises(ValueError, match="Extra inputs"):
        MosquittoConfig(allow_anonymous=True)  # type: ignore[call-arg]


def test_broker_that_cannot_listen_fails_with_mosquittos_reason(pki: Pki, tmp_path: Path) -> None:
    cfg = _config(pki, tmp_path / "broker")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", cfg.port))
        busy.listen(1)
        managed = ManagedBroker(cfg)
        with pytest.raises(BrokerError, match="exited") as info:
            managed.start()
    assert any("Address already in use" in x for x in info.value.log_tail)
    assert not managed.running


def test_broker_without_its_tls_files_does_not_start(pki: Pki, tmp_path: Path) -> None:
    cfg = _config(pki, tmp_path / "broker").model_copy(update={"crlfile": tmp_path / "none.pem"})
    with pytest.raises(BrokerError, match="crlfile"):
        ManagedBroker(cfg).start()


def test_packet_over_the_limit_is_not_delivered(pki: Pki, tmp_path: Path) -> None:
    with ManagedBroker(_config(pki, tmp_path / "broker", max_packet_size=4096)) as small:
        fleet = Peer(
            small.config.port, pki.ca.cert_path, pki.cert("fleet-server"), pki.key("fleet-server")
        )
        assert fleet.connect()
        fleet.subscribe(topics.telemetry("dev-a"))
        dev_a = Peer(small.config.port, pki.ca.cert_path, pki.cert("dev-a"), pki.key("dev-a"))
        assert dev_a.connect()
        info = dev_a.client.publish(topics.telemetry("dev-a"), b"x" * 8192, qos=1)
        if info.rc == mqtt.MQTT_ERR_SUCCESS:  # paho sent it: the broker must drop the client
            dev_a.wait_closed()
        assert fleet.flush() == []
        fleet.close()
        dev_a.close()


def test_a_broker_left_by_a_killed_server_is_stopped_by_the_next_start(
    pki: Pki, tmp_path: Path
) -> None:
    config = _config(pki, tmp_path / "orphan")
    spec = tmp_path / "broker.json"
    spec.write_text(config.model_dump_json())
    driver = Path(__file__).with_name("broker_orphan_driver.py")
    server = subprocess.Popen(
        [sys.executable, str(driver), str(spec)], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    orphan = int(server.stdout.readline().split()[1])
    server.kill()  # the server dies; its Mosquitto (own session) does not
    server.wait(10)
    assert Path(f"/proc/{orphan}").exists()
    again = ManagedBroker(config)
    again.start()  # would fail with the port in use if the orphan were still there
    try:
        assert again.running
        assert again.pid != orphan
        assert (
            not Path(f"/proc/{orphan}").exists()
            or b"zombie" in Path(f"/proc/{orphan}/status").read_bytes().lower()
        )
    finally:
        again.stop()
