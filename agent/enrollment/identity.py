"""The device's fleet identity: its TLS key and certificate from the fleet CA, and where
the fleet's broker is; and enrollment, which makes them.

Layout (``<state_dir>/identity`` by default)::

    key.pem     EC P-256 private key made on this device (PKCS#8 PEM, mode 0600)
    cert.pem    client certificate from the fleet CA (CN = device id)
    ca.pem      the fleet CA certificate: verifies the broker
    fleet.json  device id, broker host and port, labels, profile, enrollment server

Every file is written durably; ``fleet.json`` is written last, so an identity without it
is an enrollment that did not finish and :meth:`Identity.load` does not see it.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pydantic import Field, ValidationError

from agent.errors import AgentError
from agent.kernel.durable import fsync_dir, write_durable
from agent.kernel.errors import ConfigError
from agent.update.errors import TrustRootError
from agent.update.trust import ROOT_FILE, check_root
from agent.wire import topics
from agent.wire.base import WireModel
from agent.wire.enroll import ENROLL_PATH, EnrollRequest, EnrollResponse
from agent.wire.messages import error_text

log = logging.getLogger(__name__)

IDENTITY_DIR = Path("identity")
KEY_FILE = "key.pem"
CERT_FILE = "cert.pem"
CA_FILE = "ca.pem"
FLEET_FILE = "fleet.json"
MAX_RESPONSE_BYTES = 2 * 1024 * 1024
_MAX_DETAIL = 500


class IdentityError(AgentError):
    """The device identity is missing, unreadable or inconsistent.

    Attributes:
        path: the identity directory or the file at fault.
        reason: what is wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"device identity {path}: {reason}")


class EnrollError(AgentError):
    """Enrollment failed: the server could not be reached, refused, or answered wrongly.

    Attributes:
        url: the enrollment URL.
        status: the HTTP status (0 when there was no HTTP answer).
        reason: what failed (the server's ``detail`` for a refusal).
    """

    def __init__(self, url: str, status: int, reason: str) -> None:
        self.url = url
        self.status = status
        self.reason = reason
        code = f" (HTTP {status})" if status else ""
        super().__init__(f"enrollment at {url}{code}: {reason}")


class FleetInfo(WireModel):
    """Contents of ``fleet.json``."""

    schema_version: int = Field(1, ge=1, description="File format version.")
    device_id: str = Field(description="This device's id (its certificate's CN).")
    broker_host: str = Field(description="The fleet broker's host.")
    broker_port: int = Field(ge=1, le=65535, description="The fleet broker's TLS port.")
    labels: dict[str, str] = Field(default_factory=dict, description="Selector labels.")
    profile: str = Field("", description="The hardware class enrolled as.")
    server_url: str = Field("", description="The fleet server enrolled with.")


def tls_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS 1.2+ client context that verifies the server against ``ca`` (host name
    included) and presents ``cert`` with ``key``.

    Raises:
        IdentityError: a file is missing or not a usable PEM certificate or key.
    """
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise IdentityError(str(cert.parent), f"cannot load the TLS files: {exc}") from exc
    return ctx


@dataclass(frozen=True)
class Identity:
    """A device identity on disk (see the module docstring)."""

    directory: Path
    device_id: str
    broker_host: str
    broker_port: int
    labels: dict[str, str] = field(default_factory=dict)
    profile: str = ""
    server_url: str = ""

    @property
    def key_path(self) -> Path:
        """The private key (PEM, mode 0600)."""
        return self.directory / KEY_FILE

    @property
    def cert_path(self) -> Path:
        """The client certificate (PEM)."""
        return self.directory / CERT_FILE

    @property
    def ca_path(self) -> Path:
        """The fleet CA certificate (PEM)."""
        return self.directory / CA_FILE

    @classmethod
    def of(cls, directory: Path, info: FleetInfo) -> Identity:
        """The identity in ``directory`` that ``info`` (its fleet.json) describes."""
        return cls(
            directory,
            info.device_id,
            info.broker_host,
            info.broker_port,
            dict(info.labels),
            info.profile,
            info.server_url,
        )

    @classmethod
    def load(cls, state_dir: Path, directory: Path = IDENTITY_DIR) -> Identity | None:
        """The identity in ``directory`` (relative to ``state_dir``), or None when the
        device is not enrolled (no ``fleet.json``).

        Raises:
            IdentityError: ``fleet.json`` is unreadable, a file is missing, or the
                certificate does not name the device or match the key.
        """
        where = directory if directory.is_absolute() else Path(state_dir) / directory
        try:
            raw = (where / FLEET_FILE).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise IdentityError(str(where / FLEET_FILE), f"cannot read: {exc}") from exc
        try:
            info = FleetInfo.model_validate_json(raw)
        except ValidationError as exc:
            raise IdentityError(str(where / FLEET_FILE), f"not valid: {exc}") from exc
        identity = cls.of(where, info)
        identity.check()
        return identity

    def check(self) -> x509.Certificate:
        """Check that the key, certificate and CA are there and agree; the certificate.

        Raises:
            IdentityError: a file missing or unreadable, or a mismatch (named).
        """
        try:
            key = load_pem_private_key(self.key_path.read_bytes(), password=None)
            cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            ca = x509.load_pem_x509_certificate(self.ca_path.read_bytes())
        except (OSError, ValueError, TypeError) as exc:
            raise IdentityError(str(self.directory), f"unreadable: {exc}") from exc
        mode = self.key_path.stat().st_mode & 0o777
        if mode & 0o077:
            log.warning(
                "%s is readable by others (mode %o); it should be 0600", self.key_path, mode
            )
        check_certificate(cert, ca, self.device_id, _spki(key.public_key()), str(self.directory))
        return cert

    def tls_context(self) -> ssl.SSLContext:
        """TLS 1.2+ client context with this identity (see :func:`tls_context`)."""
        return tls_context(self.ca_path, self.cert_path, self.key_path)

    def tls_configure(self, client: mqtt.Client) -> None:
        """Make a paho ``client`` use TLS 1.2+ with this identity (before connecting).

        Raises:
            IdentityError: the TLS files can't be loaded.
        """
        client.tls_set_context(self.tls_context())


def make_key_and_csr(device_id: str) -> tuple[bytes, bytes]:
    """A new EC P-256 key (PKCS#8 PEM, unencrypted: store it mode 0600) and a CSR (PEM)
    with CN = ``device_id``, signed by that key.

    Raises:
        ConfigError: ``device_id`` is not a valid device id.
    """
    if not topics.is_device_id(device_id):
        raise ConfigError(
            "", "device_id", f"{device_id!r} is not a device id (1-64 of A-Z a-z 0-9 _ . -)"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device_id)]))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return key_pem, csr.public_bytes(Encoding.PEM)


def _spki(public: Any) -> bytes:
    data: bytes = public.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return data


def check_certificate(
    cert: x509.Certificate, ca: x509.Certificate, device_id: str, spki: bytes, where: str
) -> None:
    """Check that ``cert`` names ``device_id``, holds the public key ``spki`` (DER), is a
    client certificate, has not expired, and is signed by ``ca``.

    Raises:
        IdentityError: naming the first check that failed.
    """
    names = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if names != [device_id]:
        raise IdentityError(where, f"the certificate names {names}, not device {device_id!r}")
    if _spki(cert.public_key()) != spki:
        raise IdentityError(where, "the certificate is not for this device's key")
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usage = None
    if usage is not None and ExtendedKeyUsageOID.CLIENT_AUTH not in usage:
        raise IdentityError(where, "the certificate is not a TLS client certificate")
    if cert.not_valid_after_utc <= datetime.now(timezone.utc):
        raise IdentityError(where, f"the certificate expired at {cert.not_valid_after_utc}")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise IdentityError(where, f"the certificate is not issued by the fleet CA: {exc}") from exc


def _post(url: str, body: bytes, timeout_s: float, context: ssl.SSLContext | None) -> bytes:
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked by enroll()
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as resp:  # noqa: S310
            data: bytes = resp.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise EnrollError(url, exc.code, _detail(exc)) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EnrollError(url, 0, f"cannot reach the fleet server: {reason}") from exc
    if len(data) > MAX_RESPONSE_BYTES:
        raise EnrollError(url, 200, f"the answer is over {MAX_RESPONSE_BYTES} bytes")
    return data


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read(64 * 1024)
        detail = json.loads(raw).get("detail", "")
    except (OSError, ValueError, AttributeError):
        detail = ""
    text = detail if isinstance(detail, str) and detail else str(exc.reason)
    return text[:_MAX_DETAIL]


def enroll(
    server_url: str,
    token: str,
    state_dir: Path,
    device_id: str,
    *,
    trust_dir: Path,
    identity_dir: Path = IDENTITY_DIR,
    agent_version: str = "",
    timeout_s: float = 30.0,
    server_ca: Path | None = None,
    replace: bool = False,
) -> Identity:
    """Trade a one-time ``token`` for this device's certificate: the key is made here and
    never leaves the device; the fleet signs a CSR for it.

    The answer is checked (the certificate names ``device_id``, holds our key, chains to
    the returned CA; the trust root is a root signed by its own keys) before anything is
    written. The trust root goes to ``trust_dir/root.json`` unless one is there already.

    Args:
        server_url: the fleet server (``https://...``, or ``http://`` on a trusted network).
        server_ca: a CA file that verifies an https server (default: the system's).
        replace: enroll again though an identity exists (a new key and certificate).

    Raises:
        ConfigError: ``device_id`` is not a valid device id.
        IdentityError: already enrolled (and not ``replace``), or a write failed.
        EnrollError: the server is unreachable, refused (its reason), or answered with
            something that does not check out.
    """
    state_dir = Path(state_dir)
    key_pem, csr_pem = make_key_and_csr(device_id)
    where = identity_dir if identity_dir.is_absolute() else state_dir / identity_dir
    if not replace and (where / FLEET_FILE).exists():
        raise IdentityError(str(where), "this device is already enrolled (re-enroll to replace)")
    parsed = urllib.parse.urlsplit(server_url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise EnrollError(server_url, 0, "the server URL must be http:// or https://host[:port]")
    url = server_url.rstrip("/") + ENROLL_PATH
    context = None
    if parsed.scheme == "https":
        try:
            context = ssl.create_default_context(
                cafile=str(server_ca) if server_ca is not None else None
            )
        except OSError as exc:
            raise EnrollError(url, 0, f"cannot load server CA {server_ca}: {exc}") from exc
    try:
        request = EnrollRequest(token=token, csr=csr_pem.decode(), agent_version=agent_version)
    except ValidationError as exc:
        raise EnrollError(url, 0, f"not a valid request: {error_text(exc)}") from exc
    body = _post(url, request.model_dump_json().encode(), timeout_s, context)
    try:
        answer = EnrollResponse.model_validate_json(body)
    except ValidationError as exc:
        raise EnrollError(url, 200, f"not an enrollment answer: {exc}") from exc
    key = load_pem_private_key(key_pem, password=None)
    _check_answer(url, answer, device_id, _spki(key.public_key()))
    _install_trust_root(url, answer.trust_root.encode(), Path(trust_dir))
    info = FleetInfo(
        device_id=device_id,
        broker_host=answer.broker.host,
        broker_port=answer.broker.port,
        labels=dict(answer.labels),
        profile=answer.profile,
        server_url=server_url,
    )
    _write_identity(where, key_pem, answer, info)
    log.info(
        "enrolled %s with %s; broker %s:%d", device_id, url, info.broker_host, info.broker_port
    )
    return Identity.of(where, info)


def _check_answer(url: str, answer: EnrollResponse, device_id: str, spki: bytes) -> None:
    if answer.device_id != device_id:
        raise EnrollError(
            url, 200, f"the token is for device {answer.device_id!r}, not {device_id!r}"
        )
    try:
        cert = x509.load_pem_x509_certificate(answer.certificate.encode())
        ca = x509.load_pem_x509_certificate(answer.ca.encode())
    except ValueError as exc:
        raise EnrollError(url, 200, f"a certificate in the answer is not PEM: {exc}") from exc
    try:
        constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise EnrollError(url, 200, "the returned CA certificate is not a CA")
    try:
        check_certificate(cert, ca, device_id, spki, url)
    except IdentityError as exc:
        raise EnrollError(url, 200, exc.reason) from exc
    if cert.not_valid_before_utc > datetime.now(timezone.utc) + timedelta(minutes=5):
        log.warning(
            "certificate is valid from %s: is this device's clock behind?",
            cert.not_valid_before_utc,
        )


def _install_trust_root(url: str, data: bytes, trust_dir: Path) -> None:
    path = trust_dir / ROOT_FILE
    try:
        check_root(data, "the enrollment answer's trust_root")
    except TrustRootError as exc:
        raise EnrollError(url, 200, str(exc)) from exc
    if path.exists():
        log.info("keeping the trusted root already in %s", path)
        return
    try:
        trust_dir.mkdir(parents=True, exist_ok=True)
        write_durable(path, data)
    except OSError as exc:
        raise IdentityError(str(path), f"cannot write the trust root: {exc}") from exc


def _write_identity(where: Path, key_pem: bytes, answer: EnrollResponse, info: FleetInfo) -> None:
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        where.chmod(0o700)
        if (where / FLEET_FILE).exists():  # re-enrolling: not enrolled until the new one is
            (where / FLEET_FILE).unlink()
            fsync_dir(where)
        write_durable(where / KEY_FILE, key_pem)  # mkstemp makes it 0600
        os.chmod(where / KEY_FILE, 0o600)
        write_durable(where / CERT_FILE, answer.certificate.encode())
        write_durable(where / CA_FILE, answer.ca.encode())
        write_durable(where / FLEET_FILE, info.model_dump_json(indent=2).encode() + b"\n")
    except OSError as exc:
        raise IdentityError(str(where), f"cannot write: {exc}") from exc
