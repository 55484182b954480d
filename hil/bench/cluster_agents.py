"""Light agents for the cluster bench: many per spawned process, driven by one event loop.

Each agent holds its own TLS identity and paho client, connected to its device's broker
shard. Heartbeats (QoS 1) go out every ``interval_s``, staggered across the interval so
that the fleet's rate is even. A directive is answered the way the real agent reports an
install (an ``install`` event and a reported state whose ``active`` is the bundle), and
recorded by its content (targets and ``custom``: not the counter, expiry or signature),
so the parent can count devices that were told two different things.

The process drives its clients itself: one ``selectors`` loop over the sockets (no fd
limit of ``select``), writes through paho's socket-register callbacks, and
``loop_misc`` once a second (keepalives). :func:`run_agents` is the child's entry point.
"""

from __future__ import annotations

import hashlib
import json
import selectors
import ssl
import time
import zlib
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from agent.wire import topics
from agent.wire.messages import BundleRef, Event, Heartbeat, ReportedState, encode

CONNECT_TIMEOUT_S = 300.0
DRAIN_TIMEOUT_S = 30.0
MISC_EVERY_S = 1.0
SELECT_S = 0.02
PROFILE = "x86-gateway"
CLEARED = "cleared"

Targets = dict[str, tuple[str, str, int]]
"""Directive target path -> (bundle, version, release)."""


def directive_key(signed: dict[str, Any]) -> str:
    """What a directive tells a device, without its counter, expiry or signatures: a
    short hash of its target paths and its ``custom`` fields (device, class, mode)."""
    body = {"targets": sorted(signed.get("targets", {})), "custom": signed.get("custom")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


class LightAgent:
    """One simulated device: its paho client, certificate, and what it saw."""

    def __init__(self, device_id: str, shard: tuple[str, int], spec: dict[str, Any]) -> None:
        self.device_id = device_id
        self.targets: Targets = spec["targets"]
        self.labels: dict[str, str] = spec["labels"]
        self.seq = 0
        self.next_beat = 0.0
        self.connected = False
        self.failure = ""
        self.pending: dict[int, int] = {}
        self.acked: list[int] = []
        self.refused = 0
        self.installs = 0
        self.directives: list[tuple[int, str]] = []
        self.wants_write = False
        self.started = False
        d = spec["dir"]
        context = ssl.create_default_context(cafile=spec["ca"])
        context.load_cert_chain(f"{d}/{device_id}.crt", f"{d}/{device_id}.key")
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device_id, protocol=mqtt.MQTTv5)
        client.tls_set_context(context)
        client.max_inflight_messages_set(100)
        client.will_set(topics.state(device_id), encode(ReportedState.offline(device_id)), 1, True)
        client.on_connect = self._on_connect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        client.on_socket_register_write = self._want
        client.on_socket_unregister_write = self._done
        self.client = client
        self.host, self.port = shard

    def _want(self, _c: mqtt.Client, _u: Any, _s: Any) -> None:
        self.wants_write = True

    def _done(self, _c: mqtt.Client, _u: Any, _s: Any) -> None:
        self.wants_write = False

    def _state(self, active: BundleRef | None) -> None:
        state = ReportedState(
            device_id=self.device_id, ts=time.time(), agent_version="bench",
            profile=PROFILE, labels=self.labels, active=active,
        )  # fmt: skip
        self.client.publish(topics.state(self.device_id), encode(state), qos=1, retain=True)

    def _on_connect(self, c: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        if rc.is_failure:
            self.failure = f"connect: {rc}"
            return
        self.connected = True
        self._state(None)
        c.subscribe(topics.directive(self.device_id), qos=1)

    def _on_publish(self, _c: mqtt.Client, _u: Any, mid: int, rc: Any, _p: Any) -> None:
        seq = self.pending.pop(mid, None)
        if seq is None:
            return
        if rc.is_failure:
            self.refused += 1
        else:
            self.acked.append(seq)

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if not msg.payload:
            self.directives.append((0, CLEARED))
            return
        try:
            signed = json.loads(msg.payload)["signed"]
            counter = int(signed.get("version", 0))
            name, version, release = next(
                self.targets[p] for p in signed["targets"] if p in self.targets
            )
        except (ValueError, KeyError, TypeError, StopIteration):
            self.failure = f"directive not understood: {msg.payload[:80]!r}"
            return
        self.directives.append((counter, directive_key(signed)))
        now = time.time()
        report = {"at": now, "source": "bench", "bundle": name, "release": release,
                  "version": version, "counter": counter, "outcome": "committed",
                  "step": "commit", "reason": "", "slot": "b"}  # fmt: skip
        event = Event(
            device_id=self.device_id, kind="install",
            event_id=f"install:{release}:{counter}", ts=now, payload=report,
        )  # fmt: skip
        self.client.publish(topics.events(self.device_id), encode(event), qos=1)
        self._state(BundleRef(name=name, version=version, release=release))
        self.installs += 1

    def beat(self) -> None:
        beat = Heartbeat(device_id=self.device_id, seq=self.seq, ts=time.time())
        info = self.client.publish(topics.heartbeat(self.device_id), encode(beat), qos=1)
        if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
            self.pending[info.mid] = self.seq
        else:
            self.refused += 1
        self.seq += 1


class _Loop:
    """The process's event loop over its agents' sockets."""

    def __init__(self, agents: list[LightAgent]) -> None:
        self.agents = agents
        self.sel = selectors.DefaultSelector()
        self.next_misc = time.monotonic() + MISC_EVERY_S

    def register(self, agent: LightAgent) -> None:
        sock = agent.client.socket()
        if sock is not None:
            self.sel.register(sock, selectors.EVENT_READ, agent)
            agent.started = True

    def _fail(self, agent: LightAgent, what: str, rc: MQTTErrorCode) -> None:
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS and not agent.failure:
            agent.failure = f"{what}: {rc!s}"
            agent.connected = False
            sock = agent.client.socket()
            if sock is not None and sock in self.sel.get_map():
                self.sel.unregister(sock)

    def turn(self, timeout_s: float = SELECT_S) -> None:
        for key, _ in self.sel.select(timeout_s):
            agent: LightAgent = key.data
            for _ in range(64):  # TLS may hold more decrypted bytes than select sees
                self._fail(agent, "read", agent.client.loop_read())
                sock = agent.client.socket()
                if agent.failure or not isinstance(sock, ssl.SSLSocket) or not sock.pending():
                    break
        for agent in self.agents:
            if agent.wants_write and agent.started and not agent.failure:
                self._fail(agent, "write", agent.client.loop_write())
        now = time.monotonic()
        if now >= self.next_misc:
            self.next_misc = now + MISC_EVERY_S
            for agent in self.agents:
                if agent.started and not agent.failure:
                    self._fail(agent, "misc", agent.client.loop_misc())


def _connect(agents: list[LightAgent], loop: _Loop) -> None:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    for agent in agents:
        if time.monotonic() > deadline:
            agent.failure = "connect: out of time"
            continue
        try:
            agent.client.connect(agent.host, agent.port, keepalive=60)
        except (OSError, ssl.SSLError) as exc:
            agent.failure = f"connect: {exc}"
            continue
        loop.register(agent)
        loop.turn(0)
    while not all(a.connected or a.failure for a in agents) and time.monotonic() < deadline:
        loop.turn()


def run_agents(spec: dict[str, Any], results: Any, go: Any, stop: Any) -> None:
    """A child process: connect ``spec["devices"]`` (id -> [host, port]), report ready;
    once ``go`` is set beat every ``interval_s`` (staggered), answer directives until
    ``stop`` is set (or ``max_s`` passed), drain the acknowledgements, then put one dict
    of what was sent and seen on ``results``."""
    targets = {k: (v[0], v[1], int(v[2])) for k, v in spec["targets"].items()}
    spec = spec | {"targets": targets}
    agents = [LightAgent(d, (h, int(p)), spec) for d, (h, p) in spec["devices"].items()]
    loop = _Loop(agents)
    _connect(agents, loop)
    failed = [f"{a.device_id}: {a.failure or 'not connected'}" for a in agents if not a.connected]
    results.put({"ready": sum(a.connected for a in agents), "failures": failed[:3]}, timeout=30)
    wait_go = time.monotonic() + CONNECT_TIMEOUT_S
    while not go.is_set() and not stop.is_set() and time.monotonic() < wait_go:
        loop.turn()
    interval = float(spec["interval_s"])
    start = time.monotonic()
    for a in agents:
        a.next_beat = start + interval * (zlib.crc32(a.device_id.encode()) % 1000) / 1000
    end = start + float(spec["max_s"])
    while not stop.is_set() and time.monotonic() < end:
        now = time.monotonic()
        for a in agents:
            if now >= a.next_beat and a.connected:
                a.beat()
                a.next_beat += interval
        loop.turn()
    drain = time.monotonic() + DRAIN_TIMEOUT_S
    while any(a.pending and a.connected for a in agents) and time.monotonic() < drain:
        loop.turn()
    for a in agents:
        a.client.disconnect()
        a.client.loop_write()
    results.put(
        {
            "acked": {a.device_id: a.acked for a in agents},
            "directives": {a.device_id: a.directives for a in agents if a.directives},
            "refused": sum(a.refused for a in agents),
            "unacked": sum(len(a.pending) for a in agents),
            "installs": sum(a.installs for a in agents),
            "failures": [f"{a.device_id}: {a.failure}" for a in agents if a.failure][:5],
        },
        timeout=60,
    )
