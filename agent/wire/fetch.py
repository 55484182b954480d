"""The fetch protocol: a device asks the fleet for a byte range of a repository file.

Request (device -> fleet, on :func:`agent.wire.topics.fetch_request`), a JSON object::

    {"id": "<uuid>", "path": "metadata/3.root.json", "offset": 0, "max": 262144}

Response (fleet -> device, on :func:`agent.wire.topics.fetch_response`): the payload is
the raw bytes of the chunk; MQTT 5 user properties carry ``id`` (the request's), ``offset``
(of the chunk), ``total`` (the file's size), ``status`` (``ok``, ``not-found`` or
``error``) and ``reason`` (text, for a failure). Only files under ``metadata/`` and
``targets/`` of the repository are served. The device-side URL of a file is
``edgefleet:/<path>``, as python-tuf's ngclient builds it from the base URLs below.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import Field, ValidationError, field_validator

from agent.kernel.errors import EdgefleetError
from agent.wire import untrusted
from agent.wire.base import WireModel

MAX_CHUNK = 256 * 1024
"""The most bytes one response carries."""

MAX_REQUEST_BYTES = 4096
"""A request payload larger than this is refused before it is parsed."""

URL_SCHEME = "edgefleet:/"
METADATA_BASE_URL = f"{URL_SCHEME}metadata/"
TARGETS_BASE_URL = f"{URL_SCHEME}targets/"
SERVED_TOPS = ("metadata", "targets")
"""The only repository folders the fetch protocol reaches."""

STATUS_OK: Final = "ok"
STATUS_NOT_FOUND: Final = "not-found"
STATUS_ERROR: Final = "error"
Status = Literal["ok", "not-found", "error"]
_STATUSES: dict[str, Status] = {"ok": "ok", "not-found": "not-found", "error": "error"}

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ID_FIELD = re.compile(rb'"id"\s*:\s*"([A-Za-z0-9_-]{1,64})"')
_MAX_PATH = 1024


class FetchProtocolError(EdgefleetError):
    """A fetch request, response or URL does not follow the protocol.

    Attributes:
        reason: what is wrong.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"fetch protocol: {reason}")


def check_path(path: str) -> str:
    """``path`` if it is a normalised relative POSIX path under metadata/ or targets/.

    Raises:
        FetchProtocolError: empty, too long, absolute, with ``..``/``.``/empty parts,
            backslashes or NUL, or outside the served folders.
    """
    if not path or len(path) > _MAX_PATH:
        raise FetchProtocolError(f"path of {len(path)} characters")
    if "\\" in path or "\x00" in path or path.startswith("/"):
        raise FetchProtocolError(f"path {path!r} is not a relative POSIX path")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise FetchProtocolError(f"path {path!r} is not normalised or leaves the repository")
    if len(parts) < 2 or parts[0] not in SERVED_TOPS:
        raise FetchProtocolError(f"path {path!r} is not under {' or '.join(SERVED_TOPS)}/")
    return path


def url_path(url: str) -> str:
    """The repository path of an ``edgefleet:/<path>`` URL, checked by :func:`check_path`.

    Raises:
        FetchProtocolError: another scheme, or a path that :func:`check_path` refuses.
    """
    if not url.startswith(URL_SCHEME):
        raise FetchProtocolError(f"URL {url!r} does not start with {URL_SCHEME!r}")
    return check_path(url[len(URL_SCHEME) :])


class FetchRequest(WireModel):
    """One request for a byte range of a repository file."""

    id: str = Field(description="Request id (a uuid hex), echoed in the response.")
    path: str = Field(description="Repository path, e.g. 'metadata/timestamp.json'.")
    offset: int = Field(ge=0, description="First byte wanted.")
    max: int = Field(ge=1, le=MAX_CHUNK, description="Most bytes wanted in the response.")

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _ID.match(value):
            raise ValueError(f"{value!r} is not a request id (1-64 of A-Z a-z 0-9 _ -)")
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        try:
            return check_path(value)
        except FetchProtocolError as exc:
            raise ValueError(exc.reason) from None


def encode_request(request: FetchRequest) -> bytes:
    """The request as its JSON payload."""
    return json.dumps(request.model_dump(mode="json"), separators=(",", ":")).encode()


def decode_request(payload: bytes) -> FetchRequest:
    """Parse a request payload (through :func:`agent.wire.untrusted.loads`).

    Raises:
        FetchProtocolError: too large, not JSON (or too deep, a number out of range,
            not storable Unicode), or a field missing or invalid.
    """
    if len(payload) > MAX_REQUEST_BYTES:
        raise FetchProtocolError(f"request of {len(payload)} bytes (limit {MAX_REQUEST_BYTES})")
    try:
        raw: Any = untrusted.loads_object(
            payload, what="fetch request", max_bytes=MAX_REQUEST_BYTES
        )
        return FetchRequest.model_validate(raw)
    except untrusted.UntrustedInputError as exc:
        raise FetchProtocolError(f"request is not JSON this protocol takes: {exc.reason}") from None
    except ValidationError as exc:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}" for e in exc.errors()
        )
        raise FetchProtocolError(f"invalid request: {fields}") from None


def request_id_of(payload: bytes) -> str | None:
    """The ``id`` of a request that failed to parse, when one can be read (to answer it)."""
    try:
        raw = untrusted.loads(payload, what="fetch request", max_bytes=MAX_REQUEST_BYTES)
    except untrusted.UntrustedInputError:
        # Not JSON this protocol takes (too deep, a lone surrogate, a huge number): the id
        # may still stand as text. Read, not parsed; used only to address the error answer.
        if len(payload) > MAX_REQUEST_BYTES:
            return None
        found = _ID_FIELD.findall(payload)
        return found[0].decode() if len(found) == 1 else None
    value = raw.get("id") if isinstance(raw, dict) else None
    return value if isinstance(value, str) and _ID.match(value) else None


@dataclass(frozen=True)
class FetchResponse:
    """One response: a chunk of a file, or why there is none."""

    id: str
    status: Status
    offset: int = 0
    total: int = 0
    data: bytes = b""
    reason: str = ""


def response_properties(response: FetchResponse) -> Properties:
    """The MQTT 5 PUBLISH properties that carry a response's fields."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = [
        ("id", response.id),
        ("offset", str(response.offset)),
        ("total", str(response.total)),
        ("status", response.status),
        ("reason", response.reason),
    ]
    return props


def decode_response(payload: bytes, properties: Properties | None) -> FetchResponse:
    """Read a response from its payload and user properties.

    Raises:
        FetchProtocolError: a property missing or invalid, or data with a failure status.
    """
    pairs = getattr(properties, "UserProperty", None) or []
    props: dict[str, str] = {}
    for item in pairs:
        if isinstance(item, tuple) and len(item) == 2:
            props.setdefault(str(item[0]), str(item[1]))
    missing = [k for k in ("id", "status") if k not in props]
    if missing:
        raise FetchProtocolError(f"response without user properties {', '.join(missing)}")
    status = _STATUSES.get(props["status"])
    if status is None:
        raise FetchProtocolError(f"response status {props['status']!r} is not known")
    try:
        offset = int(props.get("offset", "0"))
        total = int(props.get("total", "0"))
    except ValueError as exc:
        raise FetchProtocolError(f"response offset or total is not an integer: {exc}") from exc
    if offset < 0 or total < 0 or (status == STATUS_OK and offset + len(payload) > total):
        raise FetchProtocolError(
            f"response chunk [{offset}, {offset + len(payload)}) does not fit total {total}"
        )
    if status != STATUS_OK and payload:
        raise FetchProtocolError(f"response with status {status!r} carries data")
    return FetchResponse(
        id=props["id"],
        status=status,
        offset=offset,
        total=total,
        data=bytes(payload),
        reason=props.get("reason", ""),
    )


__all__ = [
    "MAX_CHUNK",
    "MAX_REQUEST_BYTES",
    "METADATA_BASE_URL",
    "SERVED_TOPS",
    "STATUS_ERROR",
    "STATUS_NOT_FOUND",
    "STATUS_OK",
    "TARGETS_BASE_URL",
    "URL_SCHEME",
    "FetchProtocolError",
    "FetchRequest",
    "FetchResponse",
    "check_path",
    "decode_request",
    "decode_response",
    "encode_request",
    "request_id_of",
    "response_properties",
    "url_path",
]
