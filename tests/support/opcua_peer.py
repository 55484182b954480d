"""node-opcua as a peer of the agent's OPC UA server: runs tests/support/node_opcua/client.js
(installed by ``make test``: ``npm ci`` from the committed lock) with a plan and reads its
JSON lines, every wait bounded; and a server identity made at test time.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HERE = Path(__file__).resolve().parent / "node_opcua"
CLIENT_JS = HERE / "client.js"


def node_binary() -> str:
    """The ``node`` to run client.js with.

    Raises:
        RuntimeError: node or node-opcua is not installed (``make test`` installs both).
    """
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not installed: run `make sysdeps`")
    if not (HERE / "node_modules" / "node-opcua-client").is_dir():
        raise RuntimeError(f"node-opcua is not installed in {HERE}: run `make test` (npm ci)")
    return node


def run_client(
    plan: dict[str, Any],
    *,
    timeout_s: float = 60.0,
    on_ready: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Run client.js with ``plan``; its JSON lines. ``on_ready(n)`` runs each time the
    client says it is ready (n = 0, 1, ...): subscribed (an ``events`` step), or waiting
    at a ``sync`` step, which goes on once it returns. The process is killed at
    ``timeout_s``.

    Raises:
        AssertionError: the client did not end within the timeout, or wrote a line that
            is not JSON.
    """
    plan = {"timeout_s": timeout_s - 5, **plan}
    proc = subprocess.Popen(
        [node_binary(), str(CLIENT_JS), json.dumps(plan)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=HERE,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out: list[dict[str, Any]] = []
    readies = 0
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"client.js did not end within {timeout_s} s: {out}"
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                break
            if not line.startswith("{"):
                continue  # node-opcua's own log lines
            item = json.loads(line)
            if item.get("ready"):
                if on_ready is not None:
                    on_ready(readies)
                readies += 1
                if item.get("sync"):
                    assert proc.stdin is not None
                    proc.stdin.write("\n")
                    proc.stdin.flush()
                continue
            out.append(item)
        proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        reader.join(timeout=5)
        if proc.stdin is not None:
            proc.stdin.close()
        if proc.stdout is not None:
            proc.stdout.close()
    return out


def make_server_identity(directory: Path, application_uri: str) -> tuple[Path, Path]:
    """A self-signed RSA application certificate for an OPC UA server on 127.0.0.1
    (its URI in subjectAltName, as OPC UA wants), and its key: (cert.der, key.pem)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgefleet test OPC UA server")])
    now = datetime.now(timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.UniformResourceIdentifier(application_uri),
                    x509.DNSName("localhost"),
                    x509.IPAddress(IPv4Address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=True,
                key_encipherment=True,
                data_encipherment=True,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / "server.der"
    key_path = directory / "server-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.DER))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path
