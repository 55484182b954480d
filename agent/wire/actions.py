"""Remote actions: what the fleet may ask of a device, and what the device answers.

An **action request** is signed by the fleet's director key exactly like a bundle
directive (a TUF ``Metadata[Targets]``: ``version`` = the device's action counter,
``expires``, no targets, and ``custom`` = ``{"type": "action", "device_id",
"request_id", "action", "params"}``); it is published retained on
:func:`agent.wire.topics.action_request`. The device answers on
:func:`agent.wire.topics.action_result` (:class:`ActionResult`: accepted, running, ok,
refused, failed) and sends what it collected (log lines, a diagnostics archive) as
:class:`ActionChunk` messages on :func:`agent.wire.topics.action_chunk`. See
docs/device-logs-and-actions.md and docs/adr/0026-remote-actions.md.

:func:`check_params` is the one place the parameters of each action are checked: the
fleet checks what an operator asked before it signs, the device checks what it verified
before it acts (a parameter it does not know is refused, naming it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from agent.wire.codec import parse
from agent.wire.envelope import Count, Message, Timestamp

ACTION_LOGS = "logs"
ACTION_RESTART = "restart"
ACTION_RELOAD = "reload"
ACTION_DIAGNOSTICS = "diagnostics"
ACTIONS = (ACTION_LOGS, ACTION_RESTART, ACTION_RELOAD, ACTION_DIAGNOSTICS)

REQUEST_TYPE = "action"
"""``custom.type`` of a signed action request (a bundle directive has none)."""

STATUS_ACCEPTED = "accepted"
STATUS_RUNNING = "running"
STATUS_OK = "ok"
STATUS_REFUSED = "refused"
STATUS_FAILED = "failed"
STATUSES = (STATUS_ACCEPTED, STATUS_RUNNING, STATUS_OK, STATUS_REFUSED, STATUS_FAILED)
FINAL = (STATUS_OK, STATUS_REFUSED, STATUS_FAILED)
"""A request with one of these answers is done (``running`` may follow ``accepted``)."""

DEFAULT_LINES = 500
MAX_LINES = 10_000
DEFAULT_SINCE_S = 3600
MAX_SINCE_S = 30 * 86_400
MAX_GREP_CHARS = 200
MAX_FOLLOW_S = 600
DEFAULT_DIAG_LINES = 200
MAX_EXPIRES_S = 7 * 86_400
DEFAULT_EXPIRES_S = 3600
MAX_REASON_CHARS = 2000
MAX_CHUNK_DATA = 96 * 1024
"""Characters of one chunk's ``data`` (base64 of 64 KiB is 87,384)."""
ENCODING_TEXT = "utf-8"
ENCODING_BASE64 = "base64"

_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")

_PARAMS: dict[str, dict[str, tuple[type, int, int]]] = {
    ACTION_LOGS: {
        "since_s": (int, 1, MAX_SINCE_S),
        "lines": (int, 1, MAX_LINES),
        "grep": (str, 0, MAX_GREP_CHARS),
        "follow_s": (int, 0, MAX_FOLLOW_S),
    },
    ACTION_DIAGNOSTICS: {"lines": (int, 1, MAX_LINES)},
    ACTION_RESTART: {},
    ACTION_RELOAD: {},
}
"""Each action's parameters: type, and the bounds of an int (a string's length)."""

DEFAULTS: dict[str, dict[str, Any]] = {
    ACTION_LOGS: {"since_s": DEFAULT_SINCE_S, "lines": DEFAULT_LINES, "grep": "", "follow_s": 0},
    ACTION_DIAGNOSTICS: {"lines": DEFAULT_DIAG_LINES},
    ACTION_RESTART: {},
    ACTION_RELOAD: {},
}


def is_request_id(value: object) -> bool:
    """Whether ``value`` can be a request id (1-64 of A-Z a-z 0-9 . _ : -)."""
    return isinstance(value, str) and _REQUEST_ID.fullmatch(value) is not None


def _request_id(value: str) -> str:
    if not is_request_id(value):
        raise ValueError(f"{value[:80]!r} is not a request id (1-64 of A-Z a-z 0-9 . _ : -)")
    return value


RequestId = Annotated[str, AfterValidator(_request_id)]


def check_params(action: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of ``action`` with the defaults filled in.

    Raises:
        ValueError: an unknown action, an unknown parameter, or a value of the wrong
            type or out of bounds (the message names which).
    """
    if action not in _PARAMS:
        raise ValueError(f"action {str(action)[:40]!r} is not one of {', '.join(ACTIONS)}")
    known = _PARAMS[action]
    unknown = sorted(str(k)[:40] for k in params if k not in known)
    if unknown:
        allowed = ", ".join(known) or "none"
        raise ValueError(f"{action}: unknown parameter(s) {', '.join(unknown)} (known: {allowed})")
    out = dict(DEFAULTS[action])
    for name, value in params.items():
        kind, low, high = known[name]
        if kind is int:
            if type(value) is not int:
                raise ValueError(f"{action}.{name}: {value!r} is not a whole number")
            if not low <= value <= high:
                raise ValueError(f"{action}.{name}: {value} is not in [{low}, {high}]")
        else:
            if not isinstance(value, str):
                raise ValueError(f"{action}.{name}: {value!r} is not text")
            if len(value) > high:
                raise ValueError(f"{action}.{name}: {len(value)} characters (at most {high})")
            if any(ord(c) < 32 for c in value):
                raise ValueError(f"{action}.{name}: holds a control character")
        out[name] = value
    return out


class ActionResult(Message):
    """The device's answer to an action request (several per request: ``accepted``,
    then ``running`` while it streams, then one of :data:`FINAL`).

    A request refused before its signature verified is answered with the request id it
    claimed (when that is a valid id) and no counter: the fleet files the refusal under
    its own request of that id, if it has one for this device.
    """

    kind: Literal["action_result"] = "action_result"
    request_id: RequestId = Field(description="The request's id (custom.request_id).")
    status: Literal["accepted", "running", "ok", "refused", "failed"]
    action: str = Field("", max_length=40, description="logs, restart, reload, diagnostics.")
    counter: int | None = Field(None, ge=0, description="The verified request's counter.")
    reason: str = Field("", max_length=MAX_REASON_CHARS, description="Why, in one line.")
    ts: Timestamp = Field(description="Unix time of the answer (device clock).")
    chunks: Count = Field(0, description="Chunks sent so far for this request.")
    bytes: Count = Field(0, description="Bytes of data sent so far (decoded).")
    sha256: str = Field("", max_length=64, description="Of all the data sent, once done.")
    detail: dict[str, Any] = Field(default_factory=dict, description="Action-specific.")


class ActionChunk(Message):
    """One piece of what an action collected, in order (``seq`` from 0)."""

    kind: Literal["action_chunk"] = "action_chunk"
    request_id: RequestId = Field(description="The request's id.")
    seq: int = Field(ge=0, le=1_000_000, description="Position, from 0.")
    encoding: Literal["utf-8", "base64"] = Field(description="How ``data`` holds the bytes.")
    data: str = Field(max_length=MAX_CHUNK_DATA, description="The bytes, as ``encoding`` says.")
    ts: Timestamp = Field(description="Unix time it was sent (device clock).")


def parse_result(payload: bytes, max_bytes: int) -> ActionResult:
    """An :class:`ActionResult` from untrusted bytes.

    Raises:
        MessageError: over ``max_bytes``, not JSON, or not a valid result.
    """
    return parse(ActionResult, payload, max_bytes)


def parse_chunk(payload: bytes, max_bytes: int) -> ActionChunk:
    """An :class:`ActionChunk` from untrusted bytes.

    Raises:
        MessageError: over ``max_bytes``, not JSON, or not a valid chunk.
    """
    return parse(ActionChunk, payload, max_bytes)
