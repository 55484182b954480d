"""The S7 driver (python-snap7's client) against python-snap7's S7 server in a subprocess
on a loopback port: every type both ways with the bytes S7 keeps (checked in the server's
memory), bit writes that leave the byte's other bits alone, STRING headers, and a reason
word for each failure (a missing DB, beyond a DB's end, nothing listening, a stalled and
a killed CPU)."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import snap7

from agent.line.drivers import driver_class
from agent.line.drivers.base import Point
from agent.line.drivers.configs import S7LinkConfig
from agent.line.drivers.s7 import S7Driver, parse_point
from agent.line.errors import LineError
from agent.line.points import parse_point as parse_any
from hil.loopback import free_port
from hil.plc.s7_plc import S7Plc

TIMEOUT_MS = 500.0
MARGIN_S = 2.0  # a loaded 2-core machine; the point is "bounded", not "fast"


def config(port: int, **kw: Any) -> S7LinkConfig:
    return S7LinkConfig(
        name="cell2", driver="s7", host="127.0.0.1", port=port, timeout_ms=TIMEOUT_MS, **kw
    )


@pytest.fixture(scope="module")
def plc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S7Plc]:
    sim = S7Plc({1: 64, 2: 300}, tmp_path_factory.mktemp("s7"))
    sim.start()
    yield sim
    sim.stop()


@pytest.fixture
def memory(plc: S7Plc) -> Iterator[snap7.client.Client]:
    """A second client standing in for the PLC program: it sets and inspects the bytes."""
    client = snap7.client.Client()
    client.connect("127.0.0.1", 0, 1, plc.port)
    yield client
    client.disconnect()


@pytest.fixture
def driver(plc: S7Plc) -> Iterator[S7Driver]:
    drv = S7Driver(config(plc.port))
    drv.open()
    yield drv
    drv.close()


def pt(address: str, vtype: Any) -> Point:
    return parse_point(address, vtype)


def test_every_type_round_trips_with_s7_byte_layout(
    driver: S7Driver, memory: snap7.client.Client
) -> None:
    memory.db_write(1, 0, bytearray(64))
    memory.db_write(1, 30, bytearray([20, 0]))  # the program's STRING[20] header
    cases: list[tuple[str, Any, Any, int, bytes]] = [
        ("DB1.DBX0.3", "bool", True, 0, bytes([0b1000])),
        ("DB1.DBB1", "uint16", 200, 1, bytes([200])),
        ("DB1.DBW2", "int16", -2, 2, b"\xff\xfe"),
        ("DB1.DBW4", "uint16", 65535, 4, b"\xff\xff"),
        ("DB1.DBD6", "int32", -(2**31), 6, b"\x80\x00\x00\x00"),
        ("DB1.DBD10", "uint32", 2**32 - 1, 10, b"\xff\xff\xff\xff"),
        ("DB1.DBD14", "float32", 1.5, 14, b"\x3f\xc0\x00\x00"),
        ("db1.dbs30.20", "string", "AB-12/ÿ", 30, bytes([20, 7]) + "AB-12/ÿ".encode("latin-1")),
    ]
    points = [pt(a, t) for a, t, *_ in cases]
    driver.write([(p, c[2]) for p, c in zip(points, cases, strict=True)])
    for _, _, _, offset, expected in cases:
        assert bytes(memory.db_read(1, offset, len(expected))) == expected
    assert driver.read(points) == [c[2] for c in cases]

    # the PLC changes them; each read alone (the one-point path) sees the PLC's values
    memory.db_write(1, 0, bytearray([0b0111]))
    memory.db_write(1, 2, bytearray(struct.pack(">hH", 300, 7)))
    memory.db_write(1, 14, bytearray(struct.pack(">f", -0.25)))
    memory.db_write(1, 31, bytearray([2]) + b"ok")
    assert driver.read([pt("DB1.DBX0.3", "bool")]) == [False]
    assert driver.read([pt("DB1.DBX0.2", "bool")]) == [True]
    assert driver.read([pt("DB1.DBW2", "int16")]) == [300]
    assert driver.read([pt("DB1.DBW4", "uint16")]) == [7]
    assert driver.read([pt("DB1.DBD14", "float32")]) == [-0.25]
    assert driver.read([pt("DB1.DBS30.20", "string")]) == ["ok"]


def test_a_bit_write_leaves_the_other_bits_of_its_byte(
    driver: S7Driver, memory: snap7.client.Client
) -> None:
    memory.db_write(1, 40, bytearray([0b1010_0101]))
    driver.write([(pt("DB1.DBX40.1", "bool"), True), (pt("DB1.DBX40.0", "bool"), False)])
    assert memory.db_read(1, 40, 1)[0] == 0b1010_0110
    driver.write([(pt("DB1.DBX40.7", "bool"), False)])
    assert memory.db_read(1, 40, 1)[0] == 0b0010_0110


def test_points_of_several_dbs_and_far_apart_read_in_order(
    driver: S7Driver, memory: snap7.client.Client
) -> None:
    memory.db_write(2, 0, bytearray(struct.pack(">i", 11)))
    memory.db_write(2, 290, bytearray(struct.pack(">i", 22)))
    memory.db_write(1, 44, bytearray(struct.pack(">i", 33)))
    points = [pt("DB2.DBD290", "int32"), pt("DB1.DBD44", "int32"), pt("DB2.DBD0", "int32")]
    assert driver.read(points) == [22, 33, 11]


def test_strings_are_checked_against_the_declared_length(
    driver: S7Driver, memory: snap7.client.Client
) -> None:
    memory.db_write(1, 50, bytearray([10, 2]) + b"hi" + bytearray(8))  # a STRING[10]
    with pytest.raises(LineError) as err:
        driver.read([pt("DB1.DBS50.12", "string")])
    assert err.value.reason == "type_mismatch"
    assert "declared [10]" in err.value.detail
    with pytest.raises(LineError) as err:
        driver.write([(pt("DB1.DBS50.12", "string"), "x")])
    assert err.value.reason == "type_mismatch"
    with pytest.raises(LineError) as err:
        driver.write([(pt("DB1.DBS50.10", "string"), "y" * 11)])
    assert err.value.reason == "type_mismatch"
    with pytest.raises(LineError) as err:
        driver.write([(pt("DB1.DBS50.10", "string"), "5 €")])
    assert err.value.reason == "type_mismatch"
    assert bytes(memory.db_read(1, 50, 4)) == bytes([10, 2]) + b"hi"  # nothing was written
    driver.write([(pt("DB1.DBS50.10", "string"), "z" * 10)])
    assert driver.read([pt("DB1.DBS50.10", "string")]) == ["z" * 10]
    memory.db_write(1, 51, bytearray([11]))  # a length over the declared one
    with pytest.raises(LineError) as err:
        driver.read([pt("DB1.DBS50.10", "string")])
    assert err.value.reason == "protocol"


def test_values_that_do_not_fit_are_type_mismatch(driver: S7Driver) -> None:
    for point, value in [
        (pt("DB1.DBB1", "uint16"), 256),
        (pt("DB1.DBW2", "int16"), 40000),
        (pt("DB1.DBD6", "uint32"), -1),
        (pt("DB1.DBD14", "float32"), float("inf")),
    ]:
        with pytest.raises(LineError) as err:
            driver.write([(point, value)])
        assert err.value.reason == "type_mismatch", point


def test_a_missing_db_or_an_address_past_its_end_is_bad_node(
    driver: S7Driver, memory: snap7.client.Client
) -> None:
    cases = [
        [pt("DB9.DBW0", "int16")],
        [pt("DB1.DBD62", "int32")],
        [pt("DB1.DBW0", "int16"), pt("DB1.DBW70", "int16")],  # one span, then one by one
    ]
    for points in cases:
        with pytest.raises(LineError) as err:
            driver.read(points)
        assert err.value.reason == "bad_node", points
        assert points[-1].address in err.value.detail
    memory.db_write(1, 0, bytearray([0]))
    for point, value in [
        (pt("DB9.DBW0", "int16"), 1),
        (pt("DB1.DBW64", "int16"), 1),
        (pt("DB1.DBX64.0", "bool"), True),
        (pt("DB9.DBS0.4", "string"), "a"),
    ]:
        with pytest.raises(LineError) as err:
            driver.write([(point, value)])
        assert err.value.reason == "bad_node", point
    # the connection is still good after the PLC said no
    assert driver.read([pt("DB1.DBB0", "uint16")]) == [0]


def test_nothing_listening_is_refused() -> None:
    drv = S7Driver(config(free_port()))
    start = time.monotonic()
    with pytest.raises(LineError) as err:
        drv.open()
    assert err.value.reason == "refused"
    assert time.monotonic() - start < TIMEOUT_MS / 1000 + MARGIN_S
    with pytest.raises(LineError) as err:
        drv.read([pt("DB1.DBW0", "int16")])
    assert err.value.reason == "disconnected"


def test_a_stalled_cpu_is_a_timeout_within_the_timeout(tmp_path: Path) -> None:
    with S7Plc({1: 16}, tmp_path) as sim:
        drv = S7Driver(config(sim.port))
        drv.open()
        try:
            points = [pt("DB1.DBW0", "int16"), pt("DB1.DBD2", "float32")]
            assert drv.read(points) == [0, 0.0]
            for op in (lambda: drv.read(points), lambda: drv.write([(points[0], 1)])):
                sim.pause()
                start = time.monotonic()
                with pytest.raises(LineError) as err:
                    op()
                elapsed = time.monotonic() - start
                assert err.value.reason == "timeout", err.value
                assert elapsed < TIMEOUT_MS / 1000 + MARGIN_S, elapsed
                # the connection is given up after a timeout (the link reopens it)
                with pytest.raises(LineError) as err:
                    op()
                assert err.value.reason == "disconnected"
                sim.resume()
                drv.open()
            sim.pause()
            # a connect to a stalled CPU: TCP is accepted, the ISO handshake never is
            drv.close()
            start = time.monotonic()
            with pytest.raises(LineError) as err:
                drv.open()
            assert err.value.reason == "timeout", err.value
            assert time.monotonic() - start < TIMEOUT_MS / 1000 + MARGIN_S
            sim.resume()
            drv.open()
            # the write that timed out may have landed once the CPU went on: 0 or 1
            assert drv.read(points) in ([0, 0.0], [1, 0.0])
        finally:
            drv.close()


def test_a_killed_cpu_is_refused_and_reopens_when_back(tmp_path: Path) -> None:
    sim = S7Plc({1: 16}, tmp_path)
    sim.start()
    drv = S7Driver(config(sim.port))
    try:
        drv.open()
        word = pt("DB1.DBW0", "int16")
        drv.write([(word, 3)])
        sim.stop()
        start = time.monotonic()
        with pytest.raises(LineError) as err:
            drv.read([word])
        assert err.value.reason == "refused", err.value
        assert time.monotonic() - start < TIMEOUT_MS / 1000 + MARGIN_S
        with pytest.raises(LineError) as err:
            drv.open()
        assert err.value.reason == "refused"
        sim.start()  # a restarted CPU: its DB is back at zero
        drv.open()
        assert drv.read([word]) == [0]
    finally:
        drv.close()
        sim.stop()


def test_the_registry_and_check_config_know_the_driver() -> None:
    assert driver_class("s7") is S7Driver
    point = parse_any("s7", "DB100.DBX2047.7", "bool")
    assert (point.parsed.db, point.parsed.byte, point.parsed.bit) == (100, 2047, 7)


@pytest.mark.parametrize(
    ("address", "vtype"),
    [
        ("DB1.DBX0.0", "bool"),
        ("DB65535.DBX0.7", "bool"),
        ("DB1.DBB0", "uint16"),
        ("DB1.DBW0", "int16"),
        ("DB1.DBW0", "uint16"),
        ("DB1.DBD0", "int32"),
        ("DB1.DBD0", "uint32"),
        ("DB1.DBD0", "float32"),
        ("DB1.DBS0.1", "string"),
        ("DB1.DBS0.254", "string"),
        ("db7.dbw10", "int16"),
        ("DB1.DBD2097148", "float32"),
    ],
)
def test_s7_addresses_are_accepted(address: str, vtype: Any) -> None:
    assert parse_point(address, vtype).address == address


@pytest.mark.parametrize(
    ("address", "vtype", "words"),
    [
        ("", "bool", "empty"),
        ("DB0.DBX0.0", "bool", "outside 1..65535"),
        ("DB65536.DBX0.0", "bool", "outside 1..65535"),
        ("DB1.DBX0.8", "bool", "DBX<byte>.<0..7>"),
        ("DB1.DBX0", "bool", "DBX<byte>.<0..7>"),
        ("DB1.DBW0.1", "int16", "takes no .1"),
        ("DB1.DBS0", "string", "DBS<byte>.<1..254>"),
        ("DB1.DBS0.0", "string", "DBS<byte>.<1..254>"),
        ("DB1.DBS0.255", "string", "DBS<byte>.<1..254>"),
        ("DB1.DBD2097149", "int32", "beyond"),
        ("DB1.DBW0", "int32", "a word: it holds int16 or uint16, not int32"),
        ("DB1.DBB0", "int16", "a byte"),
        ("DB1.DBX0.0", "int16", "a bit"),
        ("DB1.DBD0", "float64", "not float64"),
        ("DB1.DBD0", "int64", "not int64"),
        ("DB1.DBW0", "string", "not string"),
        ("MW10", "int16", "is not DB<n>"),
        ("DB1.DBL0", "int64", "is not DB<n>"),
        ("DB1.DBW-2", "int16", "is not DB<n>"),
        ("DB1 .DBW2", "int16", "is not DB<n>"),
        ("DB1.DBW2\n", "int16", "is not DB<n>"),
        ("DB\uff11.DBW2", "int16", "is not DB"),  # a full-width digit one
        ("DB1.DBW" + "9" * 40, "int16", "is not DB"),
    ],
)
def test_bad_s7_addresses_are_refused_clearly(address: str, vtype: Any, words: str) -> None:
    with pytest.raises(ValueError, match=r"S7 address|empty|unknown type") as err:
        parse_point(address, vtype)
    assert words in str(err.value)
