"""What every device message carries: the schema version, the sending device and, for a
periodic report, its identity; the field types the messages share; the errors a payload
that is not a valid message raises.

Every message is a JSON object with ``schema_version`` and ``kind`` and keeps fields this
code does not know (``extra="allow"`` at every level), so an older fleet server stores
what a newer agent sends and writes it back unchanged. An incompatible change raises
:data:`SCHEMA_VERSION`; a message with a higher one is refused.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, ValidationError

from agent.kernel.errors import EdgefleetError
from agent.wire import topics
from agent.wire.base import WireModel

SCHEMA_VERSION = 1
MAX_PAYLOAD_BYTES = 512 * 1024
"""A payload larger than this is refused before it is parsed."""

_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


class MessageError(EdgefleetError):
    """A payload is not a valid message of its kind.

    Attributes:
        kind: the kind of message expected (``heartbeat``, ``decisions`` ...).
        reason: what is wrong.
    """

    def __init__(self, kind: str, reason: str) -> None:
        self.kind = kind
        self.reason = reason
        super().__init__(f"{kind} message: {reason}")


class PayloadTooLarge(MessageError):
    """A payload is over the size limit; it is refused unparsed.

    Attributes:
        size: the payload's size in bytes.
        limit: the limit it is over.
    """

    def __init__(self, kind: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(kind, f"payload of {size} bytes is over the limit of {limit} bytes")


def _device_id(value: str) -> str:
    if not topics.is_device_id(value):
        raise ValueError(f"{value!r} is not a device id (1-64 of A-Z a-z 0-9 _ . -)")
    return value


def _record_id(value: str) -> str:
    if not 1 <= len(value) <= 128 or not set(value) <= _ID_CHARS:
        raise ValueError(f"{value!r} is not a record id (1-128 of A-Z a-z 0-9 . _ : -)")
    return value


DeviceId = Annotated[str, AfterValidator(_device_id)]
RecordId = Annotated[str, AfterValidator(_record_id)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Timestamp = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0)]


class Message(WireModel):
    """What every device message carries."""

    schema_version: int = Field(
        SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION, description="Version of the message schema."
    )
    device_id: DeviceId = Field(description="The sending device; equals the topic's.")


class Sample(Message):
    """A periodic report, identified by (device_id, :attr:`record_id`)."""

    kind: str = Field(description="Message kind.")
    seq: Count = Field(description="Counts up from 0 at agent start.")
    ts: Timestamp = Field(description="Unix time of the report, seconds.")

    @property
    def record_id(self) -> str:
        """``<kind>:<seq>:<ts>``: unique per device, the same on every delivery."""
        return f"{self.kind}:{self.seq}:{self.ts!r}"

    def key(self) -> tuple[str, str]:
        """The record's identity: (device_id, record_id)."""
        return (self.device_id, self.record_id)


MAX_ERRORS_SHOWN = 10
"""A refusal lists this many field errors and counts the rest: 1,000 bad rows make a
short message, not a 500 KB one in the logs and the quarantine table."""


def error_text(exc: ValidationError) -> str:
    """The first MAX_ERRORS_SHOWN errors as ``dotted.field: message`` (and how many more)."""
    parts = []
    errors = exc.errors()
    for err in errors[:MAX_ERRORS_SHOWN]:
        where = ".".join(str(p) for p in err["loc"]) or "message"
        message = str(err["msg"])
        if len(message) > 200:
            message = f"{message[:200]}... ({len(message)} characters)"
        parts.append(f"{where[:200]}: {message}")
    more = len(errors) - MAX_ERRORS_SHOWN
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
