"""The managed Mosquitto's settings, and the ``mosquitto.conf`` written from them.

What keeps devices apart is fixed, not configurable: TLS with a client certificate from
the fleet CA on every connection, the certificate's CN as the MQTT user name (and, with
``clientid_is_identity``, as the client id: no client can take over another's session),
no anonymous clients, an ACL that denies what it does not grant
(:mod:`fleet_server.broker.acl`) and a CRL. Option names follow mosquitto.conf(5) of
Mosquitto 2.0.

Mosquitto 2.0's limits are global, not per listener or per client kind: the fleet
services' own subscriptions (the ingest's shared subscription above all) queue under the
same limits as a device. They are sized for ingest at 1,000 devices and bound what one
device can make the broker hold (``docs/adr/0005-broker-identity-and-limits.md``);
:meth:`MosquittoConfig.client_memory_bound` is that bound, in bytes, as measured on
Mosquitto 2.0.11 (``tests/fleet_server/test_broker_memory_bound.py``).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from agent.kernel.configbase import Section
from agent.wire import topics

CONF_NAME = "mosquitto.conf"
ACL_NAME = "acl"
DATA_DIR = "data"
_EXPIRY = re.compile(r"^[1-9][0-9]{0,5}[hdwmy]$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MESSAGE_OVERHEAD_BYTES = 512
"""Broker memory a held message takes beside its payload (its store entry, topic, source
and destination client ids, the client's message entry): about 400 B measured on
Mosquitto 2.0.11 with the fleet's topics (50,000 messages of 100 B queued grew it 23 MB)."""


class MosquittoConfig(Section):
    """A Mosquitto run by fleet-server as a child process, on one TLS listener."""

    binary: str = Field(
        "mosquitto",
        description="The mosquitto executable: a name looked up on PATH (and the sbin "
        "directories), or a path.",
    )
    host: str = Field(
        "127.0.0.1", description="Address the listener binds to (an IP address or localhost)."
    )
    port: int = Field(8883, ge=1, le=65535, description="TCP port of the TLS listener.")
    state_dir: Path = Field(
        Path("/var/lib/edgefleet/broker"),
        description="Where mosquitto.conf, the ACL file and the persistence database "
        "(data/) are written.",
    )
    cafile: Path = Field(
        Path("/var/lib/edgefleet/ca/ca.crt"),
        description="The fleet CA certificate (PEM): client certificates must chain to it.",
    )
    crlfile: Path = Field(
        Path("/var/lib/edgefleet/ca/crl.pem"),
        description="The fleet CA's revocation list (PEM); reloaded on reload().",
    )
    certfile: Path = Field(
        Path("/var/lib/edgefleet/broker/server.crt"),
        description="The broker's server certificate (PEM), issued by the fleet CA.",
    )
    keyfile: Path = Field(
        Path("/var/lib/edgefleet/broker/server.key"),
        description="The broker's server key (PEM, unencrypted, mode 0600).",
    )
    tls_version: Literal["tlsv1.2", "tlsv1.3"] = Field(
        "tlsv1.2", description="Lowest TLS version the listener accepts."
    )
    fleet_identity: str = Field(
        "fleet-server",
        description="CN of the fleet server's client certificate; the only identity that "
        "may read and write every device's topics.",
    )
    clientid_is_identity: bool = Field(
        True,
        description="use_username_as_clientid: a client's id is its certificate's CN, so "
        "no client can take over another's session (a device naming a service's or "
        "another device's client id gets its own CN instead). Every connection then needs "
        "its own certificate: the fleet services have one each and an agent holds one "
        "connection to the fleet broker (uplink, directives and bundle fetches share it). "
        "Turn it off only for tools that open several connections with one certificate "
        "(docs/adr/0005-broker-identity-and-limits.md).",
    )
    max_packet_size: int = Field(
        1024 * 1024,
        ge=20,
        le=268_435_455,
        description="Largest MQTT packet in bytes, either way; a client sending a larger one "
        "is disconnected. 1 MiB holds the largest device message (512 KiB payload limit, a "
        "decision upload with base64 thumbnails) and a fetch response (256 KiB chunk) with "
        "topic and properties; it also bounds one message a device can make the broker "
        "hold (Mosquitto 2.0's message_size_limit is deprecated for this option).",
    )
    max_connections: int = Field(
        10_000, ge=1, description="Most clients connected to the listener at once."
    )
    max_inflight_messages: int = Field(
        20,
        ge=1,
        le=65535,
        description="QoS 1/2 messages in flight to one client (not yet acknowledged) that "
        "announces no Receive Maximum (MQTT 3.1.1). An MQTT 5 client's Receive Maximum "
        "replaces it, larger or smaller (measured on 2.0.11: 1,000 in flight to an ingest "
        "that announced 1,000, with this at 20); max_inflight_bytes and max_queued_bytes "
        "bound the bytes either way.",
    )
    max_inflight_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1,
        description="Bytes of QoS 1/2 payload in flight to one client (sent, not yet "
        "acknowledged) before Mosquitto queues instead. Without it (Mosquitto's default, 0) "
        "messages in flight count against no byte limit: with ingest stalled, one device's "
        "large messages at the ingest's Receive Maximum of 1,000 grew the broker past "
        "1.3 GB. Set, what one client holds (in flight and queued) stays under "
        "max_queued_bytes + max_inflight_bytes + one packet. Mosquitto 2.0.11 still moves "
        "queued messages into flight by count (the client's Receive Maximum) alone, and "
        "holds a copy of each packet it sends until the socket takes it, so the ingest's "
        "Receive Maximum (64) x max_packet_size bounds those copies (README, 'What the "
        "broker holds for one client').",
    )
    max_queued_messages: int = Field(
        100_000,
        ge=1,
        description="QoS 1/2 messages queued for one client beyond those in flight. The "
        "ingest's shared subscription must absorb a fleet's burst while a worker catches "
        "up (Mosquitto's default of 1000 dropped heartbeats at 1,000 devices). Global: a "
        "device's queue (its directive, fetch responses it asked for) has the same bound.",
    )
    max_queued_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        description="Bytes of QoS 1/2 payload held for one client (queued and in flight) "
        "beyond max_inflight_bytes (0: no limit); past it new messages for that client are "
        "dropped, after their publisher got its PUBACK (Mosquitto logs 'Outgoing messages "
        "are being dropped for client ...' and counts $SYS/broker/publish/messages/dropped). "
        "Measured: with no limit a device whose fetch responses were not read, or ingest "
        "stalled, queued 400 MB. 256 MiB holds the ingest's 100,000-message burst at 2.6 KB "
        "a message (heartbeats, states, telemetry are well below) and bounds one client's "
        "queue.",
    )
    max_keepalive: int = Field(
        300, ge=10, le=65535, description="Longest keepalive (s) granted to MQTT 5 clients."
    )
    persistence: bool = Field(
        True, description="Keep retained messages and sessions in state_dir/data/ across restarts."
    )
    autosave_interval_s: int = Field(
        60, ge=0, description="Seconds between saves of the persistence database (0: on exit)."
    )
    persistent_client_expiration: str = Field(
        "30d",
        description="Drop the session of a client gone this long (number + h, d, w, m or y).",
    )
    start_timeout_s: float = Field(
        10.0, gt=0, le=300, description="How long start() waits for the listener."
    )
    stop_timeout_s: float = Field(
        10.0, gt=0, le=300, description="How long stop() waits before killing mosquitto."
    )

    @field_validator("binary", "fleet_identity", "persistent_client_expiration")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if not value or _CONTROL.search(value):
            raise ValueError("must be a non-empty single line")
        return value

    @field_validator("state_dir", "cafile", "crlfile", "certfile", "keyfile")
    @classmethod
    def _path_one_line(cls, value: Path) -> Path:
        if _CONTROL.search(str(value)):
            raise ValueError("a path with a control character (newline?) is refused")
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if value == "localhost":
            return value
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address or localhost") from None
        return value

    @field_validator("fleet_identity")
    @classmethod
    def _identity(cls, value: str) -> str:
        if not topics.is_device_id(value):
            raise ValueError(f"{value!r} has characters an ACL user name can't hold")
        return value

    @field_validator("persistent_client_expiration")
    @classmethod
    def _expiry(cls, value: str) -> str:
        if not _EXPIRY.match(value):
            raise ValueError(f"{value!r} is not a duration like 30d (h, d, w, m, y)")
        return value

    def client_memory_bound(self, receive_maximum: int) -> int:
        """Most bytes of broker memory one connected client's undelivered messages can
        take, for a client that announced ``receive_maximum`` (MQTT 5 Receive Maximum;
        Mosquitto uses ``max_inflight_messages`` for a client that announces none).

        Held payloads: Mosquitto admits a message to a client while the bytes it holds
        for it, less ``max_inflight_bytes``, are under ``max_queued_bytes``, and while the
        messages it holds, less the Receive Maximum, are under ``max_queued_messages``.
        Copies: each message in flight has its PUBLISH packet built once, kept until the
        socket takes it (a client that stopped reading takes nothing). Overhead: what each
        held message takes beside its payload (:data:`MESSAGE_OVERHEAD_BYTES`).
        """
        if receive_maximum < 1:
            raise ValueError(f"receive_maximum {receive_maximum} is not >= 1")
        messages = self.max_queued_messages + receive_maximum
        held = messages * self.max_packet_size
        if self.max_queued_bytes:
            held = min(held, self.max_queued_bytes + self.max_inflight_bytes + self.max_packet_size)
        copies = min(receive_maximum * self.max_packet_size, held)
        return held + copies + messages * MESSAGE_OVERHEAD_BYTES

    @property
    def conf_path(self) -> Path:
        """Where mosquitto.conf is written."""
        return self.state_dir / CONF_NAME

    @property
    def acl_path(self) -> Path:
        """Where the ACL file is written."""
        return self.state_dir / ACL_NAME

    @property
    def data_dir(self) -> Path:
        """Where Mosquitto keeps its persistence database."""
        return self.state_dir / DATA_DIR


def mosquitto_conf(config: MosquittoConfig, run_as: str | None = None) -> str:
    """The text of mosquitto.conf for ``config``.

    ``run_as``: the user Mosquitto keeps when started as root (it would otherwise switch
    to ``mosquitto`` and could not read the files fleet-server wrote mode 0600).
    """
    if run_as is not None and (not run_as or _CONTROL.search(run_as) or " " in run_as):
        raise ValueError(f"{run_as!r} is not a user name")
    lines = [
        "# Written by fleet-server at every start; edits here are lost.",
        *([f"user {run_as}"] if run_as else []),
        "per_listener_settings false",
        "allow_anonymous false",
        f"acl_file {config.acl_path}",
        f"max_packet_size {config.max_packet_size}",
        f"max_inflight_messages {config.max_inflight_messages}",
        f"max_inflight_bytes {config.max_inflight_bytes}",
        f"max_queued_messages {config.max_queued_messages}",
        f"max_queued_bytes {config.max_queued_bytes}",
        f"max_keepalive {config.max_keepalive}",
        f"persistent_client_expiration {config.persistent_client_expiration}",
        f"persistence {'true' if config.persistence else 'false'}",
        f"persistence_location {config.data_dir}/",
        f"autosave_interval {config.autosave_interval_s}",
        "log_dest stderr",
        "log_timestamp false",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "log_type information",
        "",
        f"listener {config.port} {config.host}",
        f"max_connections {config.max_connections}",
        f"cafile {config.cafile}",
        f"certfile {config.certfile}",
        f"keyfile {config.keyfile}",
        f"crlfile {config.crlfile}",
        "require_certificate true",
        "use_identity_as_username true",
        *(["use_username_as_clientid true"] if config.clientid_is_identity else []),
        f"tls_version {config.tls_version}",
    ]
    return "\n".join(lines) + "\n"
