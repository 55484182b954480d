"""Modbus TCP driver: pymodbus's synchronous ``ModbusTcpClient``, used from the link's
thread only, every whole call (a read of several points is several requests) bounded by
one :class:`~agent.line.drivers.deadline.CallDeadline` that shuts the socket when the
call overruns ``timeout_ms``.

Why the synchronous client and not pymodbus's asyncio one on a loop of its own: a read
through the loop (``run_coroutine_threadsafe``, a wake of the loop's thread, the future
back) cost 250 µs of CPU and 840 µs of wall time against the simulated PLC on loopback;
the synchronous client 44 µs and 170 µs (this 2-core machine, 1,000 reads of two points).
A link polls its stations' triggers every few milliseconds, so that difference is most
of the agent's own CPU per decision on a Modbus line.

Addresses, what each area allows, and how the points of a read or a write are gathered
into requests: :mod:`agent.line.drivers.modbus_address` (no protocol library there, so
check-config parses them anywhere). Writing a discrete input or an input register is
refused with ``denied`` before anything is sent; 32- and 64-bit values follow the
connection's ``word_order``; values go through pymodbus's own ``convert_to_registers`` /
``convert_from_registers``.

Reads: points of one area whose registers (or bits) touch or overlap are read with one
request, up to the protocol's limits (125 registers, 2000 bits); the rest one request
each. Only configured addresses are asked for, so a PLC with gaps in its map never sees a
request for an address it lacks. Writes, in the order given: holding registers that follow
one another without a gap go in one request (function 16: a station's outcome code,
status and sequence number in one round trip instead of three), other points one request
each (coil: function 5; one register: 6), and the last point given always in a request of
its own, so a station's result-valid flag, listed last, is written after the rest.

Exceptions the PLC answers: 2 IllegalAddress -> ``bad_node``, 3 IllegalValue ->
``type_mismatch``, any other -> ``protocol``.
"""

from __future__ import annotations

import logging
import select
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agent.line.drivers.base import Driver, Point, wrap
from agent.line.drivers.configs import ModbusLinkConfig
from agent.line.drivers.deadline import CallDeadline
from agent.line.drivers.modbus_address import (
    Address,
    _address,
    _name,
    _spans,
    _write_runs,
    parse_point,
    writable,
)
from agent.line.errors import LineError
from agent.line.values import ValueMismatch, coerce

if TYPE_CHECKING:
    from pymodbus.client import ModbusTcpClient
    from pymodbus.pdu import ModbusPDU

__all__ = ["KEY", "ModbusDriver", "parse_point", "writable"]
"""The registry imports ``parse_point`` from here (its home is modbus_address)."""

log = logging.getLogger(__name__)

KEY = "modbus"
T = TypeVar("T")

DATATYPE_NAMES: dict[str, str] = {
    "int16": "INT16",
    "uint16": "UINT16",
    "int32": "INT32",
    "uint32": "UINT32",
    "float32": "FLOAT32",
    "int64": "INT64",
    "float64": "FLOAT64",
    "string": "STRING",
}
"""pymodbus's ``DATATYPE`` member of each value type."""

EXCEPTION_REASONS = {2: "bad_node", 3: "type_mismatch"}
"""Reason word of the Modbus exception codes (IllegalAddress, IllegalValue); the rest
are ``protocol``."""
EXCEPTION_NAMES = {
    1: "IllegalFunction",
    2: "IllegalAddress",
    3: "IllegalValue",
    4: "DeviceFailure",
    5: "Acknowledge",
    6: "DeviceBusy",
    8: "MemoryParityError",
    10: "GatewayPathUnavailable",
    11: "GatewayNoResponse",
}


class ModbusDriver(Driver):
    """One Modbus TCP connection to one unit (see the module docstring)."""

    KEY = KEY
    LIBRARY = "pymodbus"

    def __init__(self, config: ModbusLinkConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._client: ModbusTcpClient | None = None
        self._deadline: CallDeadline | None = None
        self._dropped = ""

    @property
    def connected(self) -> bool:
        """Whether the TCP connection is up (a connection the PLC closed is noticed here,
        without a request: the synchronous client reads only when asked)."""
        client = self._client
        if client is None or not client.connected:
            return False
        if _peer_closed(client.socket):
            self._dropped = "the PLC closed the connection"
            client.close()  # type: ignore[no-untyped-call]
            return False
        return True

    # -- life cycle --------------------------------------------------------------------

    def open(self) -> None:
        """Connect (within the timeout).

        Raises:
            LineError: ``refused`` (nothing listens, or the host can't be reached),
                ``timeout``.
        """
        from pymodbus.client import ModbusTcpClient  # noqa: PLC0415 - loads with the driver

        self.close()
        self._dropped = ""
        c = self.settings
        client = ModbusTcpClient(
            c.host,
            port=c.port,
            name=f"plc {c.name}",
            timeout=self.timeout_s,
            retries=0,
            reconnect_delay=0,  # the link reconnects, with its backoff
        )
        started = time.monotonic()
        try:
            up = client.connect()  # type: ignore[no-untyped-call]
        except Exception as exc:
            client.close()  # type: ignore[no-untyped-call]
            raise self._error(exc, "connect") from exc
        if not up:
            client.close()  # type: ignore[no-untyped-call]
            # pymodbus says only False: a refusal comes at once, an unanswered SYN at the timeout
            if time.monotonic() - started >= 0.9 * self.timeout_s:
                raise LineError(
                    c.name, "timeout", f"connect: no answer within {self.timeout_s:g} s"
                )
            raise LineError(c.name, "refused", f"connect: {c.host}:{c.port} refused the connection")
        self._client = client
        self._deadline = CallDeadline(c.name)

    def close(self) -> None:
        """Close the connection and stop the deadline's thread."""
        client, deadline = self._client, self._deadline
        self._client = self._deadline = None
        if client is not None:
            try:
                client.close()  # type: ignore[no-untyped-call]
            except Exception as exc:  # noqa: BLE001 - close never raises
                log.debug("plc %s: close: %s", self.settings.name, exc)
        if deadline is not None:
            deadline.close()

    # -- reading and writing -----------------------------------------------------------

    def read(self, points: Sequence[Point]) -> list[Any]:
        """The values of ``points`` (adjacent ones of one area in one request).

        Raises:
            LineError: ``bad_node`` (IllegalAddress), ``type_mismatch`` (a string that is
                not UTF-8), ``timeout``, ``disconnected``, ``protocol``.
        """
        if not points:
            return []
        addresses = [_address(p) for p in points]
        spans = _spans(addresses)
        raw = self._call("read", lambda client: self._read_spans(client, spans))
        values = []
        for point, addr in zip(points, addresses, strict=True):
            span = next(s for s in spans if s.area == addr.area and s.start <= addr.start < s.end)
            words = raw[span][addr.start - span.start : addr.end - span.start]
            values.append(self._decode(point, words))
        return values

    def _read_spans(
        self, client: ModbusTcpClient, spans: list[Address]
    ) -> dict[Address, list[int]]:
        unit = self.settings.unit_id
        out: dict[Address, list[int]] = {}
        for span in spans:
            if span.area == "coil":
                reply = client.read_coils(span.start, count=span.count, device_id=unit)
            elif span.area == "di":
                reply = client.read_discrete_inputs(span.start, count=span.count, device_id=unit)
            elif span.area == "hr":
                reply = client.read_holding_registers(span.start, count=span.count, device_id=unit)
            else:
                reply = client.read_input_registers(span.start, count=span.count, device_id=unit)
            self._check(reply, _name(span))
            got = list(reply.bits) if span.area in ("coil", "di") else list(reply.registers)
            if len(got) < span.count:
                raise LineError(
                    self.settings.name,
                    "protocol",
                    f"read {_name(span)}: {len(got)} values for {span.count}",
                )
            out[span] = [int(v) for v in got[: span.count]]
        return out

    def write(self, writes: Sequence[tuple[Point, Any]]) -> None:
        """Write each value in the order given: adjacent holding registers in one request,
        the last point in a request of its own (within the timeout as a whole).

        Raises:
            LineError: ``denied`` (a discrete input or input register: nothing is
                written), ``bad_node`` (IllegalAddress), ``type_mismatch`` (the value does
                not fit, or the PLC answered IllegalValue), ``timeout``, ``disconnected``,
                ``protocol``.
        """
        if not writes:
            return
        for p, _ in writes:
            if not writable(p):
                raise LineError(
                    self.settings.name,
                    "denied",
                    f"{p.address} is read only (discrete inputs and input registers)",
                )
        encoded = [(p, _address(p), self._encode(p, v)) for p, v in writes]
        self._call("write", lambda client: self._write_all(client, encoded))

    def _write_all(
        self, client: ModbusTcpClient, encoded: list[tuple[Point, Address, list[int]]]
    ) -> None:
        unit = self.settings.unit_id
        for names, addr, words in _write_runs(encoded):
            if addr.area == "coil":
                reply = client.write_coil(addr.start, bool(words[0]), device_id=unit)
            elif len(words) == 1:
                reply = client.write_register(addr.start, words[0], device_id=unit)
            else:
                reply = client.write_registers(addr.start, words, device_id=unit)
            self._check(reply, names)

    def _call(self, doing: str, fn: Callable[[ModbusTcpClient], T]) -> T:
        """``fn(client)`` on this thread under one deadline for the whole call: past
        ``timeout_ms`` the socket is shut and the call fails with ``timeout``; after a
        timeout the connection is dropped (a late answer must not be taken for the next
        request's)."""
        client, deadline = self._live()
        with deadline.guard(self.timeout_s, lambda: client.socket) as struck:
            try:
                return fn(client)
            except LineError:
                raise
            except Exception as exc:
                error = (
                    LineError(
                        self.settings.name,
                        "timeout",
                        f"{doing}: no answer within {self.timeout_s:g} s",
                    )
                    if struck()
                    else self._error(exc, doing)
                )
                if error.reason in ("timeout", "disconnected"):
                    self._dropped = f"the connection was dropped after a {error.reason} ({doing})"
                    client.close()  # type: ignore[no-untyped-call]
                raise error from exc

    # -- values ------------------------------------------------------------------------

    def _encode(self, point: Point, value: Any) -> list[int]:
        """``value`` as registers (or one bit) for ``point``.

        Raises:
            LineError: ``type_mismatch``: it does not fit.
        """
        from pymodbus.client import ModbusTcpClient as Codec  # noqa: PLC0415

        addr = _address(point)
        try:
            fitted = coerce(value, point.vtype)
        except ValueMismatch as exc:
            raise LineError(self.settings.name, "type_mismatch", f"{point.address}: {exc}") from exc
        if point.vtype == "bool":
            return [int(bool(fitted))]
        datatype = Codec.DATATYPE[DATATYPE_NAMES[point.vtype]]
        if point.vtype != "string":
            return Codec.convert_to_registers(fitted, datatype, self.settings.word_order)
        size = len(fitted.encode("utf-8"))
        if size > 2 * addr.count:
            raise LineError(
                self.settings.name,
                "type_mismatch",
                f"{point.address}: a string of {size} bytes does not fit {addr.count} registers",
            )
        return Codec.convert_to_registers(fitted + "\x00" * (2 * addr.count - size), datatype)

    def _decode(self, point: Point, words: list[int]) -> Any:
        """The value of ``point`` from its registers (or bit).

        Raises:
            LineError: ``type_mismatch``: a string that is not UTF-8.
        """
        from pymodbus.client import ModbusTcpClient as Codec  # noqa: PLC0415

        if point.vtype == "bool":
            return bool(words[0])
        if point.vtype == "string":
            # up to the first NUL (pymodbus's converter strips trailing NULs only)
            data = b"".join(w.to_bytes(2, "big") for w in words).split(b"\x00", 1)[0]
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise LineError(
                    self.settings.name,
                    "type_mismatch",
                    f"{point.address} holds bytes that are not UTF-8 ({exc.reason} at byte "
                    f"{exc.start})",
                ) from None
        datatype = Codec.DATATYPE[DATATYPE_NAMES[point.vtype]]
        return Codec.convert_from_registers(words, datatype, self.settings.word_order)

    # -- helpers -----------------------------------------------------------------------

    def _live(self) -> tuple[ModbusTcpClient, CallDeadline]:
        client, deadline = self._client, self._deadline
        if client is None or deadline is None:
            raise LineError(self.settings.name, "disconnected", "not connected")
        if not self.connected:
            # pymodbus would connect again inside the request: the link owns reconnects
            why = self._dropped or "the PLC closed the connection"
            raise LineError(self.settings.name, "disconnected", why)
        return client, deadline

    def _check(self, reply: ModbusPDU, what: str) -> None:
        if not reply.isError():
            return
        code = int(getattr(reply, "exception_code", 0))
        name = EXCEPTION_NAMES.get(code, f"exception {code}")
        raise LineError(
            self.settings.name, EXCEPTION_REASONS.get(code, "protocol"), f"{what}: {name}"
        )

    def _error(self, exc: BaseException, doing: str) -> LineError:
        if isinstance(exc, LineError):
            return exc
        from pymodbus.exceptions import (  # noqa: PLC0415 - loads with the driver
            ConnectionException,
            ModbusIOException,
        )

        name = self.settings.name
        if isinstance(exc, ConnectionException):
            return LineError(name, "disconnected", f"{doing}: {exc}")
        if isinstance(exc, ModbusIOException):
            reason = "timeout" if "No response" in str(exc) else "protocol"
            return LineError(name, reason, f"{doing}: {exc}")
        error = wrap(name, exc)
        if error.reason == "timeout":
            return LineError(name, "timeout", f"{doing}: no answer within {self.timeout_s:g} s")
        return LineError(name, error.reason, f"{doing}: {error.detail}")


def _peer_closed(sock: socket.socket | None) -> bool:
    """Whether the peer closed ``sock`` (readable with nothing to read); never blocks.
    A PLC never sends unasked, so anything readable between requests is the close."""
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (OSError, ValueError):
        return True
