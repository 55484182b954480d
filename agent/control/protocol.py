"""The control channel's wire format: one JSON object per frame, a 4-byte big-endian length
in front, over a Unix stream socket in a directory only the agent's user can enter.

A request is ``{"op": NAME, "args": {...}}``; an answer is ``{"ok": true, "result": ...}``
or ``{"ok": false, "error": TEXT}``. Requests are small (:data:`MAX_REQUEST_BYTES`);
answers carry at most :data:`MAX_ANSWER_BYTES` (the hot path's metrics text is the
largest). A frame over its limit, bytes that are not a JSON object, an unknown operation
or arguments of the wrong type are refused with a :class:`ControlError` that names what
was wrong, and nothing is done.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from agent.errors import AgentError
from agent.wire.untrusted import UntrustedInputError, loads_object

MAX_REQUEST_BYTES = 64 * 1024
MAX_ANSWER_BYTES = 4 * 1024 * 1024
_HEADER = struct.Struct(">I")

OPS: dict[str, dict[str, type]] = {
    "hello": {},
    "status": {},
    "health": {},
    "ready": {},
    "stats": {},
    "metrics": {},
    "reload": {},
    "reload_if_changed": {},
    "bundle_health": {"bundle": str},
    "alarms": {"max": int},
    "live": {},
    "trial": {"bundle": str, "runs": int, "timeout_ms": int},
}
"""Every operation the hot path answers, with its arguments and their types."""


class ControlError(AgentError):
    """A control message was refused, or the other side can't be reached.

    Attributes:
        reason: what was wrong.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"control channel: {reason}")


class FrameTooLarge(ControlError):
    """A frame over its limit: refused before its body is read."""


def encode(message: dict[str, Any], limit: int) -> bytes:
    """One frame.

    Raises:
        FrameTooLarge: the encoded message is over ``limit`` bytes.
    """
    body = json.dumps(message, separators=(",", ":"), default=str).encode("utf-8")
    if len(body) > limit:
        raise FrameTooLarge(f"a message of {len(body)} bytes is over the limit of {limit} bytes")
    return _HEADER.pack(len(body)) + body


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            return None if not chunks else bytes(chunks)
        chunks += chunk
    return bytes(chunks)


def read_frame(sock: socket.socket, limit: int, what: str) -> dict[str, Any] | None:
    """The next frame's object; None when the peer closed between frames.

    Raises:
        FrameTooLarge: the announced length is over ``limit`` (the body is not read:
            the stream can't be trusted after it, so the caller closes it).
        ControlError: the peer closed mid-frame, or the body is not a JSON object.
        OSError: the socket failed or timed out.
    """
    header = _read_exact(sock, _HEADER.size)
    if header is None:
        return None
    if len(header) < _HEADER.size:
        raise ControlError(f"{what} cut off in its length prefix")
    (size,) = _HEADER.unpack(header)
    if size > limit:
        raise FrameTooLarge(f"{what} of {size} bytes is over the limit of {limit} bytes")
    body = _read_exact(sock, size) if size else b""
    if body is None or len(body) < size:
        got = 0 if body is None else len(body)
        raise ControlError(f"{what} cut off after {got} of {size} bytes")
    try:
        return loads_object(body, what=what, max_bytes=limit)
    except UntrustedInputError as exc:
        raise ControlError(exc.reason) from None


def check_request(message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The operation and its arguments, checked against :data:`OPS`.

    Raises:
        ControlError: no such operation, an unknown or missing argument, or one of the
            wrong type.
    """
    op = message.get("op")
    if not isinstance(op, str) or op not in OPS:
        known = ", ".join(sorted(OPS))
        raise ControlError(f"unknown operation {op!r} (known: {known})")
    args = message.get("args", {})
    if not isinstance(args, dict):
        raise ControlError(f"{op}: args must be an object, not {type(args).__name__}")
    spec = OPS[op]
    extra = sorted(set(args) - set(spec))
    if extra:
        raise ControlError(f"{op}: unknown argument(s) {', '.join(extra)}")
    for name, kind in spec.items():
        if name not in args:
            raise ControlError(f"{op}: argument {name!r} is missing")
        value = args[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ControlError(f"{op}: argument {name!r} must be {kind.__name__}")
    return op, args
