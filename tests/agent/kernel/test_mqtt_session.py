"""The one MQTT session helper against a real Mosquitto: reconnects and subscribes again,
reports a refused connect and a refused publish, routes by topic filter, and outlives a
handler that raises."""

from __future__ import annotations

import getpass
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from agent.kernel.mqtt import MqttSession, SessionOptions
from tests.support.broker import Broker, free_port, mosquitto_binary

WAIT_S = 10.0


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def own_broker(tmp_path: Path, lines: str) -> tuple[Broker, subprocess.Popen[bytes]]:
    """A Mosquitto with ``lines`` in its config, listening (it keeps the current user,
    so that it reads files in ``tmp_path`` when started as root)."""
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(
        f"user {getpass.getuser()}\nlistener {port} 127.0.0.1\npersistence false\n{lines}"
    )
    proc = subprocess.Popen(
        [mosquitto_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    broker = Broker("127.0.0.1", port, tmp_path)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((broker.host, port), timeout=0.2):
                return broker, proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("mosquitto did not listen")


def pub(broker: Broker, topic: str, payload: str) -> None:
    subprocess.run(
        ["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), "-t", topic, "-m", payload],
        check=True,
        timeout=WAIT_S,
    )


@pytest.fixture
def sessions() -> Iterator[list[MqttSession]]:
    made: list[MqttSession] = []
    yield made
    for s in made:
        s.stop(timeout_s=5.0)


def _session(made: list[MqttSession], broker: Broker, name: str, **options: object) -> MqttSession:
    settings: dict[str, object] = {"reconnect_max_s": 1, "check_s": 0.05, **options}
    opts = SessionOptions(
        host=broker.host,
        port=broker.port,
        client_id=f"test-{name}",
        **settings,  # type: ignore[arg-type]
    )
    session = MqttSession(name, opts)
    made.append(session)
    return session


def test_after_the_broker_restarts_the_session_reconnects_and_subscribes_again(
    own_mosquitto: Broker, sessions: list[MqttSession]
) -> None:
    got: list[str] = []
    session = _session(sessions, own_mosquitto, "restart")
    sub = session.subscribe("line/+/temp", lambda m: got.append(m.topic), qos=1)
    session.start()
    assert sub.granted.wait(WAIT_S)
    own_mosquitto.stop()
    wait_for(lambda: not session.connected, "the loss")
    assert not sub.granted.is_set()
    own_mosquitto.start()
    assert sub.granted.wait(WAIT_S), "not subscribed again after the restart"
    pub(own_mosquitto, "line/a/temp", "1")
    wait_for(lambda: got == ["line/a/temp"], "the message after the restart")
    snap = session.snapshot()
    assert snap["connects"] == 2
    assert snap["disconnects"] == 1


def test_a_refused_connect_is_reported_not_only_logged(
    tmp_path: Path, sessions: list[MqttSession]
) -> None:
    broker, proc = own_broker(tmp_path, "allow_anonymous false\n")
    try:
        downs: list[str] = []
        session = _session(sessions, broker, "refused")
        session.add_listener(on_down=downs.append)
        session.start()
        wait_for(lambda: session.counts["connect_refused"] >= 1, "the refused CONNACK")
        # the listeners are told just after the counter moves, on the network thread
        wait_for(lambda: any("refused" in d for d in downs), "the listener told")
        assert not session.connected
        assert "refused the connection" in session.last_error
        assert session.snapshot()["connect_refused"] >= 1
    finally:
        proc.terminate()
        proc.wait(5)


def test_a_publish_the_broker_refuses_is_a_failure(
    tmp_path: Path, sessions: list[MqttSession]
) -> None:
    (tmp_path / "acl").write_text("topic readwrite allowed/#\n")
    broker, proc = own_broker(tmp_path, f"allow_anonymous true\nacl_file {tmp_path / 'acl'}\n")
    try:
        session = _session(sessions, broker, "pub")
        session.start()
        assert session.wait_connected(WAIT_S)
        good = session.publish("allowed/x", b"1", qos=1)
        bad = session.publish("forbidden/x", b"1", qos=1)
        assert good.wait(WAIT_S)
        assert good.ok
        assert bad.wait(WAIT_S)
        assert bad.refused
        assert not bad.ok
        assert bad.reason is not None
        assert bad.reason.value == 0x87
        assert session.snapshot()["publish_refused"] == 1
    finally:
        proc.terminate()
        proc.wait(5)


def test_a_handler_that_raises_does_not_stop_the_session(
    mosquitto: Broker, sessions: list[MqttSession]
) -> None:
    got: list[bytes] = []

    def handler(m: mqtt.MQTTMessage) -> None:
        if m.payload == b"boom":
            raise OverflowError("hostile payload")
        got.append(bytes(m.payload))

    session = _session(sessions, mosquitto, "raises")
    sub = session.subscribe("raises/t", handler)
    session.start()
    assert sub.granted.wait(WAIT_S)
    pub(mosquitto, "raises/t", "boom")
    pub(mosquitto, "raises/t", "fine")
    wait_for(lambda: got == [b"fine"], "the message after the one that raised")
    assert session.thread_alive
    assert session.guard.errors() == {"on_message raises/t": 1}
    assert session.guard.restarts == 0


def test_messages_go_to_the_handler_of_each_matching_filter(
    mosquitto: Broker, sessions: list[MqttSession]
) -> None:
    a: list[str] = []
    b: list[str] = []
    session = _session(sessions, mosquitto, "route")
    sa = session.subscribe("route/a/#", lambda m: a.append(m.topic))
    sb = session.subscribe("$share/g/other/+/x", lambda m: b.append(m.topic))
    session.start()
    assert sa.granted.wait(WAIT_S)
    assert sb.granted.wait(WAIT_S)
    pub(mosquitto, "route/a/x", "1")
    pub(mosquitto, "other/b/x", "2")
    pub(mosquitto, "route/b/x", "3")  # no filter of the session: never delivered
    wait_for(lambda: len(a) == 1 and len(b) == 1, "both routes")
    assert a == ["route/a/x"]
    assert b == ["other/b/x"]
    assert session.unsubscribe(["route/a/#"], timeout_s=WAIT_S)
    pub(mosquitto, "route/a/y", "4")
    pub(mosquitto, "other/c/x", "5")
    wait_for(lambda: len(b) == 2, "the shared route after the unsubscribe")
    assert a == ["route/a/x"]


def test_a_subscription_added_while_connected_is_sent_at_once(
    mosquitto: Broker, sessions: list[MqttSession]
) -> None:
    session = _session(sessions, mosquitto, "late")
    ups = threading.Event()
    session.add_listener(on_up=ups.set)
    session.start()
    assert ups.wait(WAIT_S)
    got: list[str] = []
    sub = session.subscribe("late/t", lambda m: got.append(m.topic))
    assert sub.granted.wait(WAIT_S)
    pub(mosquitto, "late/t", "1")
    wait_for(lambda: got == ["late/t"], "the message")
    with pytest.raises(ValueError, match="subscribed already"):
        session.subscribe("late/t", lambda m: got.append(m.topic))


def test_stop_ends_the_network_thread_within_its_timeout(
    mosquitto: Broker, sessions: list[MqttSession]
) -> None:
    session = _session(sessions, mosquitto, "stop")
    session.start()
    assert session.wait_connected(WAIT_S)
    t0 = time.monotonic()
    session.stop(timeout_s=2.0)
    assert time.monotonic() - t0 < 3.0
    assert not session.connected
    assert not session.thread_alive
