"""A light simulated fleet for the ingest benches and the ingest tests.

:class:`SimFleet` publishes heartbeats of the real contract for N device ids: through a
few shared paho clients, or one client per device when each has its own TLS identity.
:func:`hil.bench.ingest.bench_ingest` runs ingest workers against a burst from such a fleet.
"""

from __future__ import annotations

import ssl
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from agent.wire import topics
from agent.wire.messages import Heartbeat, encode
from fleet_server.errors import FleetError

CONNECT_TIMEOUT_S = 10.0
INFLIGHT = 200


class SimError(FleetError):
    """The simulated fleet can't connect or publish.

    Attributes:
        reason: what failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"simulated fleet: {reason}")


@dataclass(frozen=True)
class SimReport:
    """What one run of the simulated fleet sent."""

    devices: int
    clients: int
    sent: int
    refused: int
    elapsed_s: float

    @property
    def msgs_per_s(self) -> float:
        """Messages acknowledged by the broker per second."""
        return self.sent / self.elapsed_s if self.elapsed_s > 0 else 0.0


class _Publisher:
    """One paho client publishing for some of the device ids."""

    def __init__(self, host: str, port: int, client_id: str, context: ssl.SSLContext | None):
        self.connected = threading.Event()
        self.acked = 0
        self.refused = 0
        self.failure = ""
        self._lock = threading.Lock()
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        if context is not None:
            client.tls_set_context(context)
        client.max_inflight_messages_set(INFLIGHT)
        client.on_connect = self._on_connect
        client.on_publish = self._on_publish
        self.client = client
        self.host, self.port = host, port

    def start(self) -> None:
        self.client.connect_async(self.host, self.port, keepalive=30)
        self.client.loop_start()

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def publish(self, topic: str, payload: bytes) -> None:
        info = self.client.publish(topic, payload, qos=1)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            with self._lock:
                self.refused += 1

    def _on_connect(self, _c: mqtt.Client, _u: Any, _f: Any, rc: ReasonCode, _p: Any) -> None:
        if rc.is_failure:
            self.failure = str(rc)
        else:
            self.connected.set()

    def _on_publish(self, _c: mqtt.Client, _u: Any, _mid: int, rc: ReasonCode, _p: Any) -> None:
        with self._lock:
            if rc.is_failure:
                self.refused += 1
            else:
                self.acked += 1


class SimFleet:
    """``devices`` simulated agents that send heartbeats.

    Args:
        clients: paho connections shared among the device ids (without identities).
        identity: device id -> its TLS context; one client per device, named by its id.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        devices: int,
        clients: int = 4,
        prefix: str = "sim",
        identity: Callable[[str], ssl.SSLContext] | None = None,
    ) -> None:
        if devices < 1 or clients < 1:
            raise SimError(f"devices {devices} and clients {clients} must be >= 1")
        self.device_ids = [f"{prefix}-{i:05d}" for i in range(devices)]
        if identity is not None:
            self._pubs = [_Publisher(host, port, d, identity(d)) for d in self.device_ids]
        else:
            run = uuid.uuid4().hex[:8]
            n = min(clients, devices)
            self._pubs = [_Publisher(host, port, f"{prefix}-{run}-{i}", None) for i in range(n)]
        self._seq = dict.fromkeys(self.device_ids, 0)

    def __enter__(self) -> SimFleet:
        self.connect()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def connect(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Connect every client.

        Raises:
            SimError: a client not connected within ``timeout_s``.
        """
        for pub in self._pubs:
            pub.start()
        deadline = time.monotonic() + timeout_s
        for pub in self._pubs:
            if not pub.connected.wait(max(0.0, deadline - time.monotonic())):
                self.close()
                raise SimError(f"a client did not connect within {timeout_s:g} s {pub.failure}")

    def close(self) -> None:
        """Disconnect every client."""
        for pub in self._pubs:
            pub.stop()

    def _publisher(self, index: int) -> _Publisher:
        return self._pubs[index % len(self._pubs)]

    def heartbeats(self, devices: Sequence[int] | None = None) -> int:
        """Publish one heartbeat for each device (by index; all by default); how many."""
        now = time.time()
        indexes = range(len(self.device_ids)) if devices is None else devices
        for i in indexes:
            device_id = self.device_ids[i]
            seq = self._seq[device_id]
            self._seq[device_id] = seq + 1
            beat = Heartbeat(device_id=device_id, seq=seq, ts=now)
            self._publisher(i).publish(topics.heartbeat(device_id), encode(beat))
        return len(indexes)

    def sent(self) -> tuple[int, int]:
        """(acknowledged by the broker, refused) so far."""
        return sum(p.acked for p in self._pubs), sum(p.refused for p in self._pubs)

    def wait_acked(self, count: int, timeout_s: float) -> bool:
        """Wait until ``count`` publishes are acknowledged or refused."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sum(self.sent()) >= count:
                return True
            time.sleep(0.01)
        return False

    def run(self, duration_s: float, rate_hz: float = 1.0) -> SimReport:
        """Heartbeats at ``rate_hz`` from every device for ``duration_s``; what was sent."""
        start = time.monotonic()
        published = 0
        tick = 0
        while time.monotonic() - start < duration_s:
            published += self.heartbeats()
            tick += 1
            pause = start + tick / rate_hz - time.monotonic()
            if pause > 0:
                time.sleep(min(pause, duration_s))
        self.wait_acked(published, CONNECT_TIMEOUT_S)
        acked, refused = self.sent()
        return SimReport(
            len(self.device_ids), len(self._pubs), acked, refused, time.monotonic() - start
        )
