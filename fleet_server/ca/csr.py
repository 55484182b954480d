"""The device's side of enrollment: a key made on the device and a CSR for it.

The private key never leaves the device; the fleet CA signs the CSR
(:meth:`fleet_server.ca.FleetCA.sign_device_csr`) and returns the certificate.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from cryptography.x509.oid import NameOID

from agent.kernel.errors import ConfigError
from agent.wire import topics


def make_device_key_and_csr(device_id: str) -> tuple[bytes, bytes]:
    """A new EC P-256 key (PKCS#8 PEM, unencrypted: store it mode 0600) and a CSR
    (PEM) with CN = ``device_id``, signed by that key.

    Raises:
        ConfigError: ``device_id`` is not a valid device id.
    """
    if not topics.is_device_id(device_id):
        raise ConfigError(
            "",
            "device_id",
            f"{device_id!r} is not a device id (1-64 of A-Z a-z 0-9 _ . -, no + # /)",
        )
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device_id)]))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return key_pem, csr.public_bytes(Encoding.PEM)
