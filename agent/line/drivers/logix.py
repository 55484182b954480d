"""Rockwell ControlLogix / CompactLogix (and Micro800) over EtherNet/IP, tags by name,
through pylogix.

Addresses are Logix tag names::

    PartId                      a controller-scope tag
    Program:Inspect.PartId      a program-scope tag
    Results[3]                  an array element (up to three dimensions: Grid[1,2])
    Station1.Result.Code        a member of a UDT (any depth, each with an index or not)

Names are ASCII identifiers as Studio 5000 allows them (a letter or ``_`` first, then
letters, digits and ``_``, at most 40 characters); at most 8 segments and 200 characters
in all. A bit of an integer (``Flags.3``) is not an address here: give the bit a BOOL tag.

Each point's type must be the tag's Logix type (checked against what the controller
reports, so a DINT read as ``int16`` is ``type_mismatch``, never a silent truncation):

    ======== ===========================================
    type     Logix type
    ======== ===========================================
    bool     BOOL (or an element of a BOOL array)
    int16    INT
    uint16   UINT
    int32    DINT
    uint32   UDINT
    int64    LINT
    float32  REAL
    float64  LREAL
    string   STRING (82 Latin-1 characters; Micro800: its short string)
    ======== ===========================================

pylogix is synchronous: the driver uses its ``PLC`` from the link's thread only. Every call
is bounded by ``timeout_ms``: the socket's timeout is set from it, and a
:class:`~agent.line.drivers.deadline.CallDeadline` shuts the socket when a call (several
round trips) overruns it. A read asks for all points in one Multiple Service Packet (one
request per point on a Micro800, which has none). A write sends every value but the
last in one request, and the last (a station's result-valid flag) alone once the others
succeeded, so a PLC never sees the flag set beside a result that failed to land.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from agent.line.drivers.base import Driver, Point, wrap
from agent.line.drivers.configs import LogixLinkConfig
from agent.line.drivers.deadline import CallDeadline, close_bounded
from agent.line.errors import LineError
from agent.line.values import VALUE_TYPES, ValueMismatch, ValueType, coerce

if TYPE_CHECKING:
    from pylogix import PLC  # type: ignore[import-untyped]

KEY = "logix"

MAX_ADDRESS = 200
MAX_SEGMENTS = 8
MAX_INDEX = (1 << 31) - 1
MAX_STRING = 82
"""Characters a Logix STRING holds."""

_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,39}"
_SEGMENT = re.compile(rf"^({_IDENT})(?:\[(\d{{1,10}}(?:,\d{{1,10}}){{0,2}})\])?$")
_PROGRAM = re.compile(rf"^Program:({_IDENT})\.(.+)$")

# CIP data type codes (the controller reports them with each value).
_BOOL, _INT, _UINT, _DINT, _UDINT, _LINT = 0xC1, 0xC3, 0xC7, 0xC4, 0xC8, 0xC5
_REAL, _LREAL, _STRUCT, _BOOL_ARRAY, _CIP_STRING, _SHORT_STRING = (
    0xCA,
    0xCB,
    0xA0,
    0xD3,
    0xD0,
    0xDA,
)
_TYPES: dict[str, tuple[int, ...]] = {
    "bool": (_BOOL, _BOOL_ARRAY),
    "int16": (_INT,),
    "uint16": (_UINT,),
    "int32": (_DINT,),
    "uint32": (_UDINT,),
    "int64": (_LINT,),
    "float32": (_REAL,),
    "float64": (_LREAL,),
    "string": (_STRUCT, _CIP_STRING, _SHORT_STRING),
}
_TYPE_NAMES = {
    _BOOL: "BOOL",
    _BOOL_ARRAY: "BOOL[]",
    _INT: "INT",
    _UINT: "UINT",
    _DINT: "DINT",
    _UDINT: "UDINT",
    _LINT: "LINT",
    _REAL: "REAL",
    _LREAL: "LREAL",
    _STRUCT: "a structure",
    _CIP_STRING: "STRING",
    _SHORT_STRING: "SHORT_STRING",
    0xC2: "SINT",
    0xC6: "USINT",
    0xC9: "LWORD",
}

_BAD_NODE = ("Path destination unknown", "Object does not exist", "Path segment error")
_DENIED = ("Privilege violation", "Attribute not settable")
_LOST = (
    "Connection failure",
    "Connection lost",
    "Register session failed",
    "Forward open failed",
)


@dataclass(frozen=True)
class LogixTag:
    """A parsed tag name: ``tag`` as sent, ``base`` without a trailing index (the name
    pylogix keeps the tag's type under)."""

    tag: str
    base: str


def parse_point(address: str, vtype: ValueType) -> Point:
    """A Logix tag name for a value of ``vtype`` (see the module's table).

    Raises:
        ValueError: not a tag name, or ``vtype`` is not a known type.
    """
    if vtype not in VALUE_TYPES:
        raise ValueError(f"unknown type {vtype!r} (known: {', '.join(VALUE_TYPES)})")
    if not isinstance(address, str) or not address:
        raise ValueError("a Logix tag name is empty")
    if len(address) > MAX_ADDRESS:
        raise ValueError(f"a Logix tag name is {len(address)} characters, over {MAX_ADDRESS}")
    if not address.isascii() or not address.isprintable() or " " in address:
        raise ValueError(f"Logix tag name {address!r} has characters other than ASCII names")
    rest = address
    program = _PROGRAM.fullmatch(address)
    if program is not None:
        rest = program.group(2)
    elif ":" in address:
        raise ValueError(f"Logix tag name {address!r}: a scope is written Program:Name.Tag")
    segments = rest.split(".")
    if len(segments) > MAX_SEGMENTS:
        raise ValueError(
            f"Logix tag name {address!r} has {len(segments)} parts, over {MAX_SEGMENTS}"
        )
    for segment in segments:
        if segment.isdigit():
            raise ValueError(
                f"Logix tag name {address!r}: a bit of an integer ({segment!r}) is not "
                "supported; give the bit a BOOL tag"
            )
        found = _SEGMENT.fullmatch(segment)
        if found is None:
            raise ValueError(
                f"Logix tag name {address!r}: {segment!r} is not a name (a letter or _ "
                "first, then letters, digits and _, at most 40) with an optional [i] or [i,j]"
            )
        if found.group(2) is not None:
            for index in found.group(2).split(","):
                if int(index) > MAX_INDEX:
                    raise ValueError(f"Logix tag name {address!r}: index {index} is too large")
    base = re.sub(r"\[[0-9,]+\]$", "", address)
    return Point(address, vtype, LogixTag(address, base))


def _reason(status: str) -> str:
    """The reason word for a pylogix ``Response.Status`` other than ``Success``."""
    if status in _BAD_NODE:
        return "bad_node"
    if status in _DENIED:
        return "denied"
    if "timed out" in status:
        return "timeout"
    if status in _LOST or status.startswith("Unknown error [Errno"):
        return "refused"
    return "protocol"


class LogixDriver(Driver):
    """One EtherNet/IP session (and CIP connection) with a Logix controller."""

    KEY: ClassVar[str] = KEY
    LIBRARY: ClassVar[str] = "pylogix"

    def __init__(self, config: LogixLinkConfig) -> None:
        super().__init__(config)
        self.cfg = config
        self._plc: PLC | None = None
        self._deadline: CallDeadline | None = None
        self._started = 0.0

    # -- the session --------------------------------------------------------------------

    def open(self) -> None:
        """Register a session and open a CIP connection (within ``timeout_ms``).

        Raises:
            LineError: ``refused`` (nothing listens, the session or connection was
                refused), ``timeout``, ``unavailable`` (no pylogix here).
        """
        self.close()
        try:
            from pylogix import PLC  # noqa: PLC0415 - only where the driver runs
        except ImportError as exc:
            raise LineError(self.config.name, "unavailable", f"pylogix: {exc}") from exc
        plc = PLC(
            self.cfg.host,
            self.cfg.slot,
            timeout=self.timeout_s,
            Micro800=self.cfg.micro800,
            port=self.cfg.port,
        )
        # Latin-1 both ways: pylogix writes a character as its code (so nothing above 255),
        # and a controller's bytes above 127 must never make a read fail.
        plc.StringEncoding = "latin-1"
        self._plc = plc
        self._deadline = CallDeadline(self.config.name)
        # pylogix connects on its first request; connect now so that open() reports it.
        ok, status = self._call(plc.conn.connect)
        if not ok:
            reason = self._failure_reason(_status_text(status))
            self.close()
            raise LineError(self.config.name, reason, f"connect: {_status_text(status)}")

    def close(self) -> None:
        """Close the CIP connection and the session; never raises."""
        plc, self._plc = self._plc, None
        deadline, self._deadline = self._deadline, None
        if plc is not None:  # a forward close is one round trip: bounded like any call
            close_bounded(
                deadline, self.timeout_s, lambda: plc.conn.Socket, plc.Close, self.config.name
            )
        elif deadline is not None:
            deadline.close()

    # -- reads and writes ---------------------------------------------------------------

    def read(self, points: Sequence[Point]) -> list[Any]:
        """The points' values, in one request where the controller allows.

        Raises:
            LineError: ``bad_node`` (no such tag), ``type_mismatch`` (the tag's Logix type
                is not the point's), ``timeout``, ``refused``, ``denied``, ``protocol``,
                ``disconnected`` (not open).
        """
        if not points:
            return []
        plc = self._require()
        tags = [_tag(p) for p in points]
        responses = self._call(lambda: plc.Read([t.tag for t in tags]))
        responses = responses if isinstance(responses, list) else [responses]
        if len(responses) != len(points):
            raise LineError(
                self.config.name,
                "protocol",
                f"asked for {len(points)} tags, got {len(responses)} answers",
            )
        values = []
        for point, tag, response in zip(points, tags, responses, strict=True):
            self._check(response.Status, tag.tag, "read")
            self._check_type(point, tag, plc)
            values.append(self._convert(point, response.Value))
        return values

    def write(self, writes: Sequence[tuple[Point, Any]]) -> None:
        """Write the values in order: all but the last in one request, then the last alone.

        Raises:
            LineError: ``bad_node``, ``type_mismatch`` (checked for every tag before
                anything is written), ``timeout``, ``refused``, ``denied``, ``protocol``,
                ``disconnected`` (not open).
        """
        if not writes:
            return
        plc = self._require()
        items = [(p, _tag(p), self._outgoing(p, v)) for p, v in writes]
        unknown = [t.tag for _, t, _ in items if t.base not in plc.KnownTags]
        if unknown:
            # Learn the types first: a missing tag or a wrong type writes nothing at all.
            learned = self._call(lambda: plc.Read(unknown))
            for name, response in zip(unknown, _as_list(learned), strict=False):
                self._check(response.Status, name, "write")
        for point, tag, _ in items:
            self._check_type(point, tag, plc)
        # Every tag's type is known now, so pylogix writes each as the controller holds
        # it (given a type, it would forget the STRING sizes it learned).
        batch = [(t.tag, v) for _, t, v in items]
        head, last = batch[:-1], batch[-1]
        if head:
            if self.cfg.micro800:  # no Multiple Service Packet: one request each
                for one in head:
                    self._write_checked(plc, [one])
            else:
                self._write_checked(plc, head)
        self._write_checked(plc, [last])

    # -- internals ----------------------------------------------------------------------

    def _require(self) -> PLC:
        if self._plc is None:
            raise LineError(self.config.name, "disconnected", "the Logix session is not open")
        return self._plc

    def _call(self, fn: Any) -> Any:
        """``fn()`` under the call's deadline; a library exception becomes a LineError.

        Raises:
            LineError: ``timeout`` when the deadline struck, else the library's failure.
        """
        plc, deadline = self._plc, self._deadline
        if plc is None or deadline is None:
            raise LineError(self.config.name, "disconnected", "the Logix session is not open")
        self._started = time.monotonic()

        def current_socket() -> socket.socket | None:
            sock: socket.socket | None = plc.conn.Socket
            return sock

        with deadline.guard(self.timeout_s, current_socket) as struck:
            try:
                result = fn()
            except Exception as exc:
                if struck():
                    raise self._timeout() from exc
                raise wrap(self.config.name, exc) from exc
        if struck():
            raise self._timeout()
        return result

    def _timeout(self) -> LineError:
        return LineError(
            self.config.name, "timeout", f"no answer within {self.config.timeout_ms:g} ms"
        )

    def _failure_reason(self, status: str) -> str:
        """A connection failure's reason: pylogix reports a lost answer and a closed
        connection alike ("Connection failure"), so one that took the whole timeout is a
        timeout."""
        reason = _reason(status)
        elapsed = time.monotonic() - self._started
        if reason == "refused" and elapsed >= 0.9 * self.timeout_s:
            return "timeout"
        return reason

    def _check(self, status: Any, tag: str, what: str) -> None:
        text = _status_text(status)
        if text == "Success":
            return
        raise LineError(self.config.name, self._failure_reason(text), f"{what} {tag}: {text}")

    def _check_type(self, point: Point, tag: LogixTag, plc: PLC) -> None:
        known = plc.KnownTags.get(tag.base)
        if known is None:
            raise LineError(
                self.config.name, "protocol", f"{tag.tag}: the controller did not say its type"
            )
        code = int(known[0])
        if code not in _TYPES[point.vtype]:
            held = _TYPE_NAMES.get(code, f"type 0x{code:02X}")
            raise LineError(
                self.config.name,
                "type_mismatch",
                f"{tag.tag} is {held}, the point says {point.vtype}",
            )

    def _convert(self, point: Point, value: Any) -> Any:
        if point.vtype == "string" and not isinstance(value, str):
            raise LineError(
                self.config.name,
                "type_mismatch",
                f"{point.address} is a structure other than STRING, the point says string",
            )
        if isinstance(value, list):
            raise LineError(
                self.config.name, "protocol", f"{point.address}: got {len(value)} values for one"
            )
        try:
            return coerce(value, point.vtype)
        except ValueMismatch as exc:
            raise LineError(self.config.name, "type_mismatch", f"{point.address}: {exc}") from exc

    def _outgoing(self, point: Point, value: Any) -> Any:
        """``value`` as pylogix writes it for the point's type.

        Raises:
            LineError: ``type_mismatch``: it does not fit (a string over 82 Latin-1
                characters, a number out of range).
        """
        try:
            value = coerce(value, point.vtype)
        except ValueMismatch as exc:
            raise LineError(self.config.name, "type_mismatch", f"{point.address}: {exc}") from exc
        if point.vtype == "string":
            try:
                size = len(value.encode("latin-1"))
            except UnicodeEncodeError:
                raise LineError(
                    self.config.name,
                    "type_mismatch",
                    f"{point.address}: a Logix STRING holds Latin-1 characters only",
                ) from None
            if size > MAX_STRING:
                raise LineError(
                    self.config.name,
                    "type_mismatch",
                    f"{point.address}: {size} characters, a Logix STRING holds {MAX_STRING}",
                )
        return value

    def _write_checked(self, plc: PLC, batch: list[tuple[str, Any]]) -> None:
        responses = _as_list(self._call(lambda: plc.Write(batch)))
        if len(responses) < len(batch):
            raise LineError(
                self.config.name,
                "protocol",
                f"wrote {len(batch)} tags, got {len(responses)} answers",
            )
        for (name, _), response in zip(batch, responses, strict=False):
            self._check(response.Status, name, "write")


def _tag(point: Point) -> LogixTag:
    parsed = point.parsed
    if not isinstance(parsed, LogixTag):
        parsed = parse_point(point.address, point.vtype).parsed
    return parsed  # type: ignore[no-any-return]


def _as_list(responses: Any) -> list[Any]:
    return responses if isinstance(responses, list) else [responses]


def _status_text(status: Any) -> str:
    """pylogix's status as text (a connect failure carries the OSError itself)."""
    if isinstance(status, str):
        return status
    if isinstance(status, BaseException):
        return f"Unknown error {status}"
    return str(status)
