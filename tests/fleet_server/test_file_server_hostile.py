"""One device's fetch request can't stop the bundle file server for the others: a real
Mosquitto, the real :class:`MqttFileServer`, devices as plain paho clients. A request that
makes the handler raise is answered with an error and the next device is served; a dead
network thread is restarted and counted; health says so."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from agent.wire import topics
from agent.wire.fetch import FetchResponse, decode_response
from fleet_server.distribution import MqttFileServer
from tests.support.broker import Broker

WAIT_S = 10.0
CONTENT = b'{"signed": "root v1"}'


class Device:
    """A device's fetch side: subscribed to its response topic, one request at a time."""

    def __init__(self, broker: Broker, device_id: str) -> None:
        self.device_id = device_id
        self.answers: queue.Queue[FetchResponse] = queue.Queue()
        self._subscribed: queue.Queue[bool] = queue.Queue()
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"{device_id}-fetch", protocol=mqtt.MQTTv5
        )
        c.on_connect = self._on_connect
        c.on_subscribe = self._on_subscribe
        c.on_message = self._on_message
        self.client = c
        c.connect(broker.host, broker.port)
        c.loop_start()
        assert self._subscribed.get(timeout=WAIT_S)

    def _on_connect(self, c: mqtt.Client, _u: Any, _f: Any, rc: ReasonCode, _p: Any) -> None:
        assert not rc.is_failure
        c.subscribe(topics.fetch_response(self.device_id), qos=1)

    def _on_subscribe(self, _c: Any, _u: Any, _m: int, rcs: list[ReasonCode], _p: Any) -> None:
        self._subscribed.put(not rcs[0].is_failure)

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        self.answers.put(decode_response(bytes(msg.payload), msg.properties))

    def ask(self, payload: bytes) -> FetchResponse:
        """Publish ``payload`` as a fetch request (QoS 1) and wait for the answer."""
        info = self.client.publish(topics.fetch_request(self.device_id), payload, qos=1)
        info.wait_for_publish(WAIT_S)
        return self.answers.get(timeout=WAIT_S)

    def fetch(self, path: str) -> FetchResponse:
        rid = uuid.uuid4().hex
        body = f'{{"id": "{rid}", "path": "{path}", "offset": 0, "max": 1024}}'
        answer = self.ask(body.encode())
        assert answer.id == rid
        return answer

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class CrashingFileServer(MqttFileServer):
    """A handler with a bug for one path: it raises what no code path expects."""

    def read_chunk(self, path: str, offset: int, max_len: int) -> tuple[bytes, int]:
        if path == "metadata/boom.json":
            raise RecursionError("maximum recursion depth exceeded (a handler bug)")
        return super().read_chunk(path, offset, max_len)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "repo" / "metadata").mkdir(parents=True)
    (tmp_path / "repo" / "metadata" / "1.root.json").write_bytes(CONTENT)
    return tmp_path / "repo"


@pytest.fixture
def server(repo: Path, mosquitto: Broker) -> Iterator[CrashingFileServer]:
    s = CrashingFileServer(repo, mosquitto.host, mosquitto.port, check_s=0.05)
    s.start(timeout_s=WAIT_S)
    yield s
    s.stop()


@pytest.fixture
def devices(mosquitto: Broker) -> Iterator[list[Device]]:
    made = [Device(mosquitto, name) for name in ("attacker-1", "victim-1")]
    yield made
    for d in made:
        d.close()


def _served(device: Device) -> None:
    answer = device.fetch("metadata/1.root.json")
    assert (answer.status, answer.data) == ("ok", CONTENT)


DEPTH = 1500  # json's C decoder raises RecursionError near 1000 levels; < 4 KiB


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b'{"id": "deep1", "x": ' + b"[" * DEPTH + b"]" * DEPTH + b"}", id="deep"),
        pytest.param(
            b'{"id": "surr1", "path": "metadata/\\ud800.json", "offset": 0, "max": 1}',
            id="lone-surrogate-path",
        ),
        pytest.param(
            b'{"id": "big1", "path": "metadata/1.root.json", "offset": 0, "max": 1, "n": '
            + b"9" * 400
            + b"}",
            id="huge-integer",
        ),
    ],
)
def test_a_hostile_request_is_answered_with_an_error_and_the_next_device_is_served(
    server: CrashingFileServer, devices: list[Device], payload: bytes
) -> None:
    attacker, victim = devices
    answer = attacker.ask(payload)
    assert answer.status == "error"
    assert answer.id == payload.split(b'"')[3].decode()
    _served(victim)
    _served(attacker)
    assert server.guard.thread_alive
    assert server.guard.restarts == 0
    assert server.health().ok


def test_a_request_that_makes_the_handler_raise_gets_an_error_answer_and_is_counted(
    server: CrashingFileServer, devices: list[Device]
) -> None:
    attacker, victim = devices
    answer = attacker.fetch("metadata/boom.json")
    assert (answer.status, answer.reason) == ("error", "the server failed on this request")
    _served(victim)
    health = server.health()
    assert health.ok, health.detail
    assert health.detail["failed"] == 1
    assert health.detail["callback_errors"] == {f"on_message {topics.fetch_request_filter()}": 1}
    assert "RecursionError" in health.detail["last_callback_error"]
    assert server.guard.restarts == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_network_thread_is_restarted_counted_and_serves_the_next_device(
    server: CrashingFileServer, devices: list[Device]
) -> None:
    """A callback outside the guard (a future bug) raises: paho's thread ends. The
    watcher starts it again; the request in hand is lost, the next one is served."""
    attacker, victim = devices
    guarded = server._client.on_message

    def unguarded(*_args: Any) -> None:
        server._client.on_message = guarded  # one shot
        raise RuntimeError("escaped every handler")

    server._client.on_message = unguarded
    attacker.client.publish(topics.fetch_request(attacker.device_id), b"{}", qos=1)
    assert server.guard.wait_restarts(1, WAIT_S), "the dead thread was not restarted"
    assert server.wait_ready(WAIT_S), "not subscribed again after the restart"
    _served(victim)
    health = server.health()
    assert health.ok, health.detail
    assert health.detail["thread_restarts"] == 1
    assert health.detail["thread_alive"] is True


def test_health_fails_while_the_network_thread_is_dead(repo: Path, mosquitto: Broker) -> None:
    """Without the watcher (a very long check interval) a dead thread shows in health."""
    s = MqttFileServer(repo, mosquitto.host, mosquitto.port, check_s=3600)
    s.start(timeout_s=WAIT_S)
    try:
        assert s.health().ok
        s._client.loop_stop()  # the network thread ends, the server does not know
        health = s.health()
        assert not health.ok
        assert health.detail["thread_alive"] is False
    finally:
        s.stop()
