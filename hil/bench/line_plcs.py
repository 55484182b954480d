"""The line bench's PLCs: the simulated OPC UA and Modbus PLCs of :mod:`hil.plc` with a
clock on the result as the PLC sees it.

Each raises a trigger (the part id, then the trigger counter stepped: a station with
``edge = "change"``) and records, for each result the station writes, when its
``result_valid`` write reached the PLC and the sequence number and status written before
it. The station writes a result's values first and ``result_valid`` last, so the time of
that write is the time the PLC can act on the result.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncua.common.callback import CallbackType, ServerItemCallback
from asyncua.server.server import Server

from hil.plc.modbus_plc import ModbusPlc
from hil.plc.opcua_plc import LINE_VARIABLES, OpcUaPlc, Variable

POLL_MS = 1.0
"""The stations' trigger poll (Modbus) and sampling interval (OPC UA): a PLC's scan is
1-10 ms; the bench takes the fast end so that the agent's own time shows."""


@dataclass(frozen=True)
class Seen:
    """A result as the PLC saw it."""

    t_ns: int
    seq: int
    status: int


class ResultClock:
    """The results seen, in order, with the values written with each."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self.seq = 0
        self.status = 0

    def result(self, t_ns: int) -> None:
        with self.lock:
            self.seen.append(Seen(t_ns, self.seq, self.status))

    def count(self) -> int:
        with self.lock:
            return len(self.seen)

    def top(self) -> int:
        """The highest sequence number seen (0: none yet)."""
        with self.lock:
            return max((s.seq for s in self.seen), default=0)


class BenchOpcUaPlc(OpcUaPlc):
    """The OPC UA PLC with the station's Status variable and a clock on results."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, variables=(*LINE_VARIABLES, Variable("Status", "uint16", 0)))
        self.clock = ResultClock()
        self.count = 0

    async def _start(self) -> Server:
        server = await super()._start()
        server.subscribe_server_callback(CallbackType.PostWrite, self._written)
        return server

    def _written(self, event: ServerItemCallback, _dispatcher: Any) -> None:
        t_ns = time.perf_counter_ns()
        for item in event.request_params.NodesToWrite:
            name = item.NodeId.Identifier
            value: Any = item.Value.Value.Value if item.Value.Value is not None else None
            if name == "Seq":
                self.clock.seq = int(value)
            elif name == "Status":
                self.clock.status = int(value)
            elif name == "ResultValid" and value is True:
                self.clock.result(t_ns)

    def trigger(self, part_id: str) -> int:
        """Write the part id, step the counter; ``perf_counter_ns`` of the step."""
        self.count += 1
        self.set("PartId", part_id)
        t_ns = time.perf_counter_ns()
        self.set("TriggerCount", self.count)
        return t_ns

    def station(self) -> dict[str, Any]:
        node = self.node_id
        return {
            "plc": {
                "name": "plc1",
                "driver": "opcua",
                "endpoint": self.endpoint,
                "security": "none",
                "timeout_ms": 1000,
            },
            "trigger": {
                "point": node("TriggerCount"),
                "type": "uint32",
                "edge": "change",
                "poll_ms": POLL_MS,
            },
            "part_id": {"point": node("PartId"), "type": "string"},
            "outputs": [
                {"point": node("OutcomeCode"), "type": "int16", "value": "outcome_code"},
                {"point": node("Status"), "type": "uint16", "value": "status"},
                {"point": node("Seq"), "type": "uint32", "value": "seq"},
                {"point": node("DecisionId"), "type": "string", "value": "decision_id"},
                {"point": node("ResultValid"), "type": "bool", "value": "result_valid"},
            ],
        }


# The Modbus station's map: holding registers and one coil.
HR_TRIGGER, HR_PART, HR_CODE, HR_STATUS, HR_SEQ = 0, 2, 20, 21, 22
COIL_VALID = 0
PART_REGS = 8


class BenchModbusPlc(ModbusPlc):
    """The Modbus PLC with a clock on results (a coil for result_valid, registers for the
    rest)."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ResultClock()
        self.count = 0

    async def _action(
        self,
        function_code: int,
        start_address: int,
        address: int,
        count: int,
        registers: list[int],
        set_values: list[int] | list[bool] | None,
    ) -> Any:
        if set_values is not None and not self._own_call:
            t_ns = time.perf_counter_ns()
            if function_code in (5, 15) and address == COIL_VALID and bool(set_values[0]):
                self.clock.result(t_ns)
            elif function_code in (6, 16):
                for i, value in enumerate(set_values):
                    reg = address + i
                    if reg == HR_STATUS:
                        self.clock.status = int(value)
                    elif reg == HR_SEQ + 1:  # uint32, high word first: the low word
                        self.clock.seq = int(value)
        return await super()._action(
            function_code, start_address, address, count, registers, set_values
        )

    def trigger(self, part_id: str) -> int:
        self.count += 1
        raw = part_id.encode()[: PART_REGS * 2].ljust(PART_REGS * 2, b"\0")
        self.set(
            "hr", HR_PART, [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]
        )
        t_ns = time.perf_counter_ns()
        self.set("hr", HR_TRIGGER, [self.count >> 16, self.count & 0xFFFF])
        return t_ns

    def station(self) -> dict[str, Any]:
        return {
            "plc": {
                "name": "plc1",
                "driver": "modbus",
                "host": "127.0.0.1",
                "port": self.port,
                "timeout_ms": 1000,
            },
            "trigger": {
                "point": f"hr:{HR_TRIGGER}",
                "type": "uint32",
                "edge": "change",
                "poll_ms": POLL_MS,
            },
            "part_id": {"point": f"hr:{HR_PART}:{PART_REGS}", "type": "string"},
            "outputs": [
                {"point": f"hr:{HR_CODE}", "type": "int16", "value": "outcome_code"},
                {"point": f"hr:{HR_STATUS}", "type": "uint16", "value": "status"},
                {"point": f"hr:{HR_SEQ}", "type": "uint32", "value": "seq"},
                {"point": f"coil:{COIL_VALID}", "type": "bool", "value": "result_valid"},
            ],
        }


BenchPlc = BenchOpcUaPlc | BenchModbusPlc
