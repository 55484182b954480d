"""The Modbus driver (pymodbus's client) against a real Modbus TCP server on loopback
(hil.plc.modbus_plc: pymodbus's server) and, for the word order, libmodbus's ``mbpoll``, an
independent Modbus master: every type both ways in both word orders, strings, adjacent
points read in one request, and a reason word for each failure (IllegalAddress,
IllegalValue, a read-only area, a value that does not fit, nothing listening, a stalled
and a stopped PLC)."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent.line.drivers import driver_class
from agent.line.drivers.base import Point
from agent.line.drivers.configs import ModbusLinkConfig
from agent.line.drivers.modbus import ModbusDriver, parse_point, writable
from agent.line.errors import LineError
from agent.line.points import parse_point as parse_any
from hil.loopback import free_port
from hil.plc.modbus_plc import ModbusPlc

TIMEOUT_MS = 500.0
MARGIN_S = 2.0  # a loaded 2-core machine: the point is "bounded", not "fast"
WAIT_S = 5.0

# address, type, value: every type, laid out without overlaps from hr:0
TYPED: list[tuple[str, str, Any]] = [
    ("hr:0", "int16", -12345),
    ("hr:1", "uint16", 65535),
    ("hr:2", "int32", -70000),
    ("hr:4", "uint32", 4_000_000_000),
    ("hr:6", "float32", 1.5),
    ("hr:8", "int64", -(2**62) - 7),
    ("hr:12", "float64", -2.718281828459045),
    ("hr:16:6", "string", "Teil-42 ✓"),
    ("coil:5", "bool", True),
]


def wait_until(cond: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture(scope="module")
def plc() -> Iterator[ModbusPlc]:
    sim = ModbusPlc(size=1024, unit_id=1)
    sim.start()
    yield sim
    sim.close()


@pytest.fixture
def drivers() -> Iterator[Callable[..., ModbusDriver]]:
    """Makes drivers for a port; every one is closed at the end."""
    made: list[ModbusDriver] = []

    def make(port: int, **kw: Any) -> ModbusDriver:
        settings: dict[str, Any] = {"timeout_ms": TIMEOUT_MS, **kw}
        driver = ModbusDriver(
            ModbusLinkConfig(
                name="press1", driver="modbus", host="127.0.0.1", port=port, **settings
            )
        )
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()


@pytest.fixture
def driver(plc: ModbusPlc, drivers: Callable[..., ModbusDriver]) -> ModbusDriver:
    d = drivers(plc.port)
    d.open()
    return d


def pt(address: str, vtype: str) -> Point:
    return parse_point(address, vtype)  # type: ignore[arg-type]


def reason_of(call: Callable[[], object]) -> LineError:
    with pytest.raises(LineError) as info:
        call()
    return info.value


def mbpoll(plc: ModbusPlc, table: str, ref: int, *values: str, big: bool) -> str:
    """Run libmodbus's mbpoll once against the PLC (0-based references); its output."""
    args = ["mbpoll", "-m", "tcp", "-p", str(plc.port), "-a", "1", "-0", "-1", "-o", "2"]
    args += ["-t", table, "-r", str(ref)] + (["-B"] if big else []) + ["127.0.0.1"]
    if values:
        args += ["--", *values]
    done = subprocess.run(args, capture_output=True, text=True, timeout=10, check=True)
    return done.stdout


# -- addresses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "vtype", "area", "start", "count"),
    [
        ("coil:0", "bool", "coil", 0, 1),
        ("di:65535", "bool", "di", 65535, 1),
        ("hr:0", "int16", "hr", 0, 1),
        ("ir:7", "uint16", "ir", 7, 1),
        ("hr:65534", "int32", "hr", 65534, 2),
        ("ir:100", "float32", "ir", 100, 2),
        ("hr:65532", "int64", "hr", 65532, 4),
        ("hr:10:8", "string", "hr", 10, 8),
        ("ir:0:127", "string", "ir", 0, 127),
    ],
)
def test_parse_point_accepts_the_four_areas(
    address: str, vtype: str, area: str, start: int, count: int
) -> None:
    p = pt(address, vtype)
    assert (p.parsed.area, p.parsed.start, p.parsed.count) == (area, start, count)
    assert parse_any("modbus", address, vtype).parsed == p.parsed  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("address", "vtype", "says"),
    [
        ("coil:0", "int16", "holds one bool"),
        ("di:3", "string", "holds one bool"),
        ("coil:1:2", "bool", "holds one bool"),
        ("hr:0", "bool", "a bool is a `coil:N`"),
        ("hr:65535", "int32", "past 65535"),
        ("hr:65533", "float64", "past 65535"),
        ("hr:65530:8", "string", "past 65535"),
        ("hr:10", "string", "needs its length"),
        ("hr:10:0", "string", "1..127"),
        ("hr:10:128", "string", "1..127"),
        ("hr:1:2", "int16", "only a string takes a length"),
        ("hr:65536", "int16", "0..65535"),
        ("hr:-1", "int16", "0..65535"),
        ("hr:1a", "int16", "0..65535"),
        ("hr: 1", "int16", "0..65535"),
        ("hr:\u0661", "int16", "0..65535"),  # an Arabic-Indic digit one
        ("xx:1", "int16", "write `coil:N`"),
        ("hr", "int16", "write `coil:N`"),
        ("", "int16", "write `coil:N`"),
        ("40001", "int16", "write `coil:N`"),
        ("hr:" + "1" * 40, "int16", "at most 32"),
    ],
)
def test_parse_point_refuses_bad_addresses_saying_what_is_wrong(
    address: str, vtype: str, says: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        pt(address, vtype)


def test_only_coils_and_holding_registers_are_writable() -> None:
    assert writable(pt("coil:1", "bool"))
    assert writable(pt("hr:1", "uint16"))
    assert not writable(pt("di:1", "bool"))
    assert not writable(pt("ir:1", "uint16"))


def test_parse_point_loads_no_protocol_library() -> None:
    """check-config parses addresses on devices that may lack pymodbus."""
    code = (
        "import sys\n"
        "from agent.line.points import parse_point\n"
        "parse_point('modbus', 'hr:10', 'int16')\n"
        "assert 'pymodbus' not in sys.modules, sorted(m for m in sys.modules if 'pymodbus' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_registry_finds_the_driver() -> None:
    assert driver_class("modbus") is ModbusDriver


# -- reading and writing ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("word_order", "int32_words"), [("big", [0xFFFE, 0xEE90]), ("little", [0xEE90, 0xFFFE])]
)
def test_every_type_is_written_and_read_back_in_either_word_order(
    plc: ModbusPlc,
    drivers: Callable[..., ModbusDriver],
    word_order: str,
    int32_words: list[int],
) -> None:
    d = drivers(plc.port, word_order=word_order)
    d.open()
    points = [pt(a, v) for a, v, _ in TYPED]
    d.write([(p, value) for p, (_, _, value) in zip(points, TYPED, strict=True)])
    got = d.read(points)
    for (address, _, value), value_read in zip(TYPED, got, strict=True):
        assert value_read == value, address
        assert type(value_read) is type(value), address
    assert plc.get("hr", 2, 2) == int32_words  # -70000 = 0xFFFEEE90
    assert plc.get("coil", 5) == [1]
    # the string: UTF-8 bytes, high byte first, NUL padded to its 6 registers
    raw = b"".join(w.to_bytes(2, "big") for w in plc.get("hr", 16, 6))
    assert raw == "Teil-42 ✓".encode() + b"\x00"


@pytest.mark.parametrize("word_order", ["big", "little"])
def test_mbpoll_reads_what_the_driver_wrote_and_the_other_way(
    plc: ModbusPlc, drivers: Callable[..., ModbusDriver], word_order: str
) -> None:
    big = word_order == "big"
    d = drivers(plc.port, word_order=word_order)
    d.open()
    d.write([(pt("hr:100", "int32"), -70000), (pt("hr:102", "float32"), 3.25)])
    assert re.search(r"\[100\]:\s+-70000\b", mbpoll(plc, "4:int", 100, big=big))
    assert re.search(r"\[102\]:\s+3\.25\b", mbpoll(plc, "4:float", 102, big=big))
    mbpoll(plc, "4:int", 104, "-123456", big=big)
    mbpoll(plc, "4:float", 106, "-0.5", big=big)
    assert d.read([pt("hr:104", "int32"), pt("hr:106", "float32")]) == [-123456, -0.5]


def test_what_the_plc_sets_is_read_in_every_area(plc: ModbusPlc, driver: ModbusDriver) -> None:
    plc.set("di", 9, [True])
    plc.set("ir", 20, [0x1234, 0xFFFF])
    plc.set("coil", 9, [False])
    plc.set("hr", 30, [0x4142, 0x4300, 0x5A5A])  # "ABC", NUL, then junk past the NUL
    points = [
        pt("di:9", "bool"),
        pt("ir:20", "uint16"),
        pt("ir:21", "int16"),
        pt("coil:9", "bool"),
        pt("hr:30:3", "string"),
    ]
    assert driver.read(points) == [True, 0x1234, -1, False, "ABC"]


def test_adjacent_points_of_one_area_are_read_with_one_request(
    plc: ModbusPlc, driver: ModbusDriver
) -> None:
    points = [
        pt("hr:203", "int32"),  # 203..204
        pt("hr:200", "int16"),
        pt("hr:201", "uint16"),
        pt("hr:202", "int16"),  # 200..204 touch: one request
        pt("hr:210", "uint16"),  # a gap: a request of its own
        pt("ir:200", "uint16"),  # another area: a request of its own
    ]
    plc.reads.clear()
    values = driver.read(points)
    assert len(values) == len(points)
    assert sorted(plc.reads) == [("hr", 200, 5), ("hr", 210, 1), ("ir", 200, 1)]


# -- failures ------------------------------------------------------------------------


def test_an_address_past_the_plcs_map_is_bad_node(plc: ModbusPlc, driver: ModbusDriver) -> None:
    for p in (pt("hr:5000", "int16"), pt("coil:5000", "bool"), pt("ir:1023", "int32")):
        err = reason_of(functools.partial(driver.read, [p]))
        assert err.reason == "bad_node", p.address
        assert "IllegalAddress" in err.detail
    err = reason_of(lambda: driver.write([(pt("hr:5000", "int16"), 1)]))
    assert err.reason == "bad_node"
    assert driver.read([pt("hr:0", "int16")])  # the connection is still good


def test_a_value_the_plc_refuses_is_type_mismatch(plc: ModbusPlc, driver: ModbusDriver) -> None:
    plc.refuse("hr", 301)
    try:
        err = reason_of(lambda: driver.write([(pt("hr:300", "int32"), 5)]))
        assert err.reason == "type_mismatch"
        assert "IllegalValue" in err.detail
    finally:
        plc.accept()


def test_a_value_that_does_not_fit_is_type_mismatch_and_not_sent(
    plc: ModbusPlc, driver: ModbusDriver
) -> None:
    plc.set("hr", 310, [7, 7, 7])
    for p, value in [
        (pt("hr:310", "int16"), 70000),
        (pt("hr:310", "uint16"), -1),
        (pt("hr:310", "float32"), 1e39),
        (pt("hr:310:2", "string"), "five!"),  # 5 bytes in 2 registers
    ]:
        err = reason_of(functools.partial(driver.write, [(p, value)]))
        assert err.reason == "type_mismatch", p.address
    assert plc.get("hr", 310, 3) == [7, 7, 7]


def test_a_string_that_is_not_utf8_is_type_mismatch(plc: ModbusPlc, driver: ModbusDriver) -> None:
    plc.set("hr", 320, [0xFFFE, 0x4100])
    err = reason_of(lambda: driver.read([pt("hr:320:2", "string")]))
    assert err.reason == "type_mismatch"
    assert "not UTF-8" in err.detail


def test_a_write_to_a_read_only_area_is_denied_and_nothing_is_written(
    plc: ModbusPlc, driver: ModbusDriver
) -> None:
    plc.set("coil", 40, [False])
    for read_only in (pt("di:40", "bool"), pt("ir:40", "uint16")):
        writes = [(pt("coil:40", "bool"), True), (read_only, 1)]
        err = reason_of(functools.partial(driver.write, writes))
        assert err.reason == "denied"
        assert read_only.address in err.detail
    assert plc.get("coil", 40) == [0]


def test_a_unit_the_plc_does_not_serve_is_a_protocol_failure(
    plc: ModbusPlc, drivers: Callable[..., ModbusDriver]
) -> None:
    d = drivers(plc.port, unit_id=7)
    d.open()
    err = reason_of(lambda: d.read([pt("hr:0", "int16")]))
    assert err.reason == "protocol"
    assert "DeviceFailure" in err.detail


def test_nothing_listening_is_refused(drivers: Callable[..., ModbusDriver]) -> None:
    d = drivers(free_port())
    err = reason_of(d.open)
    assert err.reason == "refused"
    assert reason_of(lambda: d.read([pt("hr:0", "int16")])).reason == "disconnected"


def test_a_stalled_plc_is_a_timeout_within_the_timeout(
    plc: ModbusPlc, drivers: Callable[..., ModbusDriver]
) -> None:
    d = drivers(plc.port, timeout_ms=300.0)
    d.open()
    p = pt("hr:0", "int16")
    plc.stall(3.0)
    try:
        for call in (lambda: d.read([p]), lambda: d.write([(p, 1)])):
            started = time.monotonic()
            err = reason_of(call)
            assert err.reason == "timeout"
            assert time.monotonic() - started < 0.3 + MARGIN_S
            # the connection was dropped: a late answer is never taken for another's
            assert reason_of(lambda: d.read([p])).reason == "disconnected"
            d.close()
            d.open()
    finally:
        plc.resume()
    d.close()
    d.open()
    d.write([(p, 99)])
    assert d.read([p]) == [99]


def test_a_stopped_plc_is_disconnected_and_the_driver_opens_again(
    plc: ModbusPlc, drivers: Callable[..., ModbusDriver]
) -> None:
    d = drivers(plc.port)
    d.open()
    p = pt("hr:400", "uint32")
    d.write([(p, 123_456_789)])
    plc.stop()
    try:
        assert wait_until(lambda: not d.connected)
        assert reason_of(lambda: d.read([p])).reason == "disconnected"
        assert reason_of(lambda: d.write([(p, 1)])).reason == "disconnected"
        d.close()
        assert reason_of(d.open).reason == "refused"
    finally:
        plc.start()
    d.open()
    assert d.read([p]) == [123_456_789]  # the PLC kept its memory


def test_close_ends_the_deadline_thread(
    plc: ModbusPlc, drivers: Callable[..., ModbusDriver]
) -> None:
    d = drivers(plc.port)
    d.open()
    assert any(t.name == "line-press1-deadline" for t in threading.enumerate())
    d.close()
    assert wait_until(
        lambda: not any(t.name == "line-press1-deadline" for t in threading.enumerate())
    )
    assert reason_of(lambda: d.read([pt("hr:0", "int16")])).reason == "disconnected"


def test_adjacent_holding_registers_go_in_one_request_and_the_last_point_alone() -> None:
    from agent.line.drivers.modbus import _address, _write_runs, parse_point

    points = [
        parse_point("hr:20", "int16"),
        parse_point("hr:21", "uint16"),
        parse_point("hr:22", "uint32"),
        parse_point("hr:30", "uint16"),
        parse_point("coil:0", "bool"),
        parse_point("hr:31", "uint16"),
    ]
    encoded = [(p, _address(p), [i] * _address(p).count) for i, p in enumerate(points)]
    runs = [(names, a.area, a.start, a.count) for names, a, _ in _write_runs(encoded)]
    assert runs == [
        ("hr:20, hr:21, hr:22", "hr", 20, 4),
        ("hr:30", "hr", 30, 1),
        ("coil:0", "coil", 0, 1),
        ("hr:31", "hr", 31, 1),  # the last point (result valid) alone, though adjacent
    ]
    flag = parse_point("hr:24", "uint16")  # adjacent to hr:22's two registers
    runs_flag = _write_runs([*encoded[:3], (flag, _address(flag), [1])])
    assert [n for n, _, _ in runs_flag] == ["hr:20, hr:21, hr:22", "hr:24"]
