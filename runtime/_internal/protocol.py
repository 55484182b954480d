"""The messages on the pipes between the pool and its workers.

Only slot indexes, deadlines and timings cross the process boundary; tensors stay in
shared memory. Each message is one ``os.write`` well under ``PIPE_BUF``, so it arrives
whole.

Each slot carries its request's deadline (``perf_counter_ns`` clock, shared by every
process on the machine; 0: none), because with pipelining a request may wait in a
worker's pipe, where the pool's queue can no longer expire it: the worker drops a slot
past its deadline without running it and says so in the response's ``expired`` mask
(one bit per slot position, the first 64 positions).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

OP_RUN = 1
OP_STOP = 2

ST_OK = 0
ST_FAILED = 1
ST_READY = 2
ST_LOAD_FAILED = 3

# request: op, model index, slot count, flags
_REQ_HEAD = struct.Struct("<BHHB")
# per slot: slot index, frame height, width, channels (0,0,0 = tensor already in place),
# deadline (0 = none)
_REQ_SLOT = struct.Struct("<IHHHq")
# response: status, message length, preprocess start, preprocess end, inference end,
# expired mask
_RESP = struct.Struct("<BHqqqQ")
MASK_BITS = 64

MAX_MESSAGE_TEXT = 2048
MAX_FRAME_SIDE = 0xFFFF  # a frame's height, width and channels each travel as uint16
MAX_BATCH = (4000 - _REQ_HEAD.size) // _REQ_SLOT.size


@dataclass(frozen=True)
class SlotRef:
    slot: int
    frame_shape: tuple[int, int, int] | None
    deadline_ns: int = 0


def pack_run(model: int, slots: list[SlotRef]) -> bytes:
    parts = [_REQ_HEAD.pack(OP_RUN, model, len(slots), 0)]
    for ref in slots:
        h, w, c = ref.frame_shape or (0, 0, 0)
        parts.append(_REQ_SLOT.pack(ref.slot, h, w, c, ref.deadline_ns))
    return b"".join(parts)


def pack_stop() -> bytes:
    return _REQ_HEAD.pack(OP_STOP, 0, 0, 0)


def read_request(fd: int) -> tuple[int, int, list[SlotRef]]:
    """Read one request. Returns (op, model, slots). Raises EOFError when the pool is gone."""
    op, model, count, _flags = _REQ_HEAD.unpack(_read_exact(fd, _REQ_HEAD.size))
    raw = _read_exact(fd, count * _REQ_SLOT.size) if count else b""
    slots = []
    for i in range(count):
        slot, h, w, c, deadline = _REQ_SLOT.unpack_from(raw, i * _REQ_SLOT.size)
        slots.append(SlotRef(slot, (h, w, c) if h else None, deadline))
    return op, model, slots


@dataclass(frozen=True)
class Response:
    status: int
    t_start_ns: int
    t_pre_ns: int
    t_done_ns: int
    text: str
    expired: int = 0


def pack_response(
    status: int, t_start: int, t_pre: int, t_done: int, text: str = "", expired: int = 0
) -> bytes:
    data = text.encode("utf-8", "replace")[:MAX_MESSAGE_TEXT]
    return _RESP.pack(status, len(data), t_start, t_pre, t_done, expired) + data


def read_response(fd: int) -> Response:
    """Read one response. Raises EOFError when the worker's end is closed (it died)."""
    status, length, t0, t1, t2, expired = _RESP.unpack(_read_exact(fd, _RESP.size))
    text = _read_exact(fd, length).decode("utf-8", "replace") if length else ""
    return Response(status, t0, t1, t2, text, expired)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes:
    data = os.read(fd, n)
    if len(data) == n:
        return data
    chunks = [data]
    got = len(data)
    while got < n:
        if not data:
            raise EOFError("pipe closed")
        data = os.read(fd, n - got)
        chunks.append(data)
        got += len(data)
    if not data:
        raise EOFError("pipe closed")
    return b"".join(chunks)
