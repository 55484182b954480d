"""Siemens S7 (300/400/1200/1500) over ISO-on-TCP, data blocks by absolute address,
through python-snap7's client.

Addresses are the usual S7 absolute addresses in a data block (letters in any case)::

    DB10.DBX4.1     bit 1 of byte 4 of DB10                 bool
    DB10.DBB5       byte 5 (0..255)                         uint16
    DB10.DBW6       the word at bytes 6..7                  int16 (INT), uint16 (WORD, UINT)
    DB10.DBD8       the double word at bytes 8..11          int32 (DINT), uint32 (DWORD,
                                                            UDINT), float32 (REAL)
    DB10.DBS12.20   a STRING[20] at bytes 12..33            string (Latin-1)

DB numbers are 1..65535; byte offsets stop where S7's 24-bit bit address does (the whole
value below 2 MiB); a STRING holds 1..254 characters. There is no 8-byte access in this
syntax: ``int64`` and ``float64`` are refused. Values are big-endian, as S7 keeps them.

The DBs must be readable from outside: on an S7-1200/1500, a "standard" (not optimised)
block access and PUT/GET allowed in the CPU's protection settings; a CPU that refuses
answers "function not available" (``denied``).

A read takes every point of one DB in one request where they lie within
:data:`MAX_SPAN` bytes of each other. A write is one request per point, in the order
given (a station's result-valid flag last). A bool is written as a bit (``WordLen.Bit``):
the CPU sets or clears that one bit, so the other bits of its byte, which the PLC program
may be changing, are never written. A string is written after reading its header: the
STRING's declared length must be the address's (``type_mismatch`` otherwise, and nothing
is written), then only its current length and characters are written.

python-snap7 is synchronous: the driver uses its client from the link's thread only.
Each call is bounded by ``timeout_ms``: the socket's timeout is set from it once
connected, and a :class:`~agent.line.drivers.deadline.CallDeadline` shuts the socket
when a call overruns. One gap: python-snap7 opens its TCP connection with a fixed 5 s
timeout, so a connect to an address where nothing answers at all (no refusal) may take
up to 5 s; a refused connection and a CPU that accepts TCP and then stalls are bounded.
"""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from agent.line.drivers.base import Driver, Point, wrap
from agent.line.drivers.configs import S7LinkConfig
from agent.line.drivers.deadline import CallDeadline, close_bounded
from agent.line.errors import LineError
from agent.line.values import VALUE_TYPES, ValueMismatch, ValueType, coerce

if TYPE_CHECKING:
    from snap7.client import Client

KEY = "s7"

MAX_DB = 65_535
MAX_BYTES = 1 << 21
"""Bytes addressable in one area: S7 addresses bits with 24 bits."""
MAX_STRING = 254
MAX_SPAN = 200
"""Points of one DB within this many bytes are read in one request (one PDU of 240)."""
MAX_ADDRESS = 40

_ADDRESS = re.compile(r"^DB(\d{1,5})\.DB([XBWDS])(\d{1,7})(?:\.(\d{1,3}))?$", re.IGNORECASE)
_SIZES = {"X": 1, "B": 1, "W": 2, "D": 4}
_TYPES: dict[str, tuple[str, ...]] = {
    "X": ("bool",),
    "B": ("uint16",),
    "W": ("int16", "uint16"),
    "D": ("int32", "uint32", "float32"),
    "S": ("string",),
}
_FORMATS = {"int16": ">h", "uint16": ">H", "int32": ">i", "uint32": ">I", "float32": ">f"}
_NAMES = {"X": "a bit", "B": "a byte", "W": "a word", "D": "a double word", "S": "a STRING"}

# Item return codes (in a read or write answer) and header error words.
_ITEM_REASONS = {0x03: "denied", 0x05: "bad_node", 0x0A: "bad_node", 0x06: "type_mismatch",
                 0x07: "type_mismatch"}  # fmt: skip
_HEADER_REASONS = {
    0x8104: "denied",  # function not available (PUT/GET off, or not on this CPU)
    0x8404: "bad_node",  # the function cannot be performed (a write outside the DB)
}
_ITEM_CODE = re.compile(r"\(0x([0-9a-fA-F]{2})\)\s*$")


@dataclass(frozen=True)
class S7Address:
    """A parsed address: DB ``db``, ``kind`` (X B W D S), first byte, bit (X), declared
    length (S) and the bytes it spans."""

    db: int
    kind: str
    byte: int
    bit: int
    maxlen: int
    size: int


def parse_point(address: str, vtype: ValueType) -> Point:
    """An S7 absolute address in a DB for a value of ``vtype`` (see the module's table).

    Raises:
        ValueError: not such an address, out of range, or ``vtype`` can't live there.
    """
    if vtype not in VALUE_TYPES:
        raise ValueError(f"unknown type {vtype!r} (known: {', '.join(VALUE_TYPES)})")
    if not isinstance(address, str) or not address:
        raise ValueError("an S7 address is empty")
    if len(address) > MAX_ADDRESS or not address.isascii():
        raise ValueError(f"S7 address {address[:MAX_ADDRESS]!r}... is not DB<n>.DB<X|B|W|D|S>...")
    found = _ADDRESS.fullmatch(address)
    if found is None:
        raise ValueError(
            f"S7 address {address!r} is not DB<n>.DBX<byte>.<bit>, DB<n>.DBB<byte>, "
            "DB<n>.DBW<byte>, DB<n>.DBD<byte> or DB<n>.DBS<byte>.<length>"
        )
    db, kind, byte = int(found.group(1)), found.group(2).upper(), int(found.group(3))
    suffix = found.group(4)
    if not 1 <= db <= MAX_DB:
        raise ValueError(f"S7 address {address!r}: DB {db} is outside 1..{MAX_DB}")
    bit = maxlen = 0
    if kind == "X":
        if suffix is None or not 0 <= int(suffix) <= 7:
            raise ValueError(f"S7 address {address!r}: a bit is DBX<byte>.<0..7>")
        bit = int(suffix)
    elif kind == "S":
        if suffix is None or not 1 <= int(suffix) <= MAX_STRING:
            raise ValueError(f"S7 address {address!r}: a STRING is DBS<byte>.<1..{MAX_STRING}>")
        maxlen = int(suffix)
    elif suffix is not None:
        raise ValueError(f"S7 address {address!r}: DB{kind} takes no .{suffix}")
    size = maxlen + 2 if kind == "S" else _SIZES[kind]
    if byte + size > MAX_BYTES:
        raise ValueError(f"S7 address {address!r}: byte {byte} is beyond S7's {MAX_BYTES} bytes")
    if vtype not in _TYPES[kind]:
        raise ValueError(
            f"S7 address {address!r} is {_NAMES[kind]}: it holds {' or '.join(_TYPES[kind])}, "
            f"not {vtype}"
        )
    return Point(address, vtype, S7Address(db, kind, byte, bit, maxlen, size))


class S7Driver(Driver):
    """One ISO-on-TCP connection to an S7 CPU."""

    KEY: ClassVar[str] = KEY
    LIBRARY: ClassVar[str] = "snap7"

    def __init__(self, config: S7LinkConfig) -> None:
        super().__init__(config)
        self.cfg = config
        self._client: Client | None = None
        self._deadline: CallDeadline | None = None

    # -- the connection -----------------------------------------------------------------

    def open(self) -> None:
        """Connect (TCP, ISO, S7 communication setup).

        Raises:
            LineError: ``refused`` (nothing listens, or the CPU refused rack/slot),
                ``timeout``, ``unavailable`` (no python-snap7 here).
        """
        self.close()
        try:
            from snap7.client import Client  # noqa: PLC0415 - only where the driver runs
        except ImportError as exc:
            raise LineError(self.config.name, "unavailable", f"snap7: {exc}") from exc
        client = Client()
        self._client = client
        self._deadline = CallDeadline(self.config.name)
        try:
            self._call(
                lambda: client.connect(self.cfg.host, self.cfg.rack, self.cfg.slot, self.cfg.port)
            )
        except LineError:
            self.close()
            raise
        connection = client.connection
        if connection is not None and connection.socket is not None:
            connection.timeout = self.timeout_s
            connection.socket.settimeout(self.timeout_s)

    def close(self) -> None:
        """Disconnect; never raises."""
        client, self._client = self._client, None
        deadline, self._deadline = self._deadline, None
        if client is not None:
            close_bounded(
                deadline,
                self.timeout_s,
                lambda: _socket(client),
                client.disconnect,
                self.config.name,
            )
        elif deadline is not None:
            deadline.close()

    # -- reads and writes ---------------------------------------------------------------

    def read(self, points: Sequence[Point]) -> list[Any]:
        """The points' values, one request per DB where the points lie close together.

        Raises:
            LineError: ``bad_node`` (no such DB, or beyond its end), ``type_mismatch`` (a
                STRING of another declared length, a REAL that is not a finite number),
                ``timeout``, ``refused``, ``denied``, ``protocol``, ``disconnected``.
        """
        client = self._require()
        addrs = [_addr(p) for p in points]
        raw: list[bytes | None] = [None] * len(points)
        by_db: dict[int, list[int]] = {}
        for i, a in enumerate(addrs):
            by_db.setdefault(a.db, []).append(i)
        for db, indices in by_db.items():
            lo = min(addrs[i].byte for i in indices)
            hi = max(addrs[i].byte + addrs[i].size for i in indices)
            if len(indices) > 1 and hi - lo <= MAX_SPAN:
                try:
                    block = self._call(
                        lambda db=db, lo=lo, hi=hi: client.db_read(db, lo, hi - lo), f"DB{db}"
                    )
                except LineError as exc:
                    if exc.reason != "bad_node":
                        raise
                    block = None  # read them one by one to name the point that is missing
                if block is not None:
                    for i in indices:
                        start = addrs[i].byte - lo
                        raw[i] = bytes(block[start : start + addrs[i].size])
                    continue
            for i in indices:
                a, what = addrs[i], points[i].address
                raw[i] = bytes(self._call(lambda a=a: client.db_read(a.db, a.byte, a.size), what))
        return [
            self._decode(p, a, data or b"") for p, a, data in zip(points, addrs, raw, strict=True)
        ]

    def write(self, writes: Sequence[tuple[Point, Any]]) -> None:
        """Write each value, one request each, in the order given.

        Raises:
            LineError: ``bad_node``, ``type_mismatch`` (a value that does not fit, or a
                STRING of another declared length), ``timeout``, ``refused``, ``denied``,
                ``protocol``, ``disconnected``.
        """
        client = self._require()
        encoded = [(p, _addr(p), self._encode(p, _addr(p), v)) for p, v in writes]
        from snap7.type import Area, WordLen  # noqa: PLC0415 - only where the driver runs

        for point, a, data in encoded:
            if a.kind == "X":
                self._call(
                    lambda a=a, data=data: client.write_area(
                        Area.DB, a.db, a.byte * 8 + a.bit, bytearray(data), WordLen.Bit
                    ),
                    point.address,
                )
            elif a.kind == "S":
                head = bytes(self._call(lambda a=a: client.db_read(a.db, a.byte, 2), point.address))
                if head[0] != a.maxlen:
                    raise LineError(
                        self.config.name,
                        "type_mismatch",
                        f"{point.address}: the PLC's STRING is declared [{head[0]}], "
                        f"the address says [{a.maxlen}]",
                    )
                self._call(
                    lambda a=a, data=data: client.db_write(a.db, a.byte + 1, bytearray(data)),
                    point.address,
                )
            else:
                self._call(
                    lambda a=a, data=data: client.db_write(a.db, a.byte, bytearray(data)),
                    point.address,
                )

    # -- internals ----------------------------------------------------------------------

    def _require(self) -> Client:
        if self._client is None:
            raise LineError(self.config.name, "disconnected", "the S7 connection is not open")
        return self._client

    def _call(self, fn: Any, what: str = "") -> Any:
        """``fn()`` under the call's deadline; a library exception becomes a LineError
        (its detail starting with ``what``, the address, where one is given).

        Raises:
            LineError: with the reason word of what went wrong.
        """
        client, deadline = self._client, self._deadline
        if client is None or deadline is None:
            raise LineError(self.config.name, "disconnected", "the S7 connection is not open")
        with deadline.guard(self.timeout_s, lambda: _socket(client)) as struck:
            try:
                return fn()
            except Exception as exc:
                if struck():
                    raise LineError(
                        self.config.name,
                        "timeout",
                        f"no answer within {self.config.timeout_ms:g} ms",
                    ) from exc
                error = self._error(exc)
                if what:
                    error = LineError(error.link, error.reason, f"{what}: {error.detail}")
                raise error from exc

    def _error(self, exc: Exception) -> LineError:
        """The reason word for a python-snap7 exception."""
        from snap7.error import (  # noqa: PLC0415 - only where the driver runs
            S7AuthenticationError,
            S7ConnectionError,
            S7ProtocolError,
            S7TimeoutError,
        )

        reason: str | None = None
        if isinstance(exc, S7TimeoutError):
            reason = "timeout"
        elif isinstance(exc, S7AuthenticationError):
            reason = "denied"
        elif isinstance(exc, S7ConnectionError):
            reason = "disconnected" if "Not connected" in str(exc) else "refused"
        elif isinstance(exc, S7ProtocolError):
            item = _ITEM_CODE.search(str(exc))
            code = int(item.group(1), 16) if item is not None else None
            reason = _HEADER_REASONS.get(getattr(exc, "error_code", None) or 0) or (
                _ITEM_REASONS.get(code, "protocol") if code is not None else "protocol"
            )
        if reason is None:
            return wrap(self.config.name, exc)
        return LineError(self.config.name, reason, f"{type(exc).__name__}: {exc}")

    def _decode(self, point: Point, a: S7Address, data: bytes) -> Any:
        if len(data) != a.size:
            raise LineError(
                self.config.name, "protocol", f"{point.address}: {len(data)} bytes, not {a.size}"
            )
        if a.kind == "X":
            return bool(data[0] >> a.bit & 1)
        if a.kind == "B":
            return data[0]
        if a.kind == "S":
            declared, length = data[0], data[1]
            if declared != a.maxlen:
                raise LineError(
                    self.config.name,
                    "type_mismatch",
                    f"{point.address}: the PLC's STRING is declared [{declared}], "
                    f"the address says [{a.maxlen}]",
                )
            if length > declared:
                raise LineError(
                    self.config.name,
                    "protocol",
                    f"{point.address}: the STRING's length {length} is over {declared}",
                )
            return data[2 : 2 + length].decode("latin-1")
        (value,) = struct.unpack(_FORMATS[point.vtype], data)
        try:
            return coerce(value, point.vtype)
        except ValueMismatch as exc:
            raise LineError(self.config.name, "type_mismatch", f"{point.address}: {exc}") from exc

    def _encode(self, point: Point, a: S7Address, value: Any) -> bytes:
        """``value`` as the bytes written (a STRING: its length byte and characters).

        Raises:
            LineError: ``type_mismatch``: it does not fit.
        """
        try:
            value = coerce(value, point.vtype)
        except ValueMismatch as exc:
            raise LineError(self.config.name, "type_mismatch", f"{point.address}: {exc}") from exc
        if a.kind == "X":
            return bytes([1 if value else 0])
        if a.kind == "B":
            if not 0 <= value <= 255:
                raise LineError(
                    self.config.name, "type_mismatch", f"{point.address}: {value} is not a byte"
                )
            return bytes([value])
        if a.kind == "S":
            try:
                text = str(value).encode("latin-1")
            except UnicodeEncodeError:
                raise LineError(
                    self.config.name,
                    "type_mismatch",
                    f"{point.address}: an S7 STRING holds Latin-1 characters only",
                ) from None
            if len(text) > a.maxlen:
                raise LineError(
                    self.config.name,
                    "type_mismatch",
                    f"{point.address}: {len(text)} characters, the STRING holds {a.maxlen}",
                )
            return bytes([len(text)]) + text
        packed: bytes = struct.pack(_FORMATS[point.vtype], value)
        return packed


def _addr(point: Point) -> S7Address:
    parsed = point.parsed
    if not isinstance(parsed, S7Address):
        parsed = parse_point(point.address, point.vtype).parsed
    return parsed  # type: ignore[no-any-return]


def _socket(client: Client) -> socket.socket | None:
    connection = client.connection
    return None if connection is None else connection.socket
