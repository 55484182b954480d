"""Light agents for the console's browser tests: devices that enroll over the fleet
server's API (one-time token, their own key and CSR), connect to its Mosquitto with their
own TLS certificate, report a retained state and heartbeats, and answer a signed
directive the way the real agent reports an install (an ``install`` event through the
outbox and the same report retained on ``install/state``, outcome ``committed``, then a
state whose active bundle is the assigned one). They run no model:
the rollout's waves advance on real directives and real reports through real ingest.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from agent.wire import topics
from agent.wire.enroll import ENROLL_PATH
from agent.wire.messages import BundleRef, Event, Heartbeat, ReportedState, encode
from fleet_server.ca import make_device_key_and_csr
from tests.fleet_server.fleet_api_support import http

CONNECT_TIMEOUT_S = 20.0
BEAT_S = 1.0
PROFILE = "x86-gateway"

Targets = Mapping[str, tuple[str, str, int]]
"""Directive target path -> (bundle, version, release)."""


class LightAgent:
    """One simulated device on its own paho client (network thread of its own)."""

    def __init__(
        self,
        device_id: str,
        labels: Mapping[str, str],
        active: BundleRef,
        targets: Targets,
        identity: tuple[Path, Path, Path],
        broker: tuple[str, int],
    ) -> None:
        self.device_id = device_id
        self.labels = dict(labels)
        self.active = active
        self.previous: BundleRef | None = None
        self.targets = targets
        self.installs: list[int] = []
        self.failure = ""
        self.seq = 0
        self.connected = threading.Event()
        ca, cert, key = identity
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(str(cert), str(key))
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device_id, protocol=mqtt.MQTTv5)
        client.tls_set_context(context)
        client.will_set(topics.state(device_id), encode(ReportedState.offline(device_id)), 1, True)
        client.on_connect = self._on_connect
        client.on_message = self._on_message
        self.client = client
        self.broker = broker

    def start(self) -> None:
        self.client.connect_async(*self.broker)
        self.client.loop_start()

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _state(self) -> None:
        state = ReportedState(
            device_id=self.device_id,
            ts=time.time(),
            agent_version="0.1.0",
            profile=PROFILE,
            labels=self.labels,
            active=self.active,
            previous=self.previous,
        )
        self.client.publish(topics.state(self.device_id), encode(state), qos=1, retain=True)

    def _on_connect(self, c: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        if rc.is_failure:
            self.failure = f"connect: {rc}"
            return
        self._state()
        c.subscribe(topics.directive(self.device_id), qos=1)
        self.connected.set()

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if not msg.payload:
            return  # a cleared directive
        try:
            signed = json.loads(msg.payload)["signed"]
            name, version, release = next(
                self.targets[p] for p in signed["targets"] if p in self.targets
            )
        except (ValueError, KeyError, TypeError, StopIteration):
            self.failure = f"directive not understood: {msg.payload[:80]!r}"
            return
        now = time.time()
        report = {"at": now, "source": "mqtt", "bundle": name, "release": release,
                  "version": version, "counter": signed.get("version"),
                  "outcome": "committed", "step": "commit", "reason": "", "slot": "b"}  # fmt: skip
        event = Event(
            device_id=self.device_id,
            kind="install",
            event_id=f"install:{release}:{signed.get('version')}",
            ts=now,
            payload=report,
        )
        self.client.publish(topics.events(self.device_id), encode(event), qos=1)
        # and, as the agent's directive service does, the same report retained
        self.client.publish(topics.install_state(self.device_id), json.dumps(report), qos=1,
                            retain=True)  # fmt: skip
        self.previous, self.active = (
            self.active,
            BundleRef(name=name, version=version, release=release),
        )
        self._state()
        self.installs.append(release)

    def beat(self) -> None:
        beat = Heartbeat(device_id=self.device_id, seq=self.seq, ts=time.time())
        self.seq += 1
        self.client.publish(topics.heartbeat(self.device_id), encode(beat), qos=1)


def enroll(
    url: str, token: str, device_id: str, labels: Mapping[str, str], out: Path
) -> tuple[Path, Path, Path]:
    """Enroll ``device_id`` through the API with the operator ``token``; returns the
    paths of the fleet CA, the device certificate and its key."""
    made = http(
        "POST", f"{url}/api/v1/devices/{device_id}/tokens",
        {"labels": dict(labels), "profile": PROFILE}, token=token,
    )  # fmt: skip
    assert made.status == 201, made.body
    key_pem, csr_pem = make_device_key_and_csr(device_id)
    answer = http("POST", url + ENROLL_PATH, {"token": made.body["token"], "csr": csr_pem.decode()})
    assert answer.status == 200, answer.body
    ca, cert, key = out / "ca.crt", out / f"{device_id}.crt", out / f"{device_id}.key"
    ca.write_text(answer.body["ca"])
    cert.write_text(answer.body["certificate"])
    key.write_bytes(key_pem)
    key.chmod(0o600)
    return ca, cert, key


class LightFleet:
    """Some light agents and a thread that sends their heartbeats."""

    def __init__(self, agents: list[LightAgent]) -> None:
        self.agents = agents
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="light-beats", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            for a in self.agents:
                a.beat()

    def start(self) -> None:
        for a in self.agents:
            a.start()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        for a in self.agents:
            left = max(0.0, deadline - time.monotonic())
            assert a.connected.wait(left), f"{a.device_id} did not connect: {a.failure}"
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for a in self.agents:
            a.stop()
