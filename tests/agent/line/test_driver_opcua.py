"""The OPC UA driver (asyncua's client) against a real OPC UA server on loopback
(hil.plc.opcua_plc: asyncua's server with the line's variables): every type both ways, a
subscription's changes, Basic256Sha256 with a user and a password, and a reason word for
each failure (a missing node, another type, a read-only node, a wrong password, a wrong
pinned certificate, nothing listening, a stalled server, a session that died)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.line.drivers import driver_class
from agent.line.drivers.base import Point
from agent.line.drivers.configs import OpcUaLinkConfig
from agent.line.drivers.opcua import OpcUaDriver, parse_point
from agent.line.errors import LineError
from agent.line.points import parse_point as parse_any
from hil.loopback import free_port
from hil.plc.opcua_plc import NAMESPACE_URI, OpcUaPlc, make_certificate

TIMEOUT_MS = 500.0
MARGIN_S = 2.0  # a loaded 2-core machine: the point is "bounded", not "fast"
WAIT_S = 5.0
USER, PASSWORD = "line", "s3cret-pw"
PW_NAME = "PLC1_PASSWORD"  # the secret's name (the driver reads it by this name)
PW_FILE = "plc1_credential"  # a secret's file name in $CREDENTIALS_DIRECTORY

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


@pytest.fixture(scope="module")
def plc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpcUaPlc]:
    """A plain server (no security, anonymous users) shared by the module."""
    sim = OpcUaPlc(tmp_path_factory.mktemp("opcua"))
    sim.start()
    yield sim
    sim.close()


@pytest.fixture(scope="module")
def secure_plc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpcUaPlc]:
    """A server with Basic256Sha256 only and one user with a password."""
    sim = OpcUaPlc(tmp_path_factory.mktemp("opcua-secure"), secure=True, users={USER: PASSWORD})
    sim.start()
    yield sim
    sim.close()


@pytest.fixture(scope="module")
def agent_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("agent-pki"), "agent", "urn:edgefleet:agent")


@pytest.fixture
def drivers() -> Iterator[Callable[..., OpcUaDriver]]:
    """Makes drivers for an endpoint; every one is closed at the end."""
    made: list[OpcUaDriver] = []

    def make(endpoint: str, **kw: Any) -> OpcUaDriver:
        settings: dict[str, Any] = {"security": "none", "timeout_ms": TIMEOUT_MS, **kw}
        driver = OpcUaDriver(
            OpcUaLinkConfig(name="cell1", driver="opcua", endpoint=endpoint, **settings)
        )
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()


@pytest.fixture
def driver(plc: OpcUaPlc, drivers: Callable[..., OpcUaDriver]) -> OpcUaDriver:
    d = drivers(plc.endpoint)
    d.open()
    return d


def point(plc: OpcUaPlc, name: str, vtype: str) -> Point:
    return parse_point(plc.node_id(name), vtype)  # type: ignore[arg-type]


def reason_of(call: Callable[[], object]) -> LineError:
    with pytest.raises(LineError) as info:
        call()
    return info.value


# -- addresses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "ns=2;s=Station1.Trigger",
        "ns=2;i=5",
        "i=85",
        "ns=0;i=2258",
        "nsu=urn:acme:plc;s=Trigger",
        "ns=1;g=72962B91-FA75-4AE6-8D28-B404DC7DAF63",
        "ns=1;b=M/RbKBsRVkePCePcx24oRA==",
        "ns=3;s=Line;A=1",  # a string identifier may hold ; and =
        "s=Trigger",
    ],
)
def test_parse_point_accepts_every_node_id_form(address: str) -> None:
    p = parse_point(address, "int16")
    assert (p.address, p.vtype) == (address, "int16")
    assert parse_any("opcua", address, "bool").address == address


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("", "empty"),
        ("ns=2;s=" + "x" * 300, "at most 256"),
        ("ns=70000;i=1", "0..65535"),
        ("ns=2", "0..65535"),
        ("ns=x;i=1", "0..65535"),
        ("nsu=;s=X", "namespace URI"),
        ("ns=2;x=1", "`i=<number>`"),
        ("Trigger", "`i=<number>`"),
        ("ns=2;i=-1", "`i=` takes a number"),
        ("i=4294967296", "`i=` takes a number"),
        ("ns=2;s=", "non-empty name"),
        ("ns=1;g=not-a-guid", "GUID"),
        ("ns=1;b=@@@", "base64"),
        ("ns=2;s=A\nB", "control character"),
    ],
)
def test_parse_point_refuses_bad_addresses_saying_what_is_wrong(address: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_point(address, "int16")


def test_parse_point_refuses_an_unknown_type() -> None:
    with pytest.raises(ValueError, match="unknown value type"):
        parse_point("ns=2;s=X", "int8")  # type: ignore[arg-type]


def test_parse_point_loads_no_protocol_library() -> None:
    """check-config parses addresses on devices that may lack asyncua."""
    code = (
        "import sys\n"
        "from agent.line.points import parse_point\n"
        "parse_point('opcua', 'ns=2;s=Trigger', 'int16')\n"
        "assert 'asyncua' not in sys.modules, sorted(m for m in sys.modules if 'asyncua' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_registry_finds_the_driver() -> None:
    assert driver_class("opcua") is OpcUaDriver


def test_security_without_a_certificate_is_refused_by_the_config() -> None:
    with pytest.raises(ValueError, match="needs `certificate` and `private_key`"):
        OpcUaLinkConfig(
            name="cell1", driver="opcua", endpoint="opc.tcp://plc:4840", security="sign"
        )


# -- reading and writing ---------------------------------------------------------------


def test_every_type_is_written_and_read_back(plc: OpcUaPlc, driver: OpcUaDriver) -> None:
    points = [point(plc, f"Value_{vtype}", vtype) for vtype in VALUES]
    driver.write([(p, VALUES[p.vtype]) for p in points])
    got = driver.read(points)
    for p, value in zip(points, got, strict=True):
        assert value == VALUES[p.vtype], p.vtype
        assert type(value) is type(VALUES[p.vtype]), p.vtype
    # the server holds them too (it checks the Variant's type on every write)
    assert plc.get("Value_string") == VALUES["string"]
    assert plc.get("Value_uint32") == VALUES["uint32"]


def test_a_value_the_plc_sets_is_read(plc: OpcUaPlc, driver: OpcUaDriver) -> None:
    plc.set("PartId", "P-000123")
    plc.set("TriggerCount", 77)
    assert driver.read([point(plc, "PartId", "string"), point(plc, "TriggerCount", "uint32")]) == [
        "P-000123",
        77,
    ]


def test_a_namespace_uri_node_id_resolves_against_the_server(
    plc: OpcUaPlc, driver: OpcUaDriver
) -> None:
    p = parse_point(f"nsu={NAMESPACE_URI};s=ReadOnly", "int32")
    assert driver.read([p]) == [42]
    unknown = parse_point("nsu=urn:nobody;s=ReadOnly", "int32")
    err = reason_of(lambda: driver.read([unknown]))
    assert err.reason == "bad_node"
    assert "urn:nobody" in err.detail


def test_a_node_that_does_not_exist_is_bad_node(plc: OpcUaPlc, driver: OpcUaDriver) -> None:
    missing = point(plc, "NoSuchNode", "int16")
    err = reason_of(lambda: driver.read([point(plc, "ReadOnly", "int32"), missing]))
    assert err.reason == "bad_node"
    assert "NoSuchNode" in err.detail
    assert "BadNodeIdUnknown" in err.detail
    err = reason_of(lambda: driver.watch([missing], lambda i, v: None))
    assert err.reason == "bad_node"


def test_a_node_of_another_type_is_type_mismatch(plc: OpcUaPlc, driver: OpcUaDriver) -> None:
    as_int16 = point(plc, "Value_float64", "int16")
    err = reason_of(lambda: driver.read([as_int16]))
    assert err.reason == "type_mismatch"
    assert "Double" in err.detail
    assert "int16" in err.detail
    err = reason_of(lambda: driver.write([(as_int16, 3)]))
    assert err.reason == "type_mismatch"
    assert "BadTypeMismatch" in err.detail
    too_big = point(plc, "Value_int16", "int16")
    err = reason_of(lambda: driver.write([(too_big, 70000)]))
    assert err.reason == "type_mismatch"


def test_a_write_to_a_read_only_node_is_denied_and_the_flag_after_it_is_not_written(
    plc: OpcUaPlc, driver: OpcUaDriver
) -> None:
    plc.set("ResultValid", False)
    writes = [(point(plc, "ReadOnly", "int32"), 1), (point(plc, "ResultValid", "bool"), True)]
    err = reason_of(lambda: driver.write(writes))
    assert err.reason == "denied"
    assert "ReadOnly" in err.detail
    assert plc.get("ReadOnly") == 42
    assert plc.get("ResultValid") is False


def test_the_last_write_goes_in_a_call_of_its_own_after_the_others(
    plc: OpcUaPlc, driver: OpcUaDriver
) -> None:
    outcome, score = point(plc, "OutcomeCode", "int16"), point(plc, "Score", "float32")
    valid = point(plc, "ResultValid", "bool")
    plc.write_calls.clear()
    driver.write([(outcome, 3), (score, 0.5), (valid, True)])
    assert list(plc.write_calls) == [["OutcomeCode", "Score"], ["ResultValid"]]
    plc.write_calls.clear()
    driver.write([(valid, False)])
    assert list(plc.write_calls) == [["ResultValid"]]
    assert plc.get("ResultValid") is False


# -- subscriptions ---------------------------------------------------------------------


def test_a_subscription_delivers_the_plcs_changes(plc: OpcUaPlc, driver: OpcUaDriver) -> None:
    plc.set("Trigger", False)
    got: list[tuple[int, Any, str]] = []
    points = [point(plc, "Trigger", "bool"), point(plc, "TriggerCount", "uint32")]
    assert driver.watch(points, lambda i, v: got.append((i, v, threading.current_thread().name)))
    assert wait_until(lambda: {(i, v) for i, v, _ in got} >= {(0, False)})
    plc.set("Trigger", True)
    plc.set("TriggerCount", 5)
    assert wait_until(lambda: {(i, v) for i, v, _ in got} >= {(0, True), (1, 5)})
    assert all(name == "line-cell1-loop" for _, _, name in got)
    assert driver.counts["watch_changes"] >= 3


def test_an_on_change_that_raises_is_counted_and_the_next_change_still_comes(
    plc: OpcUaPlc, driver: OpcUaDriver
) -> None:
    plc.set("Seq", 0)
    got: list[int] = []

    def on_change(_index: int, value: Any) -> None:
        got.append(value)
        if value == 1:
            raise RuntimeError("a bug in the station")

    driver.watch([point(plc, "Seq", "uint32")], on_change)
    assert wait_until(lambda: got == [0])
    plc.set("Seq", 1)
    assert wait_until(lambda: driver.counts["watch_errors"] == 1)
    plc.set("Seq", 2)
    assert wait_until(lambda: got == [0, 1, 2])
    assert driver.read([point(plc, "Seq", "uint32")]) == [2]


def test_a_watched_node_of_another_type_is_counted_not_handed_on(
    plc: OpcUaPlc, driver: OpcUaDriver
) -> None:
    got: list[Any] = []
    driver.watch([point(plc, "Value_float32", "bool")], lambda i, v: got.append(v))
    assert wait_until(lambda: driver.counts["watch_errors"] >= 1)
    assert got == []


# -- security --------------------------------------------------------------------------


@pytest.mark.parametrize("security", ["sign_and_encrypt", "sign"])
def test_basic256sha256_with_a_user_and_password_works(
    secure_plc: OpcUaPlc,
    agent_cert: tuple[Path, Path],
    drivers: Callable[..., OpcUaDriver],
    monkeypatch: pytest.MonkeyPatch,
    security: str,
) -> None:
    monkeypatch.setenv(PW_NAME, PASSWORD)
    cert, key = agent_cert
    d = drivers(
        secure_plc.endpoint,
        security=security,
        certificate=cert,
        private_key=key,
        server_certificate=secure_plc.certificate,
        username=USER,
        password_env=PW_NAME,
    )
    d.open()
    p = point(secure_plc, "Value_uint16", "uint16")
    d.write([(p, 4242)])
    assert d.read([p, point(secure_plc, "ReadOnly", "int32")]) == [4242, 42]


def test_the_password_comes_from_the_credentials_directory(
    secure_plc: OpcUaPlc,
    agent_cert: tuple[Path, Path],
    drivers: Callable[..., OpcUaDriver],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    (tmp_path / PW_FILE).write_text(PASSWORD + "\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    cert, key = agent_cert
    d = drivers(
        secure_plc.endpoint,
        security="sign_and_encrypt",
        certificate=cert,
        private_key=key,
        username=USER,
        password_env=PW_FILE,
    )
    d.open()  # the server's certificate taken from its endpoint (not pinned)
    assert d.read([point(secure_plc, "ReadOnly", "int32")]) == [42]


def test_a_wrong_password_is_denied(
    secure_plc: OpcUaPlc,
    agent_cert: tuple[Path, Path],
    drivers: Callable[..., OpcUaDriver],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PW_NAME, "not-the-password")
    cert, key = agent_cert
    d = drivers(
        secure_plc.endpoint,
        security="sign_and_encrypt",
        certificate=cert,
        private_key=key,
        server_certificate=secure_plc.certificate,
        username=USER,
        password_env=PW_NAME,
    )
    err = reason_of(d.open)
    assert err.reason == "denied"
    assert "BadUserAccessDenied" in err.detail
    assert not d.connected


def test_a_missing_secret_is_denied_naming_the_secret_not_its_value(
    secure_plc: OpcUaPlc,
    agent_cert: tuple[Path, Path],
    drivers: Callable[..., OpcUaDriver],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = "PLC1_MISSING_CREDENTIAL"
    monkeypatch.delenv(missing, raising=False)
    cert, key = agent_cert
    d = drivers(
        secure_plc.endpoint,
        security="sign_and_encrypt",
        certificate=cert,
        private_key=key,
        username=USER,
        password_env=missing,
    )
    err = reason_of(d.open)
    assert err.reason == "denied"
    assert missing in err.detail


def test_a_pinned_certificate_that_is_not_the_servers_is_denied(
    secure_plc: OpcUaPlc,
    agent_cert: tuple[Path, Path],
    drivers: Callable[..., OpcUaDriver],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv(PW_NAME, PASSWORD)
    other, _ = make_certificate(tmp_path, "impostor", "urn:impostor")
    cert, key = agent_cert
    d = drivers(
        secure_plc.endpoint,
        security="sign_and_encrypt",
        certificate=cert,
        private_key=key,
        server_certificate=other,
        username=USER,
        password_env=PW_NAME,
    )
    err = reason_of(d.open)
    assert err.reason == "denied"
    assert "not the pinned one" in err.detail


def test_no_security_against_a_server_that_requires_it_is_denied(
    secure_plc: OpcUaPlc, drivers: Callable[..., OpcUaDriver]
) -> None:
    err = reason_of(drivers(secure_plc.endpoint).open)
    assert err.reason == "denied"


# -- the connection --------------------------------------------------------------------


def test_nothing_listening_is_refused(drivers: Callable[..., OpcUaDriver]) -> None:
    d = drivers(f"opc.tcp://127.0.0.1:{free_port()}")
    err = reason_of(d.open)
    assert err.reason == "refused"
    err = reason_of(lambda: d.read([parse_point("ns=2;s=Trigger", "bool")]))
    assert err.reason == "disconnected"


def test_a_stalled_server_is_a_timeout_within_the_timeout(
    plc: OpcUaPlc, drivers: Callable[..., OpcUaDriver]
) -> None:
    d = drivers(plc.endpoint, timeout_ms=300.0)
    d.open()
    p = point(plc, "ReadOnly", "int32")
    plc.stall(3.0)
    try:
        started = time.monotonic()
        err = reason_of(lambda: d.read([p]))
        took = time.monotonic() - started
        assert err.reason == "timeout"
        assert took < 0.3 + MARGIN_S
        d.close()
        started = time.monotonic()
        err = reason_of(d.open)  # the TCP connect succeeds, the OPC UA hello is not answered
        assert err.reason == "timeout"
        assert time.monotonic() - started < 0.3 + MARGIN_S
    finally:
        plc.resume()
    d.open()
    assert d.read([p]) == [42]


def test_a_session_the_keepalive_finds_dead_is_disconnected_on_the_next_call(
    plc: OpcUaPlc, drivers: Callable[..., OpcUaDriver]
) -> None:
    d = drivers(plc.endpoint, timeout_ms=300.0, keepalive_s=0.2)
    d.open()
    p = point(plc, "ReadOnly", "int32")
    assert d.connected
    plc.stall(3.0)
    try:
        assert wait_until(lambda: not d.connected), "the keep-alive did not notice"
    finally:
        plc.resume()
    err = reason_of(lambda: d.read([p]))
    assert err.reason == "disconnected"
    d.close()
    d.open()
    assert d.read([p]) == [42]


def test_after_the_server_restarts_the_driver_opens_again(
    plc: OpcUaPlc, drivers: Callable[..., OpcUaDriver]
) -> None:
    d = drivers(plc.endpoint)
    d.open()
    p = point(plc, "Value_int32", "int32")
    d.write([(p, 31337)])
    plc.stop()
    try:
        assert wait_until(lambda: not d.connected)
        assert reason_of(lambda: d.read([p])).reason == "disconnected"
        assert reason_of(lambda: d.write([(p, 1)])).reason == "disconnected"
    finally:
        plc.start()
    d.close()
    d.open()
    assert d.read([p]) == [31337]  # the PLC kept its memory


def test_close_ends_the_loop_thread(plc: OpcUaPlc, drivers: Callable[..., OpcUaDriver]) -> None:
    d = drivers(plc.endpoint)
    d.open()
    d.watch([point(plc, "Trigger", "bool")], lambda i, v: None)
    assert any(t.name == "line-cell1-loop" for t in threading.enumerate())
    d.close()
    assert wait_until(lambda: not any(t.name == "line-cell1-loop" for t in threading.enumerate()))
    assert not d.connected
    assert reason_of(lambda: d.read([point(plc, "Trigger", "bool")])).reason == "disconnected"
