"""Enrollment and the device identity, against a real fleet CA behind a real HTTP
endpoint on loopback, a real managed Mosquitto (TLS, per-device ACL) and real files."""

from __future__ import annotations

import io
import json
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from paho.mqtt.enums import CallbackAPIVersion

from agent.enrollment.cli import cmd_enroll
from agent.enrollment.identity import (
    CA_FILE,
    CERT_FILE,
    FLEET_FILE,
    KEY_FILE,
    EnrollError,
    Identity,
    IdentityError,
    enroll,
    make_key_and_csr,
    tls_context,
)
from agent.kernel.errors import ConfigError
from agent.update.fetchers import MqttFetcher
from agent.update.trust import ROOT_FILE
from agent.wire import topics
from fleet_server.broker import ManagedBroker, MosquittoConfig
from fleet_server.distribution.file_server import MqttFileServer
from tests.agent.enrollment.fleet_enroll_server import EnrollServer
from tests.agent.update.tuf_repo import TufRepo
from tests.support.broker import free_port
from tests.support.tls_peers import WAIT_S, Pki, make_ca

NOT_AUTHORIZED = 0x87


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    return Pki(directory, make_ca(directory))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> TufRepo:
    return TufRepo(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedBroker]:
    config = MosquittoConfig(
        port=free_port(),
        state_dir=tmp_path_factory.mktemp("broker"),
        cafile=pki.ca.cert_path,
        crlfile=pki.ca.crl_path,
        certfile=pki.cert("server"),
        keyfile=pki.key("server"),
    )
    with ManagedBroker(config) as managed:
        yield managed


@pytest.fixture
def server(pki: Pki, broker: ManagedBroker, repo: TufRepo) -> Iterator[EnrollServer]:
    root = (repo.metadata_dir / "root.json").read_bytes()
    srv = EnrollServer(pki.ca, broker.config.port, root).start()
    yield srv
    srv.stop()


def _files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.exists() else set()


def test_enrollment_writes_a_device_made_key_0600_its_certificate_and_the_trust_root(
    server: EnrollServer, tmp_path: Path, repo: TufRepo
) -> None:
    token = server.issue("dev-a", {"line": "3"}, "jetson-orin")
    state = tmp_path / "state"
    identity = enroll(server.url, token, state, "dev-a", trust_dir=state / "trust")

    idir = state / "identity"
    assert identity.directory == idir
    assert _files(idir) == {KEY_FILE, CERT_FILE, CA_FILE, FLEET_FILE}
    assert stat.S_IMODE((idir / KEY_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE(idir.stat().st_mode) == 0o700
    cert = x509.load_pem_x509_certificate((idir / CERT_FILE).read_bytes())
    key = load_pem_private_key((idir / KEY_FILE).read_bytes(), password=None)
    assert cert.subject.rfc4514_string() == "CN=dev-a"
    assert cert.public_key() == key.public_key()
    assert (idir / CA_FILE).read_bytes() == server.ca.cert_path.read_bytes()
    assert (state / "trust" / ROOT_FILE).read_bytes() == (
        repo.metadata_dir / "root.json"
    ).read_bytes()
    fleet = json.loads((idir / FLEET_FILE).read_text())
    assert fleet["broker_port"] == server.broker_port
    assert fleet["labels"] == {"line": "3"}
    assert fleet["profile"] == "jetson-orin"
    assert Identity.load(state) == identity
    # the key was made here: the server saw a CSR, never a private key
    assert len(server.bodies) == 1
    assert b"PRIVATE KEY" not in server.bodies[0]
    assert b"CERTIFICATE REQUEST" in server.bodies[0]


def test_enrolled_identity_is_the_devices_user_at_the_broker(
    server: EnrollServer, broker: ManagedBroker, tmp_path: Path
) -> None:
    identity = enroll(
        server.url, server.issue("dev-u"), tmp_path, "dev-u", trust_dir=tmp_path / "trust"
    )
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="dev-u", protocol=mqtt.MQTTv5)
    identity.tls_configure(client)
    acks: dict[int, Any] = {}
    cond = threading.Condition()

    def on_publish(_c: Any, _u: Any, mid: int, rc: Any, _p: Any) -> None:
        with cond:
            acks[mid] = rc
            cond.notify_all()

    connected = threading.Event()
    client.on_connect = lambda *a: connected.set() if not a[3].is_failure else None
    client.on_publish = on_publish
    client.connect(identity.broker_host, identity.broker_port)
    client.loop_start()
    try:
        assert connected.wait(WAIT_S)
        own = client.publish(topics.heartbeat("dev-u"), b"{}", qos=1)
        other = client.publish(topics.heartbeat("dev-a"), b"{}", qos=1)
        with cond:
            assert cond.wait_for(lambda: {own.mid, other.mid} <= acks.keys(), WAIT_S)
        assert not acks[own.mid].is_failure
        assert acks[other.mid].value == NOT_AUTHORIZED
    finally:
        client.disconnect()
        client.loop_stop()


def test_unknown_or_reused_token_is_refused_with_the_servers_reason_and_nothing_written(
    server: EnrollServer, tmp_path: Path
) -> None:
    with pytest.raises(EnrollError, match="token unknown") as info:
        enroll(server.url, "x" * 32, tmp_path, "dev-a", trust_dir=tmp_path / "trust")
    assert info.value.status == 403
    token = server.issue("dev-a")
    enroll(server.url, token, tmp_path / "one", "dev-a", trust_dir=tmp_path / "one" / "trust")
    with pytest.raises(EnrollError) as again:
        enroll(server.url, token, tmp_path / "two", "dev-a", trust_dir=tmp_path / "two" / "trust")
    assert again.value.status == 403
    assert _files(tmp_path) == {"one"}


def test_token_issued_for_another_device_is_refused(server: EnrollServer, tmp_path: Path) -> None:
    token = server.issue("dev-b")
    with pytest.raises(EnrollError, match="CSR refused"):
        enroll(server.url, token, tmp_path, "dev-a", trust_dir=tmp_path / "trust")
    assert Identity.load(tmp_path) is None


def _other_device_cert(server: EnrollServer) -> str:
    _, csr = make_key_and_csr("dev-a")  # the right name, someone else's key
    return server.ca.sign_device_csr(csr, "dev-a").cert_pem.decode()


def _foreign_ca(tmp: Path) -> str:
    return make_ca(tmp).cert_path.read_text()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s, t, r: r | {"certificate": _other_device_cert(s)}, "not for this device's key"),
        (lambda s, t, r: r | {"ca": _foreign_ca(t)}, "not issued by the fleet CA"),
        (lambda s, t, r: r | {"ca": r["certificate"]}, "not a CA"),
        (lambda s, t, r: r | {"device_id": "dev-z"}, "for device 'dev-z'"),
        (lambda s, t, r: r | {"trust_root": '{"signed": {}}'}, "trust_root"),
        (lambda s, t, r: r | {"certificate": "junk"}, "not PEM"),
    ],
    ids=["other-key", "foreign-ca", "leaf-as-ca", "other-device", "bad-root", "junk"],
)
def test_an_answer_that_does_not_check_out_is_refused_and_nothing_is_written(
    server: EnrollServer, tmp_path: Path, change: Any, reason: str
) -> None:
    server.tamper = lambda r: change(server, tmp_path / "foreign", r)
    state = tmp_path / "state"
    with pytest.raises(EnrollError, match=reason):
        enroll(server.url, server.issue("dev-a"), state, "dev-a", trust_dir=state / "trust")
    assert not state.exists()


def test_a_trust_root_already_there_is_kept(server: EnrollServer, tmp_path: Path) -> None:
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / ROOT_FILE).write_bytes(b"provisioned before")
    enroll(server.url, server.issue("dev-a"), tmp_path, "dev-a", trust_dir=trust)
    assert (trust / ROOT_FILE).read_bytes() == b"provisioned before"


def test_enrolling_again_needs_replace_and_makes_a_new_key(
    server: EnrollServer, tmp_path: Path
) -> None:
    first = enroll(server.url, server.issue("dev-a"), tmp_path, "dev-a", trust_dir=tmp_path / "t")
    key_before = first.key_path.read_bytes()
    token = server.issue("dev-a")
    with pytest.raises(IdentityError, match="already enrolled"):
        enroll(server.url, token, tmp_path, "dev-a", trust_dir=tmp_path / "t")
    assert len(server.bodies) == 1, "refused before asking the server (token not spent)"
    again = enroll(server.url, token, tmp_path, "dev-a", trust_dir=tmp_path / "t", replace=True)
    assert again.key_path.read_bytes() != key_before
    assert Identity.load(tmp_path) == again


def test_identity_files_that_disagree_are_refused_on_load(
    server: EnrollServer, tmp_path: Path
) -> None:
    assert Identity.load(tmp_path) is None
    a = enroll(server.url, server.issue("dev-a"), tmp_path / "a", "dev-a", trust_dir=tmp_path / "t")
    b = enroll(server.url, server.issue("dev-b"), tmp_path / "b", "dev-b", trust_dir=tmp_path / "t")
    a.cert_path.write_bytes(b.cert_path.read_bytes())
    with pytest.raises(IdentityError, match="names \\['dev-b'\\], not device 'dev-a'"):
        Identity.load(tmp_path / "a")
    b.key_path.unlink()
    with pytest.raises(IdentityError, match="unreadable"):
        Identity.load(tmp_path / "b")


def test_unreachable_server_and_bad_urls_are_enroll_errors(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EnrollError, match="cannot reach") as info:
        enroll(url, "t" * 32, tmp_path, "dev-a", trust_dir=tmp_path / "t", timeout_s=5)
    assert info.value.status == 0
    with pytest.raises(EnrollError, match="http:// or https://"):
        enroll("file:///etc/passwd", "t" * 32, tmp_path, "dev-a", trust_dir=tmp_path / "t")
    with pytest.raises(EnrollError, match="token"):
        enroll(url, "short", tmp_path, "dev-a", trust_dir=tmp_path / "t")


@pytest.mark.parametrize("bad", ["a/b", "#", "+", "", "x" * 65])
def test_key_and_csr_refuse_a_name_that_is_not_a_device_id(bad: str) -> None:
    with pytest.raises(ConfigError, match="device_id"):
        make_key_and_csr(bad)


def test_key_and_csr_name_the_device_and_are_signed_by_the_key() -> None:
    key_pem, csr_pem = make_key_and_csr("dev-q")
    csr = x509.load_pem_x509_csr(csr_pem)
    assert csr.is_signature_valid
    assert csr.subject.rfc4514_string() == "CN=dev-q"
    assert load_pem_private_key(key_pem, None).public_key() == csr.public_key()


def test_mqtt_fetcher_downloads_over_tls_with_the_device_identity(
    server: EnrollServer, broker: ManagedBroker, pki: Pki, repo: TufRepo, tmp_path: Path
) -> None:
    identity = enroll(
        server.url, server.issue("dev-f"), tmp_path, "dev-f", trust_dir=tmp_path / "t"
    )
    fleet_tls = tls_context(pki.ca.cert_path, pki.cert("fleet-server"), pki.key("fleet-server"))
    files = MqttFileServer(repo.dir, "127.0.0.1", broker.config.port, tls_context=fleet_tls)
    files.start(timeout_s=WAIT_S)
    fetcher = MqttFetcher(
        identity.broker_host,
        identity.broker_port,
        device_id="dev-f",
        timeout_s=WAIT_S,
        tls_ca=identity.ca_path,
        tls_cert=identity.cert_path,
        tls_key=identity.key_path,
    )
    try:
        data = b"".join(fetcher.fetch("edgefleet:/metadata/root.json"))
    finally:
        fetcher.close()
        files.stop()
    assert data == (repo.metadata_dir / "root.json").read_bytes()
    with pytest.raises(ValueError, match="together"):
        MqttFetcher("127.0.0.1", 1, device_id="dev-f", tls_ca=identity.ca_path)


def _agent_toml(path: Path, device_id: str) -> Path:
    path.write_text(f'[agent]\ndevice_id = "{device_id}"\nstate_dir = "state"\n')
    return path


def test_cmd_enroll_reads_the_token_from_stdin_and_reports_one_line(
    server: EnrollServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    config = _agent_toml(tmp_path / "agent.toml", "dev-c")
    monkeypatch.setattr(sys, "stdin", io.StringIO(server.issue("dev-c") + "\n"))
    assert cmd_enroll(server.url, "-", str(config)) == 0
    out = capsys.readouterr().out
    assert out.startswith("enrolled dev-c: certificate valid until ")
    assert Identity.load(tmp_path / "state") is not None
    assert (tmp_path / "state" / "trust" / ROOT_FILE).is_file()

    assert cmd_enroll(server.url, "y" * 32, str(config), replace=True) == 2
    err = capsys.readouterr().err
    assert err.startswith("edge-agent: enroll: enrollment at ")
    assert "HTTP 403" in err
    assert cmd_enroll(server.url, "y" * 32, str(tmp_path / "missing.toml")) == 2
