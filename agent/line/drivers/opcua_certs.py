"""The certificates of an OPC UA connection: the agent's application certificate and key
and the server's pinned one, read from files with a bound, PEM or DER."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from agent.line.errors import LineError

MAX_FILE_BYTES = 64 * 1024
"""A certificate or key file larger than this is refused before it is parsed."""


def read_file(path: Path, link: str) -> bytes:
    """The bytes of a certificate or key file.

    Raises:
        LineError: ``denied``: it can't be read, or it is over :data:`MAX_FILE_BYTES`.
    """
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise LineError(link, "denied", f"can't read {path}: {exc.strerror}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise LineError(link, "denied", f"{path} is over {MAX_FILE_BYTES} bytes")
    return data


def pem_or_der(data: bytes) -> str:
    """``"pem"`` or ``"der"``: how ``data`` is encoded."""
    return "pem" if data.lstrip().startswith(b"-----BEGIN") else "der"


def load_certificate(data: bytes, link: str) -> x509.Certificate:
    """``data`` (PEM or DER) as an X.509 certificate.

    Raises:
        LineError: ``denied``: not a certificate.
    """
    try:
        if pem_or_der(data) == "pem":
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise LineError(
            link, "denied", f"the pinned server certificate can't be read: {exc}"
        ) from exc


def first_certificate(der: bytes | None) -> x509.Certificate | None:
    """The first certificate of a DER chain (an endpoint may send its chain), or None."""
    if not der or len(der) < 2 or der[0] != 0x30:
        return None
    size, head = der[1], 2
    if size & 0x80:
        count = size & 0x7F
        size, head = int.from_bytes(der[2 : 2 + count], "big"), 2 + count
    try:
        return x509.load_der_x509_certificate(der[: head + size])
    except ValueError:
        return None


def fingerprint(cert: x509.Certificate | None) -> str:
    """A short SHA-256 fingerprint for messages."""
    return "none" if cert is None else "sha256:" + cert.fingerprint(hashes.SHA256()).hex()[:16]


def application_uri(cert: bytes) -> str | None:
    """The URI in the certificate's subject alternative name (the application URI a
    server expects the client to claim), if any."""
    try:
        parsed = (
            x509.load_pem_x509_certificate(cert)
            if pem_or_der(cert) == "pem"
            else x509.load_der_x509_certificate(cert)
        )
        san = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (ValueError, x509.ExtensionNotFound):
        return None
    uris = san.value.get_values_for_type(x509.UniformResourceIdentifier)
    return uris[0] if uris else None
