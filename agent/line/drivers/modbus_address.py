"""Modbus addresses: the syntax a station's points are written in (``coil:N``, ``di:N``,
``hr:N``, ``ir:N``, a string ``hr:N:LEN``), what each area allows, and how the points of
a read or a write are gathered into requests. No protocol library is imported here:
check-config parses a Modbus address on a device without pymodbus.

Addresses (:func:`parse_point`):

- ``coil:N`` (bool, read and write), ``di:N`` (discrete input: bool, read only);
- ``hr:N`` (holding registers, read and write), ``ir:N`` (input registers, read only):
  int16 and uint16 take one register, int32, uint32 and float32 two, int64 and float64
  four; a string is ``hr:N:LEN``: LEN registers of two UTF-8 bytes each, high byte
  first, written padded with NUL and read up to the first NUL (decoded here: pymodbus's
  converter strips only trailing NULs);
- N is 0..65535 and the whole value lies within the 65536 addresses.

Writing a discrete input or an input register is refused with ``denied`` before anything
is sent (:func:`writable` tells check-config the same). The word order of 32- and 64-bit
values is the connection's ``word_order`` (``big``: high word first); a string's
registers are in address order whatever it is. Values go through pymodbus's own
``convert_to_registers`` / ``convert_from_registers``.

Gathering: points of one area whose registers (or bits) touch or overlap are read with
one request, up to the protocol's limits (125 registers, 2000 bits); holding registers
written one after another without a gap go in one request (function 16), the last point
given always in a request of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.line.drivers.base import Point
from agent.line.values import MAX_STRING_BYTES, VALUE_TYPES, ValueType

AREAS = ("coil", "di", "hr", "ir")
READ_ONLY = frozenset({"di", "ir"})
MAX_ADDRESS = 65535
MAX_STRING_REGISTERS = MAX_STRING_BYTES // 2
MAX_READ_REGISTERS = 125
MAX_READ_BITS = 2000
MAX_ADDRESS_CHARS = 32
REGISTERS: dict[str, int] = {
    "int16": 1,
    "uint16": 1,
    "int32": 2,
    "uint32": 2,
    "float32": 2,
    "int64": 4,
    "float64": 4,
}
"""Registers a value of each number type takes."""


@dataclass(frozen=True)
class Address:
    """A parsed Modbus address: the area, the first address and how many registers (or
    bits) the value takes."""

    area: str
    start: int
    count: int

    @property
    def end(self) -> int:
        """One past the last address."""
        return self.start + self.count


def parse_point(address: str, vtype: ValueType) -> Point:
    """``address`` (``coil:N``, ``di:N``, ``hr:N``, ``ir:N``, ``hr:N:LEN`` for a string) for
    a value of ``vtype``.

    Raises:
        ValueError: not such an address (what is wrong is named), a type that can't live
            in that area, or a value reaching past address 65535.
    """
    if vtype not in VALUE_TYPES:
        raise ValueError(f"unknown value type {vtype!r} (known: {', '.join(VALUE_TYPES)})")
    if len(address) > MAX_ADDRESS_CHARS:
        raise ValueError(f"a Modbus address is at most {MAX_ADDRESS_CHARS} characters")
    parts = address.split(":")
    area = parts[0]
    if area not in AREAS or len(parts) not in (2, 3):
        raise ValueError(
            f"Modbus address {address!r}: write `coil:N`, `di:N`, `hr:N` or `ir:N` "
            "(`hr:N:LEN` for a string of LEN registers)"
        )
    start = _number(address, parts[1], "the address", MAX_ADDRESS)
    if area in ("coil", "di"):
        if vtype != "bool" or len(parts) != 2:
            raise ValueError(
                f"Modbus address {address!r}: a {'coil' if area == 'coil' else 'discrete input'} "
                f"holds one bool, not {vtype}"
            )
        return Point(address, vtype, Address(area, start, 1))
    if vtype == "bool":
        raise ValueError(
            f"Modbus address {address!r}: a bool is a `coil:N` or `di:N`, not a register"
        )
    if vtype == "string":
        if len(parts) != 3:
            raise ValueError(
                f"Modbus address {address!r}: a string needs its length in registers "
                f"(`{area}:{start}:LEN`, 2 bytes a register)"
            )
        count = _number(address, parts[2], "the length", MAX_STRING_REGISTERS, low=1)
    else:
        if len(parts) != 2:
            raise ValueError(f"Modbus address {address!r}: only a string takes a length")
        count = REGISTERS[vtype]
    if start + count - 1 > MAX_ADDRESS:
        raise ValueError(
            f"Modbus address {address!r}: a {vtype} takes {count} registers, past {MAX_ADDRESS}"
        )
    return Point(address, vtype, Address(area, start, count))


def _number(address: str, text: str, what: str, high: int, low: int = 0) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 5 or not low <= int(text) <= high:
        raise ValueError(f"Modbus address {address!r}: {what} must be a number {low}..{high}")
    return int(text)


def writable(point: Point) -> bool:
    """Whether a Modbus client can write ``point`` (coils and holding registers; discrete
    inputs and input registers are read only)."""
    parsed = point.parsed
    return isinstance(parsed, Address) and parsed.area not in READ_ONLY


def _address(point: Point) -> Address:
    if not isinstance(point.parsed, Address):  # a point parsed by another driver: a bug
        raise TypeError(f"{point.address} was not parsed as a Modbus address")
    return point.parsed


def _name(span: Address) -> str:
    last = span.end - 1
    return f"{span.area}:{span.start}" + (f"..{last}" if last > span.start else "")


MAX_WRITE_REGISTERS = 123
"""The most registers one Write Multiple Registers request carries (function 16)."""


def _write_runs(
    encoded: list[tuple[Point, Address, list[int]]],
) -> list[tuple[str, Address, list[int]]]:
    """The writes as requests, in order: holding registers that follow one another
    without a gap go in one request (function 16, at most :data:`MAX_WRITE_REGISTERS`);
    the last point given (a station's result-valid flag) always goes alone, after the
    rest; coils one each. Each run's points' addresses, joined, name it in errors."""
    runs: list[tuple[str, Address, list[int]]] = []
    last = len(encoded) - 1
    for i, (point, addr, words) in enumerate(encoded):
        if runs and i != last and addr.area == "hr":
            names, prev, prev_words = runs[-1]
            joins = prev.area == "hr" and prev.start + len(prev_words) == addr.start
            if joins and len(prev_words) + len(words) <= MAX_WRITE_REGISTERS:
                merged = Address("hr", prev.start, len(prev_words) + len(words))
                runs[-1] = (f"{names}, {point.address}", merged, prev_words + words)
                continue
        runs.append((point.address, addr, list(words)))
    return runs


def _spans(addresses: list[Address]) -> list[Address]:
    """The requests that read ``addresses``: per area, runs of addresses that touch or
    overlap merged, up to the protocol's limit per request."""
    spans: list[Address] = []
    for addr in sorted(set(addresses), key=lambda a: (a.area, a.start, a.count)):
        limit = MAX_READ_BITS if addr.area in ("coil", "di") else MAX_READ_REGISTERS
        last = spans[-1] if spans else None
        if (
            last is not None
            and last.area == addr.area
            and addr.start <= last.end
            and max(last.end, addr.end) - last.start <= limit
        ):
            spans[-1] = Address(last.area, last.start, max(last.end, addr.end) - last.start)
        else:
            spans.append(addr)
    return spans
