"""The MQTT driver against a real Mosquitto: the shared broker for values, and one of this
module's own with users, a password file and an ACL for refusals and a stall (SIGSTOP);
``mosquitto_pub``/``mosquitto_sub`` are the independent peer. Every type both ways,
payload forms, a subscription's messages, and a reason word for each failure (nothing
received, another type, a publish the ACL refuses, a wrong password, nothing listening,
a stalled and a stopped broker)."""

from __future__ import annotations

import getpass
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agent.line.drivers import driver_class
from agent.line.drivers.base import Point
from agent.line.drivers.configs import MqttLinkConfig
from agent.line.drivers.mqtt import MAX_PAYLOAD_BYTES, MqttDriver, parse_payload, parse_point
from agent.line.errors import LineError
from agent.line.points import parse_point as parse_any
from agent.line.values import ValueMismatch
from agent.mqtt_config import LocalMqttConfig
from tests.support.broker import Broker, free_port, mosquitto_binary

TIMEOUT_MS = 500.0
MARGIN_S = 2.0  # a loaded 2-core machine: the point is "bounded", not "fast"
WAIT_S = 5.0
USER, PASSWORD = "line", "mq-s3cret"
PLC_USER, PLC_PASSWORD = "plc", "plc-s3cret"  # the PLC's side: it may write ro/#
PW_NAME = "LINE_MQTT_PASSWORD"  # the secret's name (the driver reads it by this name)

VALUES: dict[str, Any] = {
    "bool": True,
    "int16": -12345,
    "uint16": 65535,
    "int32": -2_000_000_000,
    "uint32": 4_000_000_000,
    "int64": -(2**62),
    "float32": 1.5,
    "float64": -2.718281828459045,
    "string": "Teil-42 ✓",
}


def wait_until(cond: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@dataclass
class SecuredBroker:
    """A Mosquitto with no anonymous access and two users: ``line`` (the agent: read-write
    ``line/#``, read only ``ro/#``) and ``plc`` (read-write both)."""

    host: str
    port: int
    proc: subprocess.Popen[bytes]

    def pub(self, topic: str, payload: str, *, retain: bool = False) -> None:
        args = ["mosquitto_pub", "-h", self.host, "-p", str(self.port), "-u", PLC_USER]
        args += ["-P", PLC_PASSWORD, "-t", topic, "-m", payload] + (["-r"] if retain else [])
        subprocess.run(args, check=True, timeout=WAIT_S)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    workdir = tmp_path_factory.mktemp("mqtt-acl")
    passwd, acl, conf = workdir / "passwd", workdir / "acl", workdir / "mosquitto.conf"
    for i, (user, password) in enumerate([(USER, PASSWORD), (PLC_USER, PLC_PASSWORD)]):
        create = ["-c"] if i == 0 else []  # the first one makes the file
        subprocess.run(
            ["mosquitto_passwd", "-b", *create, str(passwd), user, password],
            check=True,
            timeout=WAIT_S,
        )
    acl.write_text(
        f"user {USER}\ntopic readwrite line/#\ntopic read ro/#\n"
        f"user {PLC_USER}\ntopic readwrite line/#\ntopic readwrite ro/#\n"
    )
    port = free_port()
    conf.write_text(
        # it keeps this user (as root it would switch to "mosquitto", who can't read workdir)
        f"user {getpass.getuser()}\nlistener {port} 127.0.0.1\npersistence false\n"
        f"allow_anonymous false\npassword_file {passwd}\nacl_file {acl}\n"
    )
    log = (workdir / "mosquitto.log").open("wb")
    proc = subprocess.Popen([mosquitto_binary(), "-c", str(conf)], stdout=log, stderr=log)
    try:
        assert wait_until(lambda: _listening(port)), "mosquitto with an ACL did not start"
        yield SecuredBroker("127.0.0.1", port, proc)
    finally:
        proc.send_signal(signal.SIGCONT)  # in case a test left it stopped
        proc.terminate()
        proc.wait(5)
        log.close()


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def drivers() -> Iterator[Callable[..., MqttDriver]]:
    """Makes drivers for a broker; every one is closed at the end."""
    made: list[MqttDriver] = []

    def make(port: int, broker: dict[str, Any] | None = None, **kw: Any) -> MqttDriver:
        settings: dict[str, Any] = {"timeout_ms": TIMEOUT_MS, **kw}
        local = LocalMqttConfig(host="127.0.0.1", port=port, **(broker or {}))
        driver = MqttDriver(MqttLinkConfig(name="gw1", driver="mqtt", **settings), mqtt=local)
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()


@pytest.fixture
def driver(mosquitto: Broker, drivers: Callable[..., MqttDriver]) -> MqttDriver:
    d = drivers(mosquitto.port)
    d.open()
    return d


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic prefix of this test's own on the shared broker."""
    return f"line/test/{request.node.name}/{os.getpid()}"


def pt(address: str, vtype: str) -> Point:
    return parse_point(address, vtype)  # type: ignore[arg-type]


def pub(broker: Broker, topic: str, payload: str, *, retain: bool = False) -> None:
    args = ["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), "-t", topic]
    subprocess.run([*args, "-m", payload] + (["-r"] if retain else []), check=True, timeout=WAIT_S)


def reason_of(call: Callable[[], object]) -> LineError:
    with pytest.raises(LineError) as info:
        call()
    return info.value


def secured_driver(
    drivers: Callable[..., MqttDriver], secured: SecuredBroker, secret: str = PW_NAME
) -> MqttDriver:
    return drivers(secured.port, {"username": USER, "password_env": secret})


# -- addresses and payloads ------------------------------------------------------------


@pytest.mark.parametrize(
    "address", ["line/cell1/trigger", "a", "/leading/slash", "линия/1/партия", "t" * 256]
)
def test_parse_point_accepts_topic_names(address: str) -> None:
    assert pt(address, "int16").address == address
    assert parse_any("mqtt", address, "string").parsed == address


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("", "empty"),
        ("line/+/trigger", "wildcard"),
        ("line/#", "wildcard"),
        ("t" * 257, "at most 256 bytes"),
        ("ü" * 129, "at most 256 bytes"),  # 258 bytes of UTF-8
        ("$SYS/broker/uptime", "the broker's own"),
        ("a\x00b", "NUL"),
        ("a\ud800b", "not valid Unicode"),
    ],
)
def test_parse_point_refuses_bad_topics_saying_what_is_wrong(address: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        pt(address, "int16")


@pytest.mark.parametrize(
    ("vtype", "payload", "value"),
    [
        ("bool", b"true", True),
        ("bool", b"0", False),
        ("bool", b" ON\n", True),
        ("int16", b"-42", -42),
        ("int16", b"3.0", 3),
        ("uint32", b"4000000000", 4_000_000_000),
        ("float32", b"1.25", 1.25),
        ("float64", b"7", 7.0),
        ("string", b"P-0001", "P-0001"),
        ("string", b'"P-\\u00e9"', "P-é"),
        ("string", b"42", "42"),
        ("string", b"", ""),
    ],
)
def test_payloads_are_read_as_the_points_type(vtype: str, payload: bytes, value: Any) -> None:
    got = parse_payload(pt("line/x", vtype), payload)
    assert got == value
    assert type(got) is type(value)


@pytest.mark.parametrize(
    ("vtype", "payload", "says"),
    [
        ("bool", b"yes please", "not a bool"),
        ("int16", b"abc", "not a number"),
        ("int16", b"true", "not a number"),
        ("int16", b"3.5", "not a whole number"),
        ("int16", b"70000", "outside int16"),
        ("uint16", b"-1", "outside uint16"),
        ("float32", b"1e39", "outside float32"),
        ("float64", b"1e400", "not a number"),
        ("float64", b"NaN", "not a number"),
        ("int64", b"[1, 2]", "not a number"),
        ("string", b"\xff\xfe", "not UTF-8"),
        ("string", b"x" * 300, "over 254"),
        ("string", b"x" * (MAX_PAYLOAD_BYTES + 1), "too large"),
    ],
)
def test_payloads_not_of_the_points_type_are_refused(vtype: str, payload: bytes, says: str) -> None:
    with pytest.raises(ValueMismatch, match=re.escape(says)):
        parse_payload(pt("line/x", vtype), payload)


def test_parse_point_loads_no_protocol_library() -> None:
    """check-config parses addresses on devices that may lack paho."""
    code = (
        "import sys\n"
        "from agent.line.points import parse_point\n"
        "parse_point('mqtt', 'line/trigger', 'int16')\n"
        "assert 'paho' not in sys.modules, sorted(m for m in sys.modules if 'paho' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_registry_finds_the_driver() -> None:
    assert driver_class("mqtt") is MqttDriver


# -- reading and writing ---------------------------------------------------------------


def test_every_type_is_written_and_read_back(driver: MqttDriver, topic: str) -> None:
    points = [pt(f"{topic}/{vtype}", vtype) for vtype in VALUES]
    driver.watch(points, lambda i, v: None)  # subscribed before the writes
    driver.write([(p, VALUES[p.vtype]) for p in points])
    assert wait_until(lambda: driver.counts["watch_changes"] >= len(points))
    got = driver.read(points)
    for p, value in zip(points, got, strict=True):
        assert value == VALUES[p.vtype], p.vtype
        assert type(value) is type(VALUES[p.vtype]), p.vtype


def test_mosquitto_sub_sees_the_payloads_the_driver_writes(
    mosquitto: Broker, driver: MqttDriver, topic: str
) -> None:
    args = ["mosquitto_sub", "-h", mosquitto.host, "-p", str(mosquitto.port)]
    proc = subprocess.Popen([*args, "-t", f"{topic}/#", "-v", "-W", "20"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    lines: list[str] = []
    pending = b""

    def seen(wanted: str) -> bool:
        nonlocal pending
        if sel.select(timeout=0.05):
            pending += os.read(fd, 65536)
            *done, pending = pending.split(b"\n")
            lines.extend(line.decode() for line in done)
        return wanted in lines

    try:
        ping = pt(f"{topic}/ping", "string")
        deadline = time.monotonic() + WAIT_S
        while not seen(f"{topic}/ping up") and time.monotonic() < deadline:
            driver.write([(ping, "up")])  # until mosquitto_sub is subscribed
        writes = [
            (pt(f"{topic}/flag", "bool"), False),
            (pt(f"{topic}/count", "int32"), -7),
            (pt(f"{topic}/score", "float64"), 0.25),
            (pt(f"{topic}/part", "string"), "P-1 ü"),
        ]
        driver.write(writes)
        expected = [f"{topic}/flag false", f"{topic}/count -7", f"{topic}/score 0.25"]
        expected.append(f"{topic}/part P-1 ü")
        assert wait_until(lambda: all(seen(e) for e in expected)), lines
        got = [line for line in lines if not line.startswith(f"{topic}/ping")]
        assert got == expected  # in the order written
    finally:
        proc.terminate()
        proc.wait(5)
        sel.close()


def test_what_a_plc_publishes_is_read_a_retained_message_at_once(
    mosquitto: Broker, driver: MqttDriver, topic: str
) -> None:
    pub(mosquitto, f"{topic}/part", '"P-77"', retain=True)
    try:
        assert driver.read([pt(f"{topic}/part", "string")]) == ["P-77"]  # the first read
    finally:
        pub(mosquitto, f"{topic}/part", "", retain=True)  # clears the retained message
    count = pt(f"{topic}/count", "uint16")
    assert reason_of(lambda: driver.read([count])).reason == "bad_node"
    pub(mosquitto, f"{topic}/count", "17")
    assert wait_until(lambda: _value_or_none(driver, count) == 17)


def _value_or_none(driver: MqttDriver, p: Point) -> Any:
    try:
        return driver.read([p])[0]
    except LineError:
        return None


def test_a_topic_nothing_was_received_on_is_bad_node(driver: MqttDriver, topic: str) -> None:
    err = reason_of(lambda: driver.read([pt(f"{topic}/never", "bool")]))
    assert err.reason == "bad_node"
    assert f"{topic}/never" in err.detail


def test_a_payload_of_another_type_is_type_mismatch(
    mosquitto: Broker, driver: MqttDriver, topic: str
) -> None:
    p = pt(f"{topic}/count", "int16")
    got: list[Any] = []
    driver.watch([p], lambda i, v: got.append(v))
    pub(mosquitto, p.address, "abc")
    assert wait_until(lambda: driver.counts["watch_errors"] == 1)
    assert got == []
    err = reason_of(lambda: driver.read([p]))
    assert err.reason == "type_mismatch"
    assert "'abc' is not a number for int16" in err.detail
    err = reason_of(lambda: driver.write([(p, 70000)]))  # refused before it is sent
    assert err.reason == "type_mismatch"
    pub(mosquitto, p.address, "12")
    assert wait_until(lambda: got == [12])


def test_a_subscription_delivers_each_message(
    mosquitto: Broker, driver: MqttDriver, topic: str
) -> None:
    got: list[tuple[int, Any]] = []
    trigger, part = pt(f"{topic}/trigger", "bool"), pt(f"{topic}/part", "string")
    assert driver.watch([trigger, part], lambda i, v: got.append((i, v)))
    pub(mosquitto, trigger.address, "true")
    pub(mosquitto, part.address, "P-9")
    pub(mosquitto, trigger.address, "false")
    assert wait_until(lambda: len(got) == 3)
    assert got == [(0, True), (1, "P-9"), (0, False)]


def test_an_on_change_that_raises_is_counted_and_the_next_message_still_comes(
    mosquitto: Broker, driver: MqttDriver, topic: str
) -> None:
    got: list[int] = []

    def on_change(_index: int, value: Any) -> None:
        got.append(value)
        if value == 1:
            raise RuntimeError("a bug in the station")

    p = pt(f"{topic}/seq", "uint32")
    driver.watch([p], on_change)
    pub(mosquitto, p.address, "1")
    assert wait_until(lambda: driver.counts["watch_errors"] == 1)
    pub(mosquitto, p.address, "2")
    assert wait_until(lambda: got == [1, 2])
    assert driver.read([p]) == [2]


# -- the broker's refusals ---------------------------------------------------------------


def test_a_user_with_a_password_reads_and_writes(
    secured: SecuredBroker, drivers: Callable[..., MqttDriver], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PW_NAME, PASSWORD)
    d = secured_driver(drivers, secured)
    d.open()
    secured.pub("ro/speed", "1200", retain=True)
    assert d.read([pt("ro/speed", "int32")]) == [1200]
    p = pt("line/result", "uint16")
    d.watch([p], lambda i, v: None)
    d.write([(p, 3)])
    assert wait_until(lambda: _value_or_none(d, p) == 3)


def test_a_publish_the_acl_refuses_is_denied(
    secured: SecuredBroker, drivers: Callable[..., MqttDriver], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PW_NAME, PASSWORD)
    d = secured_driver(drivers, secured)
    d.open()
    err = reason_of(lambda: d.write([(pt("line/ok", "bool"), True), (pt("ro/speed", "int32"), 1)]))
    assert err.reason == "denied"
    assert "ro/speed" in err.detail
    assert "Not authorized" in err.detail
    d.write([(pt("line/ok", "bool"), False)])  # the connection is still good


def test_a_wrong_password_is_denied(
    secured: SecuredBroker, drivers: Callable[..., MqttDriver], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PW_NAME, "not-the-password")
    d = secured_driver(drivers, secured)
    err = reason_of(d.open)
    assert err.reason == "denied"
    assert "refused the connection" in err.detail
    assert not d.connected


def test_a_missing_secret_is_denied_naming_the_secret(
    secured: SecuredBroker, drivers: Callable[..., MqttDriver], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = "LINE_MQTT_MISSING"
    monkeypatch.delenv(missing, raising=False)
    err = reason_of(secured_driver(drivers, secured, missing).open)
    assert err.reason == "denied"
    assert missing in err.detail


def test_nothing_listening_is_refused(drivers: Callable[..., MqttDriver]) -> None:
    d = drivers(free_port())
    started = time.monotonic()
    err = reason_of(d.open)
    assert err.reason == "refused"
    assert time.monotonic() - started < TIMEOUT_MS / 1000 + MARGIN_S
    assert reason_of(lambda: d.read([pt("line/x", "bool")])).reason == "disconnected"


def test_a_stalled_broker_is_a_timeout_within_the_timeout(
    secured: SecuredBroker, drivers: Callable[..., MqttDriver], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PW_NAME, PASSWORD)
    d = secured_driver(drivers, secured)
    d.open()
    p = pt("line/stall", "int16")
    secured.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        err = reason_of(lambda: d.write([(p, 1)]))
        assert err.reason == "timeout"
        assert time.monotonic() - started < TIMEOUT_MS / 1000 + MARGIN_S
        other = secured_driver(drivers, secured)
        started = time.monotonic()
        err = reason_of(other.open)  # TCP is accepted by the kernel; no CONNACK comes
        assert err.reason == "timeout"
        assert time.monotonic() - started < TIMEOUT_MS / 1000 + MARGIN_S
    finally:
        secured.proc.send_signal(signal.SIGCONT)
    d.write([(p, 2)])


def test_a_lost_broker_is_disconnected_on_the_next_call(
    own_mosquitto: Broker, drivers: Callable[..., MqttDriver]
) -> None:
    d = drivers(own_mosquitto.port)
    d.open()
    p = pt("line/lost", "uint16")
    d.watch([p], lambda i, v: None)
    d.write([(p, 5)])
    assert wait_until(lambda: _value_or_none(d, p) == 5)
    own_mosquitto.stop()
    try:
        assert wait_until(lambda: not d.connected)
        assert reason_of(lambda: d.read([p])).reason == "disconnected"
        assert reason_of(lambda: d.write([(p, 1)])).reason == "disconnected"
    finally:
        own_mosquitto.start()
    d.close()
    d.open()
    assert reason_of(lambda: d.read([p])).reason == "bad_node"  # forgotten with the session
    d.write([(p, 6)])
    assert wait_until(lambda: _value_or_none(d, p) == 6)


def test_close_ends_the_session(mosquitto: Broker, drivers: Callable[..., MqttDriver]) -> None:
    d = drivers(mosquitto.port)
    d.open()
    assert d.connected
    d.close()
    assert not d.connected
    assert reason_of(lambda: d.write([(pt("line/x", "bool"), True)])).reason == "disconnected"
