"""TLS identities from a fleet CA and an MQTT 5 client that uses one, for broker tests.

Every wait is bounded. :meth:`Peer.flush` proves "nothing was delivered" without
sleeping: it publishes QoS 1 and waits for the PUBACK; Mosquitto writes to one
connection in order, so anything routed to this client before came first.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from fleet_server.ca import FleetCA, make_device_key_and_csr
from fleet_server.repository import Passphrases

PASSPHRASE = "broker test CA passphrase"  # noqa: S105 (generated keys, test only)
WAIT_S = 10.0
FLUSH_TOPIC = "flush"  # granted to nobody: the PUBACK (0x87) still comes, in order


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: FleetCA

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"


def save_identity(directory: Path, name: str, key_pem: bytes, cert_pem: bytes) -> None:
    (directory / f"{name}.key").write_bytes(key_pem)
    (directory / f"{name}.key").chmod(0o600)
    (directory / f"{name}.crt").write_bytes(cert_pem)


def enroll(ca: FleetCA, directory: Path, device_id: str, name: str | None = None) -> int:
    key_pem, csr_pem = make_device_key_and_csr(device_id)  # made "on the device"
    issued = ca.sign_device_csr(csr_pem, device_id)
    save_identity(directory, name or device_id, key_pem, issued.cert_pem)
    return issued.serial


def bypass_certificate(ca: FleetCA, directory: Path, cn: str, name: str) -> None:
    """A client certificate with any CN, signed with the CA key directly (not through
    FleetCA, which refuses such names): what a CA bug or a stolen CA key would give."""
    ca_key = load_pem_private_key(ca.key_path.read_bytes(), password=PASSPHRASE.encode())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = ca.certificate().not_valid_before_utc + timedelta(minutes=10)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca.certificate().subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    save_identity(directory, name, key_pem, cert.public_bytes(Encoding.PEM))


def make_ca(directory: Path) -> FleetCA:
    pp = Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE})
    ca = FleetCA.create(directory / "ca", passphrases=pp)
    key_pem, issued = ca.issue_server()
    save_identity(directory, "server", key_pem, issued.cert_pem)
    key_pem, issued = ca.issue_service()
    save_identity(directory, "fleet-server", key_pem, issued.cert_pem)
    return ca


class Peer:
    """A paho client with one identity; every wait is bounded."""

    def __init__(
        self, port: int, ca_file: Path, cert: Path, key: Path, client_id: str = ""
    ) -> None:
        self.port = port
        self.inbox: queue.Queue[tuple[str, bytes]] = queue.Queue(maxsize=1000)
        self._cond = threading.Condition()
        self._connack: ReasonCode | None = None
        self._closed = False
        self._pubacks: dict[int, ReasonCode] = {}
        self._subacks: dict[int, list[ReasonCode]] = {}
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        c.tls_set(ca_certs=str(ca_file), certfile=str(cert), keyfile=str(key))
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_publish = self._on_publish
        c.on_subscribe = self._on_subscribe
        c.on_message = self._on_message
        self.client = c

    def _on_connect(self, _c: Any, _u: Any, _f: Any, rc: ReasonCode, _p: Any) -> None:
        with self._cond:
            self._connack = rc
            self._cond.notify_all()

    def _on_disconnect(self, _c: Any, _u: Any, _f: Any, _rc: Any, _p: Any) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _on_publish(self, _c: Any, _u: Any, mid: int, rc: ReasonCode, _p: Any) -> None:
        with self._cond:
            self._pubacks[mid] = rc
            self._cond.notify_all()

    def _on_subscribe(self, _c: Any, _u: Any, mid: int, rcs: list[ReasonCode], _p: Any) -> None:
        with self._cond:
            self._subacks[mid] = rcs
            self._cond.notify_all()

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        self.inbox.put_nowait((msg.topic, bytes(msg.payload)))

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(done, WAIT_S):
                raise AssertionError(f"no {what} within {WAIT_S} s")

    def connect(self) -> bool:
        """True once CONNACK says success; False when the broker refuses the client."""
        try:
            self.client.connect("127.0.0.1", self.port, keepalive=30)
        except (OSError, ValueError):  # ssl.SSLError is an OSError: refused in the handshake
            return False
        self.client.loop_start()
        self._wait(lambda: self._connack is not None or self._closed, "CONNACK or disconnect")
        with self._cond:
            ok = self._connack is not None and not self._connack.is_failure
        if not ok:
            self.close()
        return ok

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def wait_closed(self) -> None:
        self._wait(lambda: self._closed, "disconnect")

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> ReasonCode:
        """Publish at QoS 1; the PUBACK's reason code."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, f"publish not sent: {info.rc}"
        self._wait(lambda: info.mid in self._pubacks, f"PUBACK for {topic}")
        with self._cond:
            return self._pubacks.pop(info.mid)

    def subscribe(self, topic: str) -> list[ReasonCode]:
        result, mid = self.client.subscribe(topic, qos=1)
        assert result == mqtt.MQTT_ERR_SUCCESS
        assert mid is not None
        self._wait(lambda: mid in self._subacks, f"SUBACK for {topic}")
        with self._cond:
            return self._subacks.pop(mid)

    def flush(self) -> list[tuple[str, bytes]]:
        """Everything delivered so far (see the module docstring)."""
        self.publish(FLUSH_TOPIC, b"")
        got = []
        while not self.inbox.empty():
            got.append(self.inbox.get_nowait())
        return got

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
