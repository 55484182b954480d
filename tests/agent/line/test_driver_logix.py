"""The Logix driver (pylogix) against cpppo's EtherNet/IP Logix simulator, an independent
CIP stack, on a loopback port: every type both ways, Logix STRINGs as the controller's
structure, and a reason word for each failure (a missing tag, a wrong type, nothing
listening, a stalled and a killed controller)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.line.drivers import driver_class
from agent.line.drivers.base import Point
from agent.line.drivers.configs import LogixLinkConfig
from agent.line.drivers.logix import LogixDriver, parse_point
from agent.line.errors import LineError
from agent.line.points import parse_point as parse_any
from hil.loopback import free_port
from hil.plc.logix_plc import LogixPlc

TIMEOUT_MS = 500.0
MARGIN_S = 2.0  # a loaded 2-core machine; the point is "bounded", not "fast"

TAGS = [
    "Trigger=BOOL",
    "Flags=BOOL[8]",
    "Count=INT",
    "Ucount=UINT",
    "PartNo=DINT",
    "Serial=UDINT",
    "Big=LINT",
    "Score=REAL",
    "Precise=LREAL",
    "PartId=LOGIX_STRING",
    "Note=LOGIX_STRING",
    "Small=SINT",
    "Results=DINT[5]",
    "Program:Inspect.Result=DINT",
    "Station.Code=INT",
]


def config(port: int, **kw: Any) -> LogixLinkConfig:
    return LogixLinkConfig(
        name="cell1", driver="logix", host="127.0.0.1", port=port, timeout_ms=TIMEOUT_MS, **kw
    )


@pytest.fixture(scope="module")
def plc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LogixPlc]:
    sim = LogixPlc(TAGS, tmp_path_factory.mktemp("logix"))
    sim.start()
    yield sim
    sim.stop()


@pytest.fixture
def driver(plc: LogixPlc) -> Iterator[LogixDriver]:
    drv = LogixDriver(config(plc.port))
    drv.open()
    yield drv
    drv.close()


def pt(address: str, vtype: Any) -> Point:
    return parse_point(address, vtype)


def test_every_type_round_trips_through_the_simulator(driver: LogixDriver) -> None:
    cases: list[tuple[str, Any, Any]] = [
        ("Trigger", "bool", True),
        ("Flags[3]", "bool", True),
        ("Count", "int16", -32768),
        ("Ucount", "uint16", 65535),
        ("PartNo", "int32", -(2**31)),
        ("Serial", "uint32", 2**32 - 1),
        ("Big", "int64", -(2**63)),
        ("Score", "float32", 0.875),
        ("Precise", "float64", math.pi),
        ("PartId", "string", "AB-1234/ÿ"),  # Latin-1 beyond ASCII survives
        ("Results[4]", "int32", 123456),
        ("Program:Inspect.Result", "int32", 7),
        ("Station.Code", "int16", 42),
    ]
    points = [pt(a, t) for a, t, _ in cases]
    driver.write([(p, v) for p, (_, _, v) in zip(points, cases, strict=True)])
    assert driver.read(points) == [v for _, _, v in cases]

    # and back to other values, read one at a time (the single-request path)
    later = [False, False, 1, 2, 3, 4, 5, -1.5, -2.25, "", 9, 8, -42]
    driver.write([(p, v) for p, v in zip(points, later, strict=True)])
    for p, v in zip(points, later, strict=True):
        assert driver.read([p]) == [v]
    assert driver.read([pt("Flags[2]", "bool")]) == [False]


def test_a_string_of_82_characters_fits_and_83_is_refused(driver: LogixDriver) -> None:
    note = pt("Note", "string")
    driver.write([(note, "x" * 82)])
    assert driver.read([note]) == ["x" * 82]
    with pytest.raises(LineError) as err:
        driver.write([(note, "y" * 83)])
    assert err.value.reason == "type_mismatch"
    assert "82" in err.value.detail
    with pytest.raises(LineError) as err:
        driver.write([(note, "5 €")])
    assert err.value.reason == "type_mismatch"
    assert "Latin-1" in err.value.detail
    assert driver.read([note]) == ["x" * 82]  # nothing was written


def test_a_missing_tag_is_bad_node_and_writes_nothing(driver: LogixDriver) -> None:
    count = pt("Count", "int16")
    driver.write([(count, 11)])
    with pytest.raises(LineError) as err:
        driver.read([count, pt("NoSuchTag", "int16")])
    assert err.value.reason == "bad_node"
    assert "NoSuchTag" in err.value.detail
    with pytest.raises(LineError) as err:
        driver.write([(count, 12), (pt("Program:Inspect.Missing", "bool"), True)])
    assert err.value.reason == "bad_node"
    assert driver.read([count]) == [11]  # the tag before the missing one was not written


def test_a_tag_of_another_type_is_type_mismatch_both_ways(driver: LogixDriver) -> None:
    with pytest.raises(LineError) as err:
        driver.read([pt("PartNo", "int16")])
    assert err.value.reason == "type_mismatch"
    assert "PartNo is DINT" in err.value.detail
    with pytest.raises(LineError) as err:
        driver.read([pt("Small", "int16")])  # SINT is not INT, even where it would fit
    assert err.value.reason == "type_mismatch"
    with pytest.raises(LineError) as err:
        driver.read([pt("Count", "string")])
    assert err.value.reason == "type_mismatch"
    count = pt("Count", "int16")
    driver.write([(count, 5)])
    with pytest.raises(LineError) as err:
        driver.write([(count, 6), (pt("Score", "int32"), 1)])
    assert err.value.reason == "type_mismatch"
    assert driver.read([count]) == [5]
    with pytest.raises(LineError) as err:
        driver.write([(pt("Count", "int16"), 40000)])
    assert err.value.reason == "type_mismatch"


def test_nothing_listening_is_refused() -> None:
    drv = LogixDriver(config(free_port()))
    start = time.monotonic()
    with pytest.raises(LineError) as err:
        drv.open()
    assert err.value.reason == "refused"
    assert time.monotonic() - start < TIMEOUT_MS / 1000 + MARGIN_S
    with pytest.raises(LineError) as err:
        drv.read([pt("Count", "int16")])
    assert err.value.reason == "disconnected"


def test_a_stalled_controller_is_a_timeout_within_the_timeout(tmp_path: Path) -> None:
    with LogixPlc(["Count=INT", "Score=REAL"], tmp_path) as sim:
        drv = LogixDriver(config(sim.port))
        drv.open()
        try:
            points = [pt("Count", "int16"), pt("Score", "float32")]
            assert drv.read(points) == [0, 0.0]
            sim.pause()
            for op in (lambda: drv.read(points), lambda: drv.write([(points[0], 1)])):
                start = time.monotonic()
                with pytest.raises(LineError) as err:
                    op()
                elapsed = time.monotonic() - start
                assert err.value.reason == "timeout", err.value
                assert elapsed < TIMEOUT_MS / 1000 + MARGIN_S, elapsed
            # a connect to a stalled controller: TCP is accepted, the session never is
            drv.close()
            start = time.monotonic()
            with pytest.raises(LineError) as err:
                drv.open()
            assert err.value.reason == "timeout", err.value
            assert time.monotonic() - start < TIMEOUT_MS / 1000 + MARGIN_S
            sim.resume()
            drv.open()
            assert drv.read(points) == [0, 0.0]
        finally:
            drv.close()


def test_a_killed_controller_is_refused_and_reopens_when_back(tmp_path: Path) -> None:
    sim = LogixPlc(["Count=INT"], tmp_path)
    sim.start()
    drv = LogixDriver(config(sim.port))
    try:
        drv.open()
        count = pt("Count", "int16")
        drv.write([(count, 3)])
        sim.stop()
        start = time.monotonic()
        with pytest.raises(LineError) as err:
            drv.read([count])
        assert err.value.reason == "refused", err.value
        assert time.monotonic() - start < TIMEOUT_MS / 1000 + MARGIN_S
        with pytest.raises(LineError) as err:
            drv.open()
        assert err.value.reason == "refused"
        sim.start()  # a restarted controller: its tags are back at their defaults
        drv.open()
        assert drv.read([count]) == [0]
    finally:
        drv.close()
        sim.stop()


def test_a_micro800_is_read_and_written_one_tag_a_request(tmp_path: Path) -> None:
    # no Multiple Service Packet, no backplane route; strings are SHORT_STRINGs
    with LogixPlc(["Count=INT", "Score=REAL", "PartId=SSTRING"], tmp_path, simple=True) as sim:
        drv = LogixDriver(config(sim.port, micro800=True))
        drv.open()
        try:
            points = [pt("Count", "int16"), pt("Score", "float32"), pt("PartId", "string")]
            drv.write([(points[0], -7), (points[1], 2.5), (points[2], "P-9")])
            assert drv.read(points) == [-7, 2.5, "P-9"]
            with pytest.raises(LineError) as err:
                drv.read([pt("Missing", "int16")])
            assert err.value.reason == "bad_node"
        finally:
            drv.close()


def test_the_registry_and_check_config_know_the_driver() -> None:
    assert driver_class("logix") is LogixDriver
    point = parse_any("logix", "Program:Main.Part_Id[2]", "string")
    assert point.address == "Program:Main.Part_Id[2]"
    assert point.parsed.base == "Program:Main.Part_Id"


@pytest.mark.parametrize(
    "address",
    [
        "Tag",
        "_tag1",
        "Program:MainProgram.Tag",
        "Tag[3]",
        "Grid[1,2,3]",
        "Station1.Result.Code",
        "Udt[2].Member[0].Leaf",
        "A" * 40,
    ],
)
def test_logix_tag_names_are_accepted(address: str) -> None:
    assert parse_point(address, "int32").address == address


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("", "empty"),
        ("1Tag", "is not a name"),
        ("Tag-1", "is not a name"),
        ("Tag[]", "is not a name"),
        ("Tag[1,2,3,4]", "is not a name"),
        ("Tag[-1]", "is not a name"),
        ("Tag[99999999999]", "is not a name"),
        ("Tag[3000000000]", "too large"),
        ("Flags.3", "bit of an integer"),
        ("Tag..Member", "is not a name"),
        ("Tag.", "is not a name"),
        ("Program:.Tag", "scope"),
        ("Controller:Tag", "scope"),
        ("Tag with space", "ASCII"),
        ("Tägé", "ASCII"),
        ("Tag\n", "ASCII"),
        ("A" * 41, "is not a name"),
        ("A." * 9 + "B", "parts"),
        ("A" * 201, "over 200"),
    ],
)
def test_bad_tag_names_are_refused_clearly(address: str, words: str) -> None:
    with pytest.raises(ValueError, match=r"Logix tag name|empty|over 200") as err:
        parse_point(address, "int32")
    assert words in str(err.value)


def test_an_unknown_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown type"):
        parse_point("Tag", "int8")  # type: ignore[arg-type]
