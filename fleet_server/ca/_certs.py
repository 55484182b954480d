"""Certificate and CRL builders of the fleet CA: plain functions, no files, no clock."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Kind = Literal["device", "service", "server"]
"""device: a device's client certificate; service: a fleet process's client certificate
(the fleet server's own MQTT identity); server: the broker's TLS server certificate."""

CLOCK_SKEW = timedelta(minutes=5)
"""Certificates start this long before they are made, for devices whose clock is behind."""

MIN_RSA_BITS = 2048
_CURVES = (ec.SECP256R1, ec.SECP384R1)


def new_key() -> ec.EllipticCurvePrivateKey:
    """A new EC P-256 private key (what every identity of the fleet uses)."""
    return ec.generate_private_key(ec.SECP256R1())


def public_key_problem(key: CertificatePublicKeyTypes) -> str | None:
    """Why ``key`` is not accepted in a certificate, or None when it is."""
    if isinstance(key, ec.EllipticCurvePublicKey):
        if isinstance(key.curve, _CURVES):
            return None
        return f"elliptic curve {key.curve.name} is not accepted (P-256 or P-384)"
    if isinstance(key, ed25519.Ed25519PublicKey):
        return None
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size >= MIN_RSA_BITS:
            return None
        return f"RSA key of {key.key_size} bits is under {MIN_RSA_BITS}"
    return f"{type(key).__name__} keys are not accepted (EC P-256/P-384, Ed25519, RSA)"


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def ca_certificate(
    key: ec.EllipticCurvePrivateKey, common_name: str, now: datetime, valid_days: int
) -> x509.Certificate:
    """The self-signed CA certificate: may sign end-entity certificates and CRLs only."""
    name = _name(common_name, "edgefleet")
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def leaf_certificate(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    common_name: str,
    public_key: CertificatePublicKeyTypes,
    kind: Kind,
    now: datetime,
    valid_days: int,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
) -> x509.Certificate:
    """An end-entity certificate signed by the CA; never valid past the CA itself.

    Raises:
        ValueError: a malformed IP address.
    """
    not_after = min(now + timedelta(days=valid_days), ca_cert.not_valid_after_utc)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if kind == "server" else ExtendedKeyUsageOID.CLIENT_AUTH
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(now - CLOCK_SKEW, ca_cert.not_valid_before_utc))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=isinstance(public_key, rsa.RSAPublicKey),
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
    )
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def revocation_list(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    revoked: Iterable[tuple[int, datetime, x509.ReasonFlags]],
    number: int,
    last_update: datetime,
    next_update: datetime,
) -> x509.CertificateRevocationList:
    """A CRL of ``revoked`` (serial, when, reason) entries, numbered ``number``."""
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(last_update)
        .next_update(next_update)
        .add_extension(x509.CRLNumber(number), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
    )
    for serial, when, reason in revoked:
        entry = x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when)
        if reason != x509.ReasonFlags.unspecified:
            entry = entry.add_extension(x509.CRLReason(reason), critical=False)
        builder = builder.add_revoked_certificate(entry.build())
    return builder.sign(ca_key, hashes.SHA256())
