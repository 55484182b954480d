"""A small Modbus TCP PLC: pymodbus's server on its own event loop, on a free port of
loopback (or of the address given: the HIL harness puts one on its simulated LAN).

Four areas of ``size`` addresses each, from 0 (pymodbus's simulator datastore with
separate blocks, so a coil and a holding register of the same number are different
things, as on most PLCs): coils and holding registers a client may write, discrete
inputs and input registers it may only read. An address past the end is answered with
exception 2, IllegalAddress; :meth:`ModbusPlc.refuse` makes writes to an address answer
another exception (3, IllegalValue: a PLC checking a value's range).

The test side: :meth:`ModbusPlc.set` and :meth:`ModbusPlc.get` (any area, as the PLC's
program would), :meth:`ModbusPlc.wait_for`, :meth:`ModbusPlc.stall` (stop answering for a
while), :meth:`ModbusPlc.stop` and :meth:`ModbusPlc.start` (same port, same values).

Example::

    plc = ModbusPlc()
    plc.start()
    plc.set("coil", 0, [True])
    assert plc.wait_for("coil", 2, [True], timeout_s=2.0)
    plc.close()
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Literal

from pymodbus.constants import ExcCodes
from pymodbus.server import ModbusTcpServer
from pymodbus.simulator import DataType, SimData, SimDevice

from agent.line.drivers.base import AsyncRunner
from hil.loopback import free_port

Area = Literal["coil", "di", "hr", "ir"]
AREAS: tuple[Area, ...] = ("coil", "di", "hr", "ir")
# Function codes the server's datastore is read and written with, per area.
_READ_FC: dict[Area, int] = {"coil": 1, "di": 2, "hr": 3, "ir": 4}
_WRITE_FC: dict[Area, int] = {"coil": 15, "di": 2, "hr": 16, "ir": 4}
_WRITES = {5: "coil", 15: "coil", 6: "hr", 16: "hr"}
CALL_TIMEOUT_S = 10.0
MAX_STALL_S = 60.0


class ModbusPlc:
    """A Modbus TCP server on ``HOST:PORT`` answering unit ``unit_id``.

    Args:
        size: addresses per area (a multiple of 16, at most 65536).
        unit_id: the unit (slave) id it answers (others get exception 4).
        port: a fixed port (default: a free one, kept across stop/start).
        host: the address it listens on (default: loopback).
    """

    def __init__(
        self,
        *,
        size: int = 1024,
        unit_id: int = 1,
        port: int | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        if size % 16 or not 16 <= size <= 65536:
            raise ValueError("size must be a multiple of 16 in 16..65536")
        self.size = size
        self.unit_id = unit_id
        self.host = host
        self.port = port or free_port(host)
        self._values: dict[Area, list[int]] = {
            "coil": [0] * size,
            "di": [0] * size,
            "hr": [0] * size,
            "ir": [0] * size,
        }
        self._refused: dict[tuple[str, int], ExcCodes] = {}
        self._runner: AsyncRunner | None = None
        self._server: ModbusTcpServer | None = None
        self._unstall = threading.Event()
        self.reads: deque[tuple[Area, int, int]] = deque(maxlen=1000)
        """Each read request a client made, oldest first (the last 1000): the area, the
        first address and the count the datastore saw (registers; for coils and discrete
        inputs, the 16-bit words that hold the bits)."""
        self._own_call = False

    @property
    def running(self) -> bool:
        """Whether the server listens."""
        return self._server is not None

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> None:
        """Listen (again, on the same port, with the values held at the last stop).

        Raises:
            RuntimeError: it is running already, or it could not listen.
        """
        if self._server is not None:
            raise RuntimeError("the Modbus PLC is running already")
        if self._runner is None:
            self._runner = AsyncRunner("modbus-plc")
        self._server = self._runner.call(self._start(), CALL_TIMEOUT_S)

    async def _start(self) -> ModbusTcpServer:
        bits = [
            [SimData(0, values=[bool(v) for v in self._values[a]], datatype=DataType.BITS)]
            for a in ("coil", "di")
        ]
        regs = [
            [SimData(0, values=list(self._values[a]), datatype=DataType.REGISTERS)]
            for a in ("hr", "ir")
        ]
        device = SimDevice(
            self.unit_id, simdata=(bits[0], bits[1], regs[0], regs[1]), action=self._action
        )
        server = ModbusTcpServer(device, address=(self.host, self.port))
        await server.serve_forever(background=True)
        return server

    def stop(self) -> None:
        """Stop listening and close every connection; the values are kept for the next
        :meth:`start`. Idempotent."""
        server, self._server = self._server, None
        if server is None or self._runner is None:
            return
        self._unstall.set()
        self._runner.call(self._stop(server), CALL_TIMEOUT_S)

    async def _stop(self, server: ModbusTcpServer) -> None:
        for area in AREAS:
            self._values[area] = await self._get(server, area, 0, self.size)
        await server.shutdown()  # type: ignore[no-untyped-call]
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CALL_TIMEOUT_S / 2)

    def close(self) -> None:
        """Stop and end the loop's thread."""
        self.stop()
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    # -- values ------------------------------------------------------------------------

    def set(self, area: Area, address: int, values: list[int] | list[bool]) -> None:
        """Set ``values`` from ``address`` of ``area`` as the PLC's program would (bits
        for coils and discrete inputs, 16-bit registers for the others)."""
        server, runner = self._running()
        vals = [bool(v) for v in values] if area in ("coil", "di") else [int(v) for v in values]
        runner.call(self._set(server, area, address, vals), CALL_TIMEOUT_S)

    async def _set(
        self, server: ModbusTcpServer, area: Area, address: int, values: list[int] | list[bool]
    ) -> None:
        self._own_call = True  # no await runs between here and the datastore's action
        try:
            await server.async_setValues(self.unit_id, _WRITE_FC[area], address, values)
        finally:
            self._own_call = False

    def get(self, area: Area, address: int, count: int = 1) -> list[int]:
        """``count`` values of ``area`` from ``address`` (bits as 0/1)."""
        server, runner = self._running()
        return runner.call(self._get(server, area, address, count), CALL_TIMEOUT_S)

    async def _get(
        self, server: ModbusTcpServer, area: Area, address: int, count: int
    ) -> list[int]:
        self._own_call = True  # no await runs between here and the datastore's action
        try:
            values = await server.async_getValues(self.unit_id, _READ_FC[area], address, count)
        finally:
            self._own_call = False
        return [int(v) for v in values[:count]]

    def wait_for(self, area: Area, address: int, values: list[int], timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for ``values`` at ``address`` of ``area``; whether
        they came."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.get(area, address, len(values)) == [int(v) for v in values]:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def refuse(self, area: Area, address: int, code: ExcCodes = ExcCodes.ILLEGAL_VALUE) -> None:
        """Answer every write that touches ``address`` of ``area`` with exception ``code``."""
        self._refused[(area, address)] = code

    def accept(self) -> None:
        """Take back every :meth:`refuse`."""
        self._refused.clear()

    async def _action(
        self,
        function_code: int,
        _start_address: int,
        address: int,
        count: int,
        _registers: list[int],
        set_values: list[int] | list[bool] | None,
    ) -> ExcCodes | None:
        if self._own_call:
            return None
        area = _WRITES.get(function_code)
        if set_values is None:
            if area is None:  # not the read-back that follows a write
                self._log_read(function_code, address, count)
            return None
        if area is None or not self._refused:
            return None
        # a register write's count is its registers; a coil write's, its 16-bit words
        span = len(set_values) if area == "coil" else count
        for a in range(address, address + span):
            if (area, a) in self._refused:
                return self._refused[(area, a)]
        return None

    def _log_read(self, function_code: int, address: int, count: int) -> None:
        area = next(a for a, fc in _READ_FC.items() if fc == function_code)
        self.reads.append((area, address, count))

    def stall(self, seconds: float) -> None:
        """Stop answering for ``seconds`` (the server's loop blocks: connections stay
        open, nothing is read or sent), as a PLC whose scan hangs; returns at once.
        :meth:`resume` (or :meth:`stop`) ends it early."""
        _, runner = self._running()
        self._unstall.clear()
        runner.loop.call_soon_threadsafe(self._unstall.wait, min(seconds, MAX_STALL_S))

    def resume(self) -> None:
        """End a :meth:`stall` now."""
        self._unstall.set()

    def _running(self) -> tuple[ModbusTcpServer, AsyncRunner]:
        if self._server is None or self._runner is None:
            raise RuntimeError("the Modbus PLC is not running")
        return self._server, self._runner
