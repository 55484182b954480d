"""The fleet CA: one directory that issues the fleet's TLS identities and revokes them.

Files: ``ca.crt`` (the self-signed CA certificate, what the broker and devices trust),
``ca.key`` (EC P-256, PKCS#8 PEM encrypted with the passphrase of role ``ca``: see
:class:`fleet_server.repository.keys.Passphrases`, mode 0600), ``crl.pem`` (the revocation
list the broker loads), ``ca.json`` (CRL number and revoked serials) and ``issued/`` (one
PEM per certificate issued, named by its serial in hex). Every write is durable.

Names a certificate may carry: :mod:`fleet_server.ca.names`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from fleet_server.ca import _certs, _state
from fleet_server.ca._certs import Kind
from fleet_server.ca.names import (
    BROKER_NAME,
    FLEET_IDENTITY,
    SERVICE_PREFIX,
    CAError,
    NameRefused,
    check_name,
    is_service_name,
)
from fleet_server.errors import PassphraseError
from fleet_server.repository._files import make_dirs, write_durable
from fleet_server.repository.keys import MIN_PASSPHRASE_CHARS, Passphrases

log = logging.getLogger(__name__)

CA_ROLE = "ca"
"""Passphrase role: ``EDGEFLEET_KEY_PASSPHRASE_CA``, then ``EDGEFLEET_KEY_PASSPHRASE``."""
CERT_NAME = "ca.crt"
KEY_NAME = "ca.key"
CRL_NAME = "crl.pem"
ISSUED_DIR = "issued"
_MAX_CSR_BYTES = 16 * 1024


@dataclass(frozen=True)
class Issued:
    """A certificate the CA signed."""

    serial: int
    common_name: str
    not_after: datetime
    cert_pem: bytes

    @property
    def serial_hex(self) -> str:
        """The serial as the CA's file names and ``openssl x509 -serial`` spell it."""
        return f"{self.serial:X}"


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


class FleetCA:
    """A CA directory (see the module docstring)."""

    def __init__(self, path: Path, passphrases: Passphrases | None = None) -> None:
        self.path = Path(path)
        self.passphrases = passphrases or Passphrases()
        self._key: ec.EllipticCurvePrivateKey | None = None
        self._cert: x509.Certificate | None = None

    @property
    def cert_path(self) -> Path:
        """The CA certificate (PEM): the broker's ``cafile`` and the devices' trust anchor."""
        return self.path / CERT_NAME

    @property
    def crl_path(self) -> Path:
        """The CRL (PEM): the broker's ``crlfile``."""
        return self.path / CRL_NAME

    @property
    def key_path(self) -> Path:
        """The encrypted CA private key."""
        return self.path / KEY_NAME

    def exists(self) -> bool:
        """Whether the directory holds a CA."""
        return self.cert_path.is_file() and (self.path / _state.STATE_NAME).is_file()

    @classmethod
    def create(
        cls,
        path: Path,
        *,
        common_name: str = "edgefleet fleet CA",
        valid_days: int = 3650,
        crl_valid_days: int = 30,
        passphrases: Passphrases | None = None,
    ) -> FleetCA:
        """Make a new CA: key, self-signed certificate and an empty CRL.

        Raises:
            CAError: the directory already holds a CA, bad durations, or a write failure.
            PassphraseError: no passphrase for role ``ca``, or a short one.
        """
        ca = cls(path, passphrases)
        if ca.exists() or ca.key_path.exists():
            raise CAError(str(ca.path), f"already holds a CA ({CERT_NAME})")
        if valid_days < 1 or crl_valid_days < 1:
            raise CAError(str(ca.path), "valid_days and crl_valid_days must be at least 1")
        secret = ca.passphrases.get(CA_ROLE, str(ca.path))
        if len(secret.decode("utf-8", "replace")) < MIN_PASSPHRASE_CHARS:
            raise PassphraseError(
                str(ca.path),
                CA_ROLE,
                ca.passphrases.names(CA_ROLE),
                f"the CA passphrase is shorter than {MIN_PASSPHRASE_CHARS} characters",
            )
        key = _certs.new_key()
        cert = _certs.ca_certificate(key, common_name, _now(), valid_days)
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(secret))
        try:
            make_dirs(ca.path / ISSUED_DIR, mode=0o700)
            ca.path.chmod(0o700)
            write_durable(ca.key_path, pem, mode=0o600)
            write_durable(ca.cert_path, cert.public_bytes(Encoding.PEM), mode=0o644)
        except OSError as exc:
            raise CAError(str(ca.path), f"cannot create: {exc}") from exc
        ca._key, ca._cert = key, cert
        with ca._locked():
            ca._write_state(_state.State(crl_valid_days=crl_valid_days))
            ca._write_crl_locked()
        return ca

    @classmethod
    def open_or_create(
        cls, path: Path, passphrases: Passphrases | None = None
    ) -> tuple[FleetCA, bool]:
        """The CA in ``path``, created first when there is none; whether it was created.

        Several processes starting at once on one state directory (replicas) make one
        CA between them: the check and the creation hold a lock beside the directory
        (``.<name>.create.lock`` in its parent), and the others open what the first made.

        Raises:
            CAError: the lock is held past its timeout, or :meth:`create` fails.
            PassphraseError: as :meth:`create`.
        """
        make_dirs(path.parent)
        with _state.locked(path.parent, name=f".{path.name}.create.lock"):
            ca = cls(path, passphrases)
            if ca.exists():
                return ca, False
            return cls.create(path, passphrases=passphrases), True

    def certificate(self) -> x509.Certificate:
        """The CA certificate.

        Raises:
            CAError: missing or unreadable.
        """
        if self._cert is None:
            try:
                self._cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            except FileNotFoundError:
                raise CAError(str(self.path), "no CA here (create one first)") from None
            except (OSError, ValueError) as exc:
                raise CAError(str(self.cert_path), f"unreadable: {exc}") from exc
        return self._cert

    def _private_key(self) -> ec.EllipticCurvePrivateKey:
        if self._key is not None:
            return self._key
        secret = self.passphrases.get(CA_ROLE, str(self.path))
        try:
            key = load_pem_private_key(self.key_path.read_bytes(), password=secret)
        except OSError as exc:
            raise CAError(str(self.key_path), f"cannot read the CA key: {exc}") from exc
        except (ValueError, TypeError) as exc:
            names = " or ".join(self.passphrases.names(CA_ROLE))
            raise CAError(
                str(self.key_path), f"cannot decrypt the CA key (wrong passphrase in {names}?)"
            ) from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CAError(str(self.key_path), "not an EC private key")
        if key.public_key() != self.certificate().public_key():
            raise CAError(str(self.key_path), f"does not match {self.cert_path}")
        self._key = key
        return key

    def sign_device_csr(self, csr_pem: bytes, device_id: str, *, valid_days: int = 365) -> Issued:
        """Sign a CSR made on the device; the certificate's CN is ``device_id``.

        The CSR's own subject may be empty or name the same device; anything else in it
        (extensions, other names) is ignored: the CA decides what the certificate holds.

        Raises:
            NameRefused: ``device_id`` is not a valid device id or is reserved.
            CAError: a malformed CSR, a bad signature, a refused key type, a CN that
                names another device, or a CA failure.
        """
        check_name(device_id, str(self.path))
        if len(csr_pem) > _MAX_CSR_BYTES:
            raise CAError(str(self.path), f"CSR is over {_MAX_CSR_BYTES} bytes")
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as exc:
            raise CAError(str(self.path), f"malformed CSR: {exc}") from exc
        if not csr.is_signature_valid:
            raise CAError(str(self.path), "the CSR's signature does not verify")
        names = [str(a.value) for a in csr.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
        if any(n != device_id for n in names):
            raise CAError(str(self.path), f"the CSR names {names}, not device {device_id!r}")
        public = csr.public_key()
        problem = _certs.public_key_problem(public)
        if problem:
            raise CAError(str(self.path), f"CSR key refused: {problem}")
        return self._issue(device_id, public, "device", valid_days)

    def issue_server(
        self,
        *,
        dns_names: Sequence[str] = ("localhost",),
        ip_addresses: Sequence[str] = ("127.0.0.1", "::1"),
        valid_days: int = 825,
    ) -> tuple[bytes, Issued]:
        """A key (unencrypted PKCS#8 PEM, for the broker) and server certificate for it.

        Raises:
            CAError: a malformed IP address or a CA failure.
        """
        key = _certs.new_key()
        try:
            issued = self._issue(
                BROKER_NAME, key.public_key(), "server", valid_days, dns_names, ip_addresses
            )
        except ValueError as exc:
            raise CAError(str(self.path), f"server certificate: {exc}") from exc
        return _key_pem(key), issued

    def issue_service(
        self, name: str = FLEET_IDENTITY, *, valid_days: int = 365
    ) -> tuple[bytes, Issued]:
        """A key (unencrypted PKCS#8 PEM) and client certificate for a fleet service:
        the fleet server's own identity, or one service's (``fleet:<service>``).

        Raises:
            NameRefused: ``name`` is not a service identity.
            CAError: a CA failure.
        """
        if name != FLEET_IDENTITY and not is_service_name(name):
            raise NameRefused(
                str(self.path),
                name,
                f"a service identity is {FLEET_IDENTITY!r} or {SERVICE_PREFIX}<service> "
                "(1-32 of a-z 0-9 -, a letter first)",
            )
        key = _certs.new_key()
        return _key_pem(key), self._issue(name, key.public_key(), "service", valid_days)

    def _issue(
        self,
        common_name: str,
        public_key: CertificatePublicKeyTypes,
        kind: Kind,
        valid_days: int,
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
    ) -> Issued:
        if valid_days < 1:
            raise CAError(str(self.path), f"valid_days {valid_days} must be at least 1")
        cert = _certs.leaf_certificate(
            self.certificate(),
            self._private_key(),
            common_name=common_name,
            public_key=public_key,
            kind=kind,
            now=_now(),
            valid_days=valid_days,
            dns_names=dns_names,
            ip_addresses=ip_addresses,
        )
        issued = _issued_of(cert)
        path = self.path / ISSUED_DIR / f"{issued.serial_hex}.pem"
        try:
            write_durable(path, issued.cert_pem, mode=0o644)
        except OSError as exc:
            raise CAError(str(path), f"cannot write: {exc}") from exc
        log.info("issued %s certificate %s for %r", kind, issued.serial_hex, common_name)
        return issued

    def issued(self, serial: int) -> Issued:
        """A certificate this CA issued.

        Raises:
            CAError: no such serial, or its file is unreadable.
        """
        path = self.path / ISSUED_DIR / f"{serial:X}.pem"
        try:
            return _issued_of(x509.load_pem_x509_certificate(path.read_bytes()))
        except FileNotFoundError:
            raise CAError(str(self.path), f"serial {serial:X} was not issued here") from None
        except (OSError, ValueError) as exc:
            raise CAError(str(path), f"unreadable: {exc}") from exc

    def list_issued(self, common_name: str | None = None) -> list[Issued]:
        """Certificates issued (for ``common_name`` only when given), oldest expiry first."""
        found = []
        for path in sorted((self.path / ISSUED_DIR).glob("*.pem")):
            issued = self.issued(int(path.stem, 16))
            if common_name is None or issued.common_name == common_name:
                found.append(issued)
        return sorted(found, key=lambda i: i.not_after)

    def revoked(self) -> dict[int, datetime]:
        """Revoked serials and when they were revoked."""
        return {int(r.serial, 16): r.revoked_at for r in self._read_state().revoked}

    def revoke(self, serial: int, reason: x509.ReasonFlags = x509.ReasonFlags.unspecified) -> bool:
        """Revoke a certificate and write a new CRL; False if it was already revoked.

        The broker sees it once it reloads the CRL (:meth:`ManagedBroker.reload`).

        Raises:
            CAError: the serial was not issued here, or a CA failure.
        """
        issued = self.issued(serial)
        with self._locked():
            state = self._read_state()
            if any(int(r.serial, 16) == serial for r in state.revoked):
                return False
            entry = _state.Revoked(
                serial=issued.serial_hex,
                common_name=issued.common_name,
                revoked_at=_now(),
                reason=reason,
            )
            self._write_state(state.model_copy(update={"revoked": [*state.revoked, entry]}))
            self._write_crl_locked()
        log.info("revoked certificate %s of %r", issued.serial_hex, issued.common_name)
        return True

    def revoke_device(self, device_id: str) -> list[int]:
        """Revoke every certificate issued to ``device_id``; return the serials newly revoked."""
        return [
            i.serial
            for i in self.list_issued(device_id)
            if self.revoke(i.serial, x509.ReasonFlags.cessation_of_operation)
        ]

    def write_crl(self) -> Path:
        """Sign a fresh CRL (new number, new validity) and write it; return its path."""
        with self._locked():
            self._write_crl_locked()
        return self.crl_path

    def crl_due(self, within: timedelta) -> bool:
        """Whether the CRL expires within ``within`` (write a fresh one before it does:
        an expired CRL makes the broker refuse every client)."""
        last = self._read_state()
        if last.crl_last_update is None:
            return True
        expires = last.crl_last_update + timedelta(days=last.crl_valid_days)
        return expires - _now() <= within

    def _write_crl_locked(self) -> None:
        state = self._read_state()
        now = _now()
        if state.crl_last_update is not None and now <= state.crl_last_update:
            # A broker keeps older CRLs it loaded and uses the one with the newest
            # thisUpdate: a new CRL must be at least a second newer.
            wait = (state.crl_last_update - now).total_seconds() + 1.0
            if wait <= 2.0:
                time.sleep(wait)
                now = _now()
            else:
                log.warning("clock is %.0f s behind the last CRL; using it as is", wait)
        entries = [(int(r.serial, 16), r.revoked_at, r.reason) for r in state.revoked]
        crl = _certs.revocation_list(
            self.certificate(),
            self._private_key(),
            revoked=entries,
            number=state.crl_number + 1,
            last_update=now,
            next_update=now + timedelta(days=state.crl_valid_days),
        )
        try:
            write_durable(self.crl_path, crl.public_bytes(Encoding.PEM), mode=0o644)
        except OSError as exc:
            raise CAError(str(self.crl_path), f"cannot write: {exc}") from exc
        self._write_state(
            state.model_copy(update={"crl_number": state.crl_number + 1, "crl_last_update": now})
        )

    def _read_state(self) -> _state.State:
        return _state.read_state(self.path)

    def _write_state(self, state: _state.State) -> None:
        _state.write_state(self.path, state)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return _state.locked(self.path)


def _issued_of(cert: x509.Certificate) -> Issued:
    cns = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return Issued(
        serial=cert.serial_number,
        common_name=str(cns[0].value) if cns else "",
        not_after=cert.not_valid_after_utc,
        cert_pem=cert.public_bytes(Encoding.PEM),
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
