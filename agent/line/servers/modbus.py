"""The agent as a Modbus TCP server, for PLCs that poll: each station's last result in
holding registers, a trigger coil per station, a heartbeat.

The register map is fixed (``[modbus_server]`` sets only where the station blocks
start and how far apart they are). Addresses are 0-based protocol addresses (register
0 is "40001" in the 1-based convention some PLC tools use).

Holding registers, the header (read only):

    ======== ============================================================
    register what
    ======== ============================================================
    0        heartbeat: seconds since the server started, modulo 65536
    1        map version (1)
    2        number of stations
    3        ``station_base``
    4        ``block_size``
    ======== ============================================================

Holding registers of station *i* (the *i*-th station in the configuration, from 0) at
``base = station_base + i * block_size`` (read only):

    ============== ============================================================
    register       what
    ============== ============================================================
    base + 0, 1    result sequence number (uint32, high word first; 0: none yet)
    base + 2       status code (1 ok, 2 deadline missed, 3 overrun, 4 error)
    base + 3       outcome code (the station's ``outcome_codes``)
    base + 4       score x 1000 (uint16, clamped to 0..65535)
    base + 5       result valid: 1 once this result is complete, 0 from the
                   next accepted trigger until its result
    base + 6..21   part id (32 bytes of UTF-8, two per register, high byte
                   first, NUL-padded; a longer one is cut at a character)
    base + 22..39  decision id (36 bytes, as the part id)
    ============== ============================================================

A result is written in one step under a lock, so a read of the block sees either the
whole previous result or the whole new one.

Coils of station *i*:

    ======== ============================================================
    coil     what
    ======== ============================================================
    2i       trigger (write only 1 matters): the PLC writes 1 to start an
             inspection
    2i + 1   busy (read only): the station is deciding
    ======== ============================================================

The trigger handshake: the PLC writes 1 to the station's trigger coil (function 05 or
15). The server answers the write, clears the station's result valid and calls the
station's trigger; from then on the coil reads 0 again (a trigger is an event, the PLC
need not reset it). The station sets busy, decides, and its result lands in the block
with result valid 1 and the next sequence number; busy falls. A trigger the station
refuses (it is halted) is answered with exception 06 (server device busy). Writing 0 to
a trigger coil does nothing.

Clients may write nothing else: a write to any other coil or to a holding register
(functions 05, 06, 15, 16, 22, 23) is answered with exception 02 (illegal data address)
and counted in :meth:`ModbusResultServer.stats`. Only coils and holding registers are
served (discrete inputs and input registers hold a single 0 at address 0).

pymodbus runs on its own asyncio loop in a thread (:class:`AsyncRunner`); the station
thread's :meth:`ModbusResultServer.on_result` and :meth:`set_busy` only update the
register image under a lock and return; the server copies the image into pymodbus's
datastore when a client reads.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.line.drivers.base import AsyncRunner
from agent.line.results import STATUS_CODES, StationResult
from agent.line.servers.config import MODBUS_BLOCK_MIN, ModbusServerConfig

if TYPE_CHECKING:
    from pymodbus.pdu import ModbusPDU
    from pymodbus.server import ModbusTcpServer

log = logging.getLogger(__name__)

MAP_VERSION = 1
HEADER = 5
"""Registers of the header at 0."""
REGISTERS = 1 << 16

# offsets in a station's block
SEQ, STATUS, OUTCOME, SCORE, VALID, PART_ID, DECISION_ID = 0, 2, 3, 4, 5, 6, 22
PART_ID_REGS, DECISION_ID_REGS = 16, 18

_WRITES = frozenset({5, 6, 15, 16, 22, 23})
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0


def text_registers(text: str, registers: int) -> list[int]:
    """``text`` as UTF-8 in ``registers`` registers (two bytes each, high byte first,
    NUL-padded), cut at a character boundary when longer."""
    raw = text.encode("utf-8")[: registers * 2]
    raw = raw.decode("utf-8", errors="ignore").encode("utf-8").ljust(registers * 2, b"\0")
    return [raw[i] << 8 | raw[i + 1] for i in range(0, len(raw), 2)]


class ModbusResultServer:
    """Serves the stations' results over Modbus TCP and takes triggers from coils.

    Args:
        config: ``[modbus_server]``.
        stations: the stations' names, in configuration order (station *i*'s block).
        on_trigger: called with a station's name when a PLC writes 1 to its trigger
            coil, on the server's thread; returns whether the station took the trigger
            (False: halted). It must return at once.

    Raises:
        ValueError: no station, a name twice, or the map does not fit in 65536
            registers.
    """

    def __init__(
        self,
        config: ModbusServerConfig,
        stations: list[str],
        on_trigger: Callable[[str], bool],
    ) -> None:
        if not stations:
            raise ValueError("the Modbus server needs at least one station")
        if len(set(stations)) != len(stations):
            raise ValueError("a station is named twice")
        if config.block_size < MODBUS_BLOCK_MIN or config.station_base < HEADER:
            raise ValueError("the header or a station block overlaps another")
        end = config.station_base + len(stations) * config.block_size
        if end > REGISTERS:
            raise ValueError(
                f"{len(stations)} stations of {config.block_size} registers from "
                f"{config.station_base} end at {end}, beyond Modbus's {REGISTERS}"
            )
        self.config = config
        self.stations = list(stations)
        self._index = {name: i for i, name in enumerate(stations)}
        self._on_trigger = on_trigger
        self._lock = threading.Lock()
        self._registers = [0] * end
        self._registers[1:HEADER] = [MAP_VERSION, len(stations), config.station_base,
                                     config.block_size]  # fmt: skip
        self._busy = [False] * len(stations)
        self._started = time.monotonic()
        self._counts: dict[str, int] = dict.fromkeys(
            (
                "requests",
                "reads",
                "triggers",
                "triggers_refused",
                "writes_refused",
                "exceptions",
                "callback_errors",
                "results",
                "results_unknown_station",
                "texts_cut",
            ),
            0,
        )
        self._runner: AsyncRunner | None = None
        self._server: ModbusTcpServer | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Listen on ``host:port`` (returns once listening).

        Raises:
            OSError: the address can't be bound (in use, not this host's, no privilege).
        """
        if self._runner is not None:
            return
        runner = AsyncRunner("modbus-server")
        try:
            self._server = runner.call(self._serve(), _START_TIMEOUT_S)
        except Exception as exc:
            runner.close()
            if isinstance(exc, OSError):
                raise
            raise OSError(f"Modbus server on {self.config.host}:{self.config.port}: {exc}") from exc
        self._runner = runner
        self._started = time.monotonic()
        log.info("modbus server listening on %s:%d", self.config.host, self.config.port)

    def stop(self) -> None:
        """Close the listener and every connection; never raises."""
        runner, server = self._runner, self._server
        self._runner = self._server = None
        if runner is None:
            return
        if server is not None:
            try:
                runner.call(server.shutdown(), _STOP_TIMEOUT_S)  # type: ignore[no-untyped-call]
            except Exception:
                log.exception("modbus server: shutdown failed")
        runner.close()

    async def _serve(self) -> ModbusTcpServer:
        from pymodbus.server import ModbusTcpServer  # noqa: PLC0415 - only where it serves
        from pymodbus.simulator import DataType, SimData, SimDevice  # noqa: PLC0415

        n = len(self.stations)
        coils = 2 * n
        device = SimDevice(
            id=self.config.unit_id,
            simdata=(
                [SimData(0, count=coils, values=False, datatype=DataType.BITS)],
                [SimData(0, count=1, values=False, datatype=DataType.BITS)],
                [SimData(0, count=len(self._registers), values=0, datatype=DataType.REGISTERS)],
                [SimData(0, count=1, values=0, datatype=DataType.REGISTERS)],
            ),
            action=self._action,
        )
        devices = [device]
        if self.config.unit_id != 0:
            # Requests for other unit ids land here and are answered 0B by _trace (without
            # a device 0, pymodbus answers them with a logged KeyError).
            devices.append(
                SimDevice(
                    id=0,
                    simdata=(
                        [SimData(0, count=16, values=False, datatype=DataType.BITS)],
                        [SimData(0, count=16, values=False, datatype=DataType.BITS)],
                        [SimData(0, count=1, values=0, datatype=DataType.REGISTERS)],
                        [SimData(0, count=1, values=0, datatype=DataType.REGISTERS)],
                    ),
                )
            )
        server = ModbusTcpServer(
            devices,
            address=(self.config.host, self.config.port),
            trace_pdu=self._trace,
        )
        await server.serve_forever(background=True)
        return server

    # -- what the stations tell ---------------------------------------------------------

    def on_result(self, result: StationResult) -> None:
        """Put a station's result into its block (returns at once)."""
        i = self._index.get(result.station)
        if i is None:
            self._count("results_unknown_station")
            return
        score = result.score * 1000.0 if math.isfinite(result.score) else 0.0
        part = text_registers(result.part_id, PART_ID_REGS)
        decision = text_registers(result.decision_id, DECISION_ID_REGS)
        cut = len(result.part_id.encode("utf-8")) > PART_ID_REGS * 2
        cut |= len(result.decision_id.encode("utf-8")) > DECISION_ID_REGS * 2
        seq = result.seq & 0xFFFFFFFF
        block = [
            seq >> 16,
            seq & 0xFFFF,
            STATUS_CODES.get(result.status, 0),
            result.outcome_code & 0xFFFF,
            min(max(round(score), 0), 0xFFFF),
            1,
            *part,
            *decision,
        ]
        base = self.config.station_base + i * self.config.block_size
        with self._lock:
            self._registers[base : base + len(block)] = block
            self._counts["results"] += 1
            if cut:
                self._counts["texts_cut"] += 1

    def set_busy(self, station: str, busy: bool) -> None:
        """Set a station's busy coil (returns at once)."""
        i = self._index.get(station)
        if i is None:
            return
        with self._lock:
            self._busy[i] = bool(busy)

    def stats(self) -> dict[str, int]:
        """Counters: requests, reads, triggers (taken, refused), writes refused,
        exceptions answered, callback errors, results (and for unknown stations), texts
        cut to fit."""
        with self._lock:
            return dict(self._counts)

    # -- the server's side (on its loop) ------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def _trace(self, sending: bool, pdu: ModbusPDU) -> ModbusPDU:
        """Count every request and every exception answered (pymodbus's own ones too,
        such as an address beyond the map); answer a request for another unit id with
        exception 0B."""
        try:
            from pymodbus.constants import ExcCodes  # noqa: PLC0415
            from pymodbus.pdu import ExceptionResponse  # noqa: PLC0415

            unit = self.config.unit_id
            if sending and unit not in (0, pdu.dev_id):
                pdu = ExceptionResponse(
                    pdu.function_code & 0x7F,
                    ExcCodes.GATEWAY_NO_RESPONSE,
                    device_id=pdu.dev_id,
                    transaction=pdu.transaction_id,
                )
            if not sending:
                self._count("requests")
            elif isinstance(pdu, ExceptionResponse):
                self._count("exceptions")
                if pdu.function_code & 0x7F in _WRITES:
                    self._count("writes_refused")
        except Exception:
            log.exception("modbus server: counting a PDU failed")
        return pdu

    async def _action(
        self,
        function_code: int,
        start_address: int,
        address: int,
        count: int,
        current_registers: list[int],
        set_values: list[int] | list[bool] | None,
    ) -> Any:
        """pymodbus calls this before every access: serve reads from the image, take
        trigger writes, refuse every other write."""
        from pymodbus.constants import ExcCodes  # noqa: PLC0415

        try:
            if set_values is not None and function_code in _WRITES:
                if function_code not in (5, 15):
                    return ExcCodes.ILLEGAL_ADDRESS
                return self._trigger_coils(address, list(set_values))
            if function_code == 3:
                self._count("reads")
                self._fill_registers(start_address, address, count, current_registers)
            elif function_code == 1:
                self._count("reads")
                self._fill_coils(current_registers)
            # 5 and 15 read back what was just written (the echo): left as it is
        except Exception:
            self._count("callback_errors")
            log.exception("modbus server: a request failed")
            return ExcCodes.DEVICE_FAILURE
        return None

    def _trigger_coils(self, address: int, values: list[Any]) -> Any:
        from pymodbus.constants import ExcCodes  # noqa: PLC0415

        addresses = range(address, address + len(values))
        if any(a % 2 or a // 2 >= len(self.stations) for a in addresses):
            return ExcCodes.ILLEGAL_ADDRESS  # a busy coil, or beyond the stations
        refused = False
        for a, value in zip(addresses, values, strict=True):
            if not value:
                continue
            i = a // 2
            base = self.config.station_base + i * self.config.block_size
            # Cleared first: the station may answer before on_trigger returns.
            with self._lock:
                was_valid = self._registers[base + VALID]
                self._registers[base + VALID] = 0
            try:
                taken = bool(self._on_trigger(self.stations[i]))
            except Exception:
                self._count("callback_errors")
                log.exception("modbus server: station %s's trigger failed", self.stations[i])
                taken = False
            if not taken:  # no result will follow: the last one stands
                with self._lock:
                    self._registers[base + VALID] |= was_valid
            self._count("triggers" if taken else "triggers_refused")
            refused |= not taken
        return ExcCodes.DEVICE_BUSY if refused else None

    def _fill_registers(
        self, start_address: int, address: int, count: int, registers: list[int]
    ) -> None:
        offset = address - start_address
        heartbeat = int(time.monotonic() - self._started) & 0xFFFF
        with self._lock:
            self._registers[0] = heartbeat
            registers[offset : offset + count] = self._registers[address : address + count]

    def _fill_coils(self, registers: list[int]) -> None:
        with self._lock:
            bits = [False] * (2 * len(self.stations))
            bits[1::2] = self._busy
        # 16 coils a register, coil 0 in bit 0 (pymodbus's packing); triggers read 0
        for r in range(math.ceil(len(bits) / 16)):
            chunk = bits[r * 16 : r * 16 + 16]
            registers[r] = sum(1 << k for k, bit in enumerate(chunk) if bit)
