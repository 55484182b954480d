"""The fleet CA: device certificates from CSRs made on the device, names the broker's ACL
can hold, the broker's server certificate, revocation checked by OpenSSL itself."""

from __future__ import annotations

import stat
import subprocess
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding, load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent.kernel.errors import ConfigError
from fleet_server.ca import (
    BROKER_NAME,
    FLEET_IDENTITY,
    CAError,
    FleetCA,
    NameRefused,
    make_device_key_and_csr,
)
from fleet_server.errors import PassphraseError
from fleet_server.repository import Passphrases

PASSPHRASE = "fleet CA test passphrase"  # noqa: S105 (generated keys, test only)


def _pp(value: str = PASSPHRASE) -> Passphrases:
    return Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": value})


@pytest.fixture
def ca(tmp_path: Path) -> FleetCA:
    return FleetCA.create(tmp_path / "ca", passphrases=_pp())


def _csr(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, cn: str | None) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])
    req = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    return req.public_bytes(Encoding.PEM)


def _openssl_verify(
    ca: FleetCA, cert_pem: bytes, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    cert = tmp_path / "leaf.pem"
    cert.write_bytes(cert_pem)
    return subprocess.run(
        ["openssl", "verify", "-crl_check", "-CAfile", str(ca.cert_path),
         "-CRLfile", str(ca.crl_path), "-purpose", "sslclient", str(cert)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_ca_key_is_encrypted_and_readable_only_by_the_owner(ca: FleetCA) -> None:
    pem = ca.key_path.read_bytes()
    assert pem.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert PASSPHRASE.encode() not in pem
    assert stat.S_IMODE(ca.key_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(ca.path.stat().st_mode) == 0o700
    key = load_pem_private_key(pem, password=PASSPHRASE.encode())
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"
    cert = ca.certificate()
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.public_key() == key.public_key()
    assert not list(ca.path.glob(".*.tmp")), "a temp file was left behind"


def test_ca_passphrase_comes_from_the_credentials_directory(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "EDGEFLEET_KEY_PASSPHRASE_CA").write_text("from systemd credentials\n")
    pp = Passphrases(environ={"CREDENTIALS_DIRECTORY": str(creds)})
    ca = FleetCA.create(tmp_path / "ca", passphrases=pp)
    load_pem_private_key(ca.key_path.read_bytes(), password=b"from systemd credentials")


def test_ca_is_not_created_without_a_long_passphrase(tmp_path: Path) -> None:
    with pytest.raises(PassphraseError, match="EDGEFLEET_KEY_PASSPHRASE_CA"):
        FleetCA.create(tmp_path / "a", passphrases=Passphrases(environ={}))
    with pytest.raises(PassphraseError, match="shorter"):
        FleetCA.create(tmp_path / "b", passphrases=_pp("short"))
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()


def test_second_ca_in_the_same_directory_is_refused(ca: FleetCA) -> None:
    with pytest.raises(CAError, match="already holds a CA"):
        FleetCA.create(ca.path, passphrases=_pp())


def test_replicas_starting_at_once_on_an_empty_state_dir_make_one_ca(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ca"
    start = threading.Barrier(4)
    results: list[tuple[bytes, bool]] = []
    failures: list[BaseException] = []

    def replica() -> None:
        start.wait(10)
        try:
            ca, created = FleetCA.open_or_create(path, _pp())
            results.append((ca.cert_path.read_bytes(), created))
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    assert len(results) == 4
    assert len({cert for cert, _ in results}) == 1  # one CA, the same for all
    assert sorted(created for _, created in results) == [False, False, False, True]
    again, created = FleetCA.open_or_create(path, _pp())
    assert not created
    assert again.cert_path.read_bytes() == results[0][0]


def test_wrong_passphrase_is_named_when_signing(ca: FleetCA) -> None:
    other = FleetCA(ca.path, passphrases=_pp("not the CA passphrase"))
    _, csr = make_device_key_and_csr("dev-1")
    with pytest.raises(CAError, match="wrong passphrase"):
        other.sign_device_csr(csr, "dev-1")


def test_device_certificate_carries_the_device_id_and_the_devices_own_key(
    ca: FleetCA, tmp_path: Path
) -> None:
    key_pem, csr_pem = make_device_key_and_csr("line3-cam07")
    reopened = FleetCA(ca.path, passphrases=_pp())  # a new process: key read from disk
    issued = reopened.sign_device_csr(csr_pem, "line3-cam07", valid_days=30)
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    device_key = load_pem_private_key(key_pem, password=None)
    assert cert.public_key() == device_key.public_key()
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "line3-cam07"
    assert issued.common_name == "line3-cam07"
    cert.verify_directly_issued_by(ca.certificate())
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert timedelta(days=30) <= lifetime <= timedelta(days=30, minutes=6)
    assert reopened.issued(issued.serial).cert_pem == issued.cert_pem
    assert _openssl_verify(ca, issued.cert_pem, tmp_path).returncode == 0


def test_each_certificate_gets_its_own_serial(ca: FleetCA) -> None:
    serials = set()
    for _ in range(5):
        _, csr = make_device_key_and_csr("dev-1")
        serials.add(ca.sign_device_csr(csr, "dev-1").serial)
    assert len(serials) == 5
    assert {i.serial for i in ca.list_issued("dev-1")} == serials
    assert ca.list_issued("dev-2") == []


@pytest.mark.parametrize(
    "name",
    [
        "#",
        "+",
        "dev/1",
        "dev-1/#",
        "%u",
        "%c",
        "",
        "dev 1",
        "-dev",
        "d" * 65,
        "dév",
        "a\nb",
        "dev\n",
    ],
)
def test_names_the_acl_cannot_hold_are_refused(ca: FleetCA, name: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(NameRefused) as info:
        ca.sign_device_csr(_csr(key, None), name)
    assert info.value.name == name
    assert ca.list_issued() == []


@pytest.mark.parametrize("name", [FLEET_IDENTITY, BROKER_NAME])
def test_the_fleets_own_identities_are_not_given_to_devices(ca: FleetCA, name: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(NameRefused, match="reserved"):
        ca.sign_device_csr(_csr(key, name), name)


def test_device_side_helper_refuses_a_wildcard_device_id() -> None:
    with pytest.raises(ConfigError, match="device_id"):
        make_device_key_and_csr("#")


def test_csr_naming_another_device_is_refused(ca: FleetCA) -> None:
    _, csr = make_device_key_and_csr("dev-2")
    with pytest.raises(CAError, match="not device 'dev-1'"):
        ca.sign_device_csr(csr, "dev-1")


def test_csr_with_a_broken_signature_is_refused(ca: FleetCA) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    der = bytearray(x509.load_pem_x509_csr(_csr(key, "dev-1")).public_bytes(Encoding.DER))
    der[-3] ^= 0xFF  # inside the signature
    tampered = x509.load_der_x509_csr(bytes(der)).public_bytes(Encoding.PEM)
    with pytest.raises(CAError, match="signature"):
        ca.sign_device_csr(tampered, "dev-1")


def test_weak_or_malformed_csr_is_refused(ca: FleetCA) -> None:
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505
    with pytest.raises(CAError, match="1024 bits"):
        ca.sign_device_csr(_csr(weak, "dev-1"), "dev-1")
    with pytest.raises(CAError, match="malformed CSR"):
        ca.sign_device_csr(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n", "dev-1")
    with pytest.raises(CAError, match="over"):
        ca.sign_device_csr(b"x" * 20000, "dev-1")


def test_broker_certificate_names_loopback_for_server_auth(ca: FleetCA) -> None:
    key_pem, issued = ca.issue_server()
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert {str(a) for a in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    key = load_pem_private_key(key_pem, password=None)
    assert cert.public_key() == key.public_key()
    with pytest.raises(CAError, match="server certificate"):
        ca.issue_server(ip_addresses=("not-an-ip",))


def test_service_identity_is_the_fleet_server_only(ca: FleetCA) -> None:
    _, issued = ca.issue_service()
    assert issued.common_name == FLEET_IDENTITY
    with pytest.raises(NameRefused):
        ca.issue_service("dev-1")


def test_revoked_certificate_is_refused_by_openssl_and_crl_is_renumbered(
    ca: FleetCA, tmp_path: Path
) -> None:
    _, csr = make_device_key_and_csr("dev-1")
    revoked = ca.sign_device_csr(csr, "dev-1")
    _, csr = make_device_key_and_csr("dev-2")
    kept = ca.sign_device_csr(csr, "dev-2")
    before = x509.load_pem_x509_crl(ca.crl_path.read_bytes())

    assert ca.revoke(revoked.serial, x509.ReasonFlags.key_compromise)
    assert not ca.revoke(revoked.serial), "revoking twice is a no-op"

    crl = x509.load_pem_x509_crl(ca.crl_path.read_bytes())
    assert crl.is_signature_valid(ca.certificate().public_key())  # type: ignore[arg-type]
    entry = crl.get_revoked_certificate_by_serial_number(revoked.serial)
    assert entry is not None
    reason = entry.extensions.get_extension_for_class(x509.CRLReason).value.reason
    assert reason == x509.ReasonFlags.key_compromise
    assert crl.get_revoked_certificate_by_serial_number(kept.serial) is None
    number = crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    old_number = before.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    assert number == old_number + 1
    assert crl.last_update_utc > before.last_update_utc
    assert set(ca.revoked()) == {revoked.serial}

    refused = _openssl_verify(ca, revoked.cert_pem, tmp_path)
    assert refused.returncode != 0
    assert "revoked" in refused.stdout + refused.stderr
    assert _openssl_verify(ca, kept.cert_pem, tmp_path).returncode == 0


def test_unknown_serial_is_not_revoked(ca: FleetCA) -> None:
    with pytest.raises(CAError, match="not issued here"):
        ca.revoke(12345)
    assert ca.revoked() == {}


def test_revoking_a_device_revokes_every_certificate_it_holds(ca: FleetCA) -> None:
    serials = []
    for _ in range(2):
        _, csr = make_device_key_and_csr("dev-9")
        serials.append(ca.sign_device_csr(csr, "dev-9").serial)
    _, csr = make_device_key_and_csr("dev-8")
    other = ca.sign_device_csr(csr, "dev-8").serial
    assert sorted(ca.revoke_device("dev-9")) == sorted(serials)
    assert ca.revoke_device("dev-9") == []
    assert other not in ca.revoked()


def test_crl_refresh_is_due_before_it_expires(tmp_path: Path) -> None:
    ca = FleetCA.create(tmp_path / "ca", crl_valid_days=7, passphrases=_pp())
    assert not ca.crl_due(timedelta(days=1))
    assert ca.crl_due(timedelta(days=7))
    first = x509.load_pem_x509_crl(ca.crl_path.read_bytes())
    ca.write_crl()
    second = x509.load_pem_x509_crl(ca.crl_path.read_bytes())
    assert second.next_update_utc is not None
    assert first.next_update_utc is not None
    assert second.next_update_utc > first.next_update_utc
