"""The agent's Modbus TCP server against an independent master: Debian's mbpoll (libmodbus)
reads the result registers, writes the trigger coils, and is refused every other write."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.line.results import StationResult
from agent.line.servers.config import ModbusServerConfig
from agent.line.servers.modbus import ModbusResultServer
from hil.loopback import free_port

STATIONS = ["s1", "s2", "s3"]
BASE, BLOCK = 100, 50
MBPOLL_TIMEOUT_S = 10.0

if shutil.which("mbpoll") is None:  # a missing sysdep is a failure, never a skip
    raise RuntimeError("mbpoll is not installed: run `make sysdeps`")


@dataclass
class Mb:
    """mbpoll against one server: one request per call, 0-based addresses."""

    port: int
    unit: int = 1

    def run(self, *args: str, unit: int | None = None) -> subprocess.CompletedProcess[str]:
        cmd = ["mbpoll", "-m", "tcp", "-p", str(self.port), "-a", str(unit or self.unit)]
        return subprocess.run(
            [*cmd, "-0", "-1", "-o", "2", *args],
            capture_output=True,
            text=True,
            timeout=MBPOLL_TIMEOUT_S,
            check=False,
        )

    def read(self, table: str, ref: int, count: int = 1, unit: int | None = None) -> list[int]:
        done = self.run("-t", table, "-r", str(ref), "-c", str(count), "127.0.0.1", unit=unit)
        assert done.returncode == 0, done.stdout + done.stderr
        values = [int(v) for v in re.findall(r"^\[\d+\]:\s+(-?\d+)", done.stdout, re.M)]
        assert len(values) == count, done.stdout
        return values

    def write(self, table: str, ref: int, *values: int) -> subprocess.CompletedProcess[str]:
        return self.run("-t", table, "-r", str(ref), "127.0.0.1", "--", *map(str, values))


@dataclass
class Triggers:
    """The stations' side of on_trigger: records each call, answers ``accept``."""

    calls: list[str] = field(default_factory=list)
    accept: Callable[[str], bool] = lambda _name: True
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, station: str) -> bool:
        with self.lock:
            self.calls.append(station)
        return self.accept(station)


@pytest.fixture
def triggers() -> Triggers:
    return Triggers()


@pytest.fixture
def server(triggers: Triggers) -> Iterator[ModbusResultServer]:
    cfg = ModbusServerConfig(
        enabled=True, port=free_port(), station_base=BASE, block_size=BLOCK, unit_id=1
    )
    srv = ModbusResultServer(cfg, STATIONS, triggers)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def mb(server: ModbusResultServer) -> Mb:
    return Mb(server.config.port)


def result(station: str, seq: int, **kw: Any) -> StationResult:
    fields: dict[str, Any] = {
        "station": station,
        "seq": seq,
        "trigger_seq": seq,
        "status": "ok",
        "outcome": "reject",
        "outcome_code": 2,
        "score": 0.9876,
        "label": "scratch",
        "part_id": "PART-0001",
        "decision_id": "0f8e6d2c-1111-4a2b-9c3d-5e6f7a8b9c0d",
        "model_name": "m",
        "model_version": "1",
        "trigger_to_result_ms": 12.5,
        "wall_time": time.time(),
    }
    fields.update(kw)
    return StationResult(**fields)


def text(registers: list[int]) -> str:
    raw = b"".join(r.to_bytes(2, "big") for r in registers)
    return raw.rstrip(b"\0").decode("utf-8")


def test_mbpoll_reads_the_header_and_a_result_after_on_result(
    server: ModbusResultServer, mb: Mb
) -> None:
    assert mb.read("4", 1, 4) == [1, 3, BASE, BLOCK]
    assert mb.read("4", BASE + BLOCK, 40) == [0] * 40  # nothing yet
    server.on_result(result("s2", 70000, status="deadline_missed", outcome_code=9))
    block = mb.read("4", BASE + BLOCK, 40)
    assert block[0:2] == [70000 >> 16, 70000 & 0xFFFF]
    assert block[2:6] == [2, 9, 988, 1]  # status, outcome code, score x 1000, valid
    assert text(block[6:22]) == "PART-0001"
    assert text(block[22:40]) == "0f8e6d2c-1111-4a2b-9c3d-5e6f7a8b9c0d"
    # libmodbus's own 32-bit reading, high word first, agrees on the sequence number
    done = mb.run("-t", "4:int", "-B", "-r", str(BASE + BLOCK), "127.0.0.1")
    assert done.returncode == 0, done.stderr
    assert re.search(r"^\[\d+\]:\s+70000$", done.stdout, re.M), done.stdout
    assert mb.read("4", BASE, 6) == [0] * 6  # the other stations are untouched
    assert mb.read("4", BASE + 2 * BLOCK, 6) == [0] * 6
    assert server.stats()["results"] == 1


def test_a_long_part_id_is_cut_at_a_character_and_counted(
    server: ModbusResultServer, mb: Mb
) -> None:
    part = "Ä" * 20  # 40 bytes of UTF-8: 16 characters fit in 32 bytes
    server.on_result(result("s1", 1, part_id=part, score=float("nan")))
    block = mb.read("4", BASE, 22)
    assert text(block[6:22]) == "Ä" * 16
    assert block[4] == 0  # a score that is no number reads 0
    assert server.stats()["texts_cut"] == 1


def test_a_trigger_coil_fires_the_callback_once_and_reads_0_again(
    server: ModbusResultServer, mb: Mb, triggers: Triggers
) -> None:
    server.on_result(result("s2", 1))
    assert mb.read("4", BASE + BLOCK + 5) == [1]
    done = mb.write("0", 2, 1)  # station s2's trigger coil
    assert done.returncode == 0, done.stdout + done.stderr
    assert triggers.calls == ["s2"]
    assert mb.read("0", 0, 6) == [0, 0, 0, 0, 0, 0]  # the trigger was taken
    assert mb.read("4", BASE + BLOCK + 5) == [0]  # result valid falls until the result
    server.on_result(result("s2", 2))
    assert mb.read("4", BASE + BLOCK, 6) == [0, 2, 1, 2, 988, 1]
    done = mb.write("0", 4, 0)  # writing 0 does nothing
    assert done.returncode == 0, done.stderr
    assert triggers.calls == ["s2"]
    assert server.stats()["triggers"] == 1


def test_a_trigger_the_station_refuses_is_answered_busy(
    server: ModbusResultServer, mb: Mb, triggers: Triggers
) -> None:
    triggers.accept = lambda name: name != "s3"
    server.on_result(result("s3", 5))
    done = mb.write("0", 4, 1)
    assert done.returncode != 0
    assert "busy" in (done.stdout + done.stderr).lower()
    assert triggers.calls == ["s3"]
    assert mb.read("4", BASE + 2 * BLOCK + 5) == [1]  # the last result still stands
    assert server.stats()["triggers_refused"] == 1


def test_a_failing_trigger_callback_is_counted_and_the_server_goes_on(
    server: ModbusResultServer, mb: Mb, triggers: Triggers
) -> None:
    def boom(_name: str) -> bool:
        raise RuntimeError("station gone")

    triggers.accept = boom
    assert mb.write("0", 0, 1).returncode != 0
    assert server.stats()["callback_errors"] == 1
    triggers.accept = lambda _name: True
    assert mb.write("0", 0, 1).returncode == 0
    assert triggers.calls == ["s1", "s1"]


@pytest.mark.parametrize(
    ("table", "ref", "values"),
    [
        ("4", BASE + 5, [1]),  # a result register (function 06)
        ("4", BASE, [1, 2]),  # function 16
        ("4", 0, [7]),  # the heartbeat
        ("0", 1, [1]),  # station s1's busy coil
        ("0", 0, [1, 1]),  # a trigger and a busy coil at once (function 15)
        ("0", 6, [1]),  # beyond the stations' coils
        ("4", 65000, [1]),  # beyond the map
    ],
)
def test_every_other_write_is_refused_and_counted(
    server: ModbusResultServer, mb: Mb, triggers: Triggers, table: str, ref: int, values: list[int]
) -> None:
    server.on_result(result("s1", 3))
    before = mb.read("4", BASE, 6)
    done = mb.write(table, ref, *values)
    assert done.returncode != 0, done.stdout
    assert "illegal data address" in (done.stdout + done.stderr).lower()
    assert mb.read("4", BASE, 6) == before
    assert triggers.calls == []
    assert server.stats()["writes_refused"] == 1


def test_the_busy_coil_follows_set_busy(server: ModbusResultServer, mb: Mb) -> None:
    server.set_busy("s3", True)
    server.set_busy("nobody", True)  # ignored
    assert mb.read("0", 0, 6) == [0, 0, 0, 0, 0, 1]
    server.set_busy("s3", False)
    server.set_busy("s1", True)
    assert mb.read("0", 0, 6) == [0, 1, 0, 0, 0, 0]


def test_the_heartbeat_advances(mb: Mb) -> None:
    first = mb.read("4", 0)[0]
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        time.sleep(0.3)
        if mb.read("4", 0)[0] != first:
            break
    else:
        pytest.fail("the heartbeat did not advance in 5 s")


def test_another_unit_id_is_answered_gateway_no_response(
    server: ModbusResultServer, mb: Mb, triggers: Triggers
) -> None:
    done = mb.run("-t", "4", "-r", "0", "127.0.0.1", unit=7)
    assert done.returncode != 0
    assert "failed to respond" in (done.stdout + done.stderr).lower()
    done = mb.run("-t", "0", "-r", "0", "127.0.0.1", "1", unit=7)
    assert done.returncode != 0
    assert triggers.calls == []
    assert mb.read("4", 1) == [1]  # its own unit id still answered


def test_unit_id_0_answers_every_unit_id(triggers: Triggers) -> None:
    cfg = ModbusServerConfig(enabled=True, port=free_port(), unit_id=0)
    srv = ModbusResultServer(cfg, ["s1"], triggers)
    srv.start()
    try:
        mb = Mb(cfg.port)
        assert mb.read("4", 2, unit=7) == [1]
        assert mb.write("0", 0, 1).returncode == 0
        assert triggers.calls == ["s1"]
    finally:
        srv.stop()


def test_a_result_for_an_unknown_station_is_counted(server: ModbusResultServer) -> None:
    server.on_result(result("elsewhere", 1))
    assert server.stats()["results_unknown_station"] == 1


def test_a_map_that_does_not_fit_or_a_name_twice_is_refused() -> None:
    cfg = ModbusServerConfig(station_base=60_000, block_size=1000)
    with pytest.raises(ValueError, match="beyond"):
        ModbusResultServer(cfg, [f"s{i}" for i in range(6)], lambda _n: True)
    with pytest.raises(ValueError, match="twice"):
        ModbusResultServer(ModbusServerConfig(), ["a", "a"], lambda _n: True)
    with pytest.raises(ValueError, match="at least one"):
        ModbusResultServer(ModbusServerConfig(), [], lambda _n: True)


def test_a_port_in_use_fails_start_and_stop_is_safe() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        cfg = ModbusServerConfig(enabled=True, port=taken.getsockname()[1])
        srv = ModbusResultServer(cfg, ["s1"], lambda _n: True)
        with pytest.raises(OSError, match=r"listen|in use"):
            srv.start()
        srv.stop()


def test_the_defaults_are_loopback_on_5020() -> None:
    cfg = ModbusServerConfig()
    assert (cfg.enabled, cfg.host, cfg.port) == (False, "127.0.0.1", 5020)
    with pytest.raises(ValueError, match="block_size"):
        ModbusServerConfig(block_size=39)
    with pytest.raises(ValueError, match="extra"):
        ModbusServerConfig(registers=3)  # type: ignore[call-arg]
