"""The messages a device reports to the fleet: state, heartbeat, health, telemetry,
decision uploads, decision thumbnails and events; with :func:`parse` and :func:`encode`.

Every message is a JSON object with ``schema_version`` and ``kind`` and keeps fields this
code does not know (``extra="allow"`` at every level), so an older fleet server stores
what a newer agent sends and writes it back unchanged. An incompatible change raises
:data:`SCHEMA_VERSION`; a message with a higher one is refused. The topic of each is in
:mod:`agent.wire.topics` (health and telemetry share the telemetry topic, told apart by
``kind``); the device id in the topic must equal the payload's.

Each record carries its identity from the device, so a redelivered or retried message is
stored once: a heartbeat, a health report or a telemetry sample is (device_id, kind, seq,
ts) (``seq`` counts up from 0 at agent start, ``ts`` tells two runs apart); a decision row is
(device_id, id) with the decision log's UUIDv7, and so is its thumbnail; an event is
(device_id, event_id).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, Field, ValidationError, model_validator

from agent.kernel.errors import EdgefleetError
from agent.wire import compress, topics, untrusted
from agent.wire.base import WireModel, slug
from agent.wire.jpeg import JpegError, jpeg_size

SCHEMA_VERSION = 1
MAX_PAYLOAD_BYTES = 512 * 1024
"""A payload larger than this is refused before it is parsed."""
MAX_DECISION_ROWS = 1000
"""The most decision rows one upload carries."""
MAX_THUMBNAIL_BYTES = 256 * 1024
"""The largest JPEG a thumbnail message carries (its base64 text is a third more)."""

EVENT_INSTALL = "install"
EVENT_ROLLBACK = "rollback"
EVENT_CRASH = "crash"
EVENT_ALARM = "alarm"
EVENT_KINDS = (EVENT_INSTALL, EVENT_ROLLBACK, EVENT_CRASH, EVENT_ALARM)
"""Event kinds this code knows; others are kept and stored as they are."""

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


def _event_kind(value: str) -> str:
    return slug(value, "event kind")


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


class BundleRef(WireModel):
    """One bundle release on a device."""

    name: str = Field(description="Bundle name.")
    version: str = Field(description="Bundle version (semver).")
    release: int | None = Field(None, ge=0, description="Release number the fleet signed.")
    digest: str | None = Field(None, description="Digest of the bundle, when known.")


class ReportedState(Message):
    """Retained: what the device runs. Its last will is :meth:`offline`: no ``ts``, online
    false; a state without ``ts`` changes only ``online`` of the state held."""

    kind: Literal["state"] = Field("state", description="Message kind.")
    ts: Timestamp | None = Field(None, description="Unix time of the report; none in a will.")
    online: bool = Field(True, description="False in the last will.")
    agent_version: str | None = Field(None, description="edge-agent version.")
    profile: str | None = Field(None, description="Firmware profile name.")
    labels: dict[str, str] = Field(default_factory=dict, description="Selector labels.")
    active: BundleRef | None = Field(None, description="The bundle the device runs.")
    previous: BundleRef | None = Field(None, description="The bundle it ran before.")

    @classmethod
    def offline(cls, device_id: str) -> ReportedState:
        """The last will: ``online: false`` and no ``ts``."""
        return cls(device_id=device_id, online=False)


class Heartbeat(Sample):
    """The device is alive: sent every second or so."""

    kind: Literal["heartbeat"] = Field("heartbeat", description="Message kind.")


class Percentiles(WireModel):
    """Latency percentiles of one model over the report's window, in milliseconds."""

    p50: Finite = Field(ge=0, description="Median, ms.")
    p95: Finite = Field(ge=0, description="95th percentile, ms.")
    p99: Finite = Field(ge=0, description="99th percentile, ms.")
    count: Count = Field(0, description="Inferences in the window.")


class Health(Sample):
    """How the device and its pipelines are doing."""

    kind: Literal["health"] = Field("health", description="Message kind.")
    fps: dict[str, Annotated[Finite, Field(ge=0)]] = Field(
        default_factory=dict, description="Frames per second, per camera."
    )
    latency_ms: dict[str, Percentiles] = Field(
        default_factory=dict, description="Inference latency percentiles, per model."
    )
    queue_depth: dict[str, Count] = Field(default_factory=dict, description="Per queue.")
    drops: dict[str, Count] = Field(
        default_factory=dict, description="Dropped frames or requests since start, per cause."
    )
    cpu_percent: Finite | None = Field(None, ge=0, description="CPU use, % of one core x cores.")
    memory_mb: Finite | None = Field(None, ge=0, description="Resident memory of the agent, MB.")
    temperature_c: dict[str, Finite] = Field(
        default_factory=dict, description="Temperatures °C per zone; empty where unreadable."
    )
    disk_free_mb: Finite | None = Field(None, ge=0, description="Free space on the data disk.")
    disk_used_mb: Finite | None = Field(None, ge=0, description="Used space on the data disk.")


class Telemetry(Sample):
    """Named numeric readings that fit no other message."""

    kind: Literal["telemetry"] = Field("telemetry", description="Message kind.")
    metrics: dict[str, Finite] = Field(default_factory=dict, description="Name -> value.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels of the sample.")


_JSON_COLUMNS = ("outputs", "thresholds", "latencies_ms")


class DecisionRow(WireModel):
    """One decision-log row (agent.decisionlog.schema.COLUMNS less the local ``uploaded``)."""

    id: RecordId = Field(description="The decision's UUIDv7 from the device's log.")
    capture_time: Timestamp = Field(description="Unix time of the frame's capture.")
    decision_time: Timestamp = Field(description="Unix time of the decision.")
    device_id: DeviceId = Field(description="The deciding device.")
    source: str = Field(description="Camera or sensor name.")
    line: str = Field(description="Production line.")
    model_name: str = Field(description="Model (pipeline) name.")
    model_version: str = Field(description="Model version.")
    bundle_digest: str = Field(description="Digest of the bundle that decided.")
    backend: str = Field(description="Inference backend.")
    config_hash: str = Field(description="Hash of the decision configuration.")
    input_digest: str = Field(description="Digest of the model input.")
    outputs: dict[str, Any] = Field(description="Post-processed model outputs.")
    outcome: str = Field(description="pass / reject / review ...")
    thresholds: dict[str, Any] = Field(description="Thresholds the policy applied.")
    latencies_ms: dict[str, Finite | None] = Field(description="Per stage, ms.")
    e2e_ms: Finite | None = Field(None, description="Capture to decision, ms.")
    thumbnail: str | None = Field(None, description="Thumbnail path on the device, if kept.")

    def key(self) -> tuple[str, str]:
        """The record's identity: (device_id, id)."""
        return (self.device_id, self.id)

    @classmethod
    def from_log_row(cls, row: Mapping[str, Any]) -> DecisionRow:
        """A row read from the decision log (JSON columns as text, ``uploaded`` dropped).

        Raises:
            MessageError: a JSON column is not JSON, or a field is missing or invalid.
        """
        data = {k: v for k, v in row.items() if k != "uploaded"}
        for name in _JSON_COLUMNS:
            if isinstance(data.get(name), str):
                try:
                    data[name] = json.loads(data[name])
                except json.JSONDecodeError as exc:
                    raise MessageError(
                        "decisions", f"row {row.get('id')!r}: {name}: {exc}"
                    ) from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise MessageError("decisions", error_text(exc)) from exc


class DecisionUpload(Message):
    """A batch of decision rows, all of this device."""

    kind: Literal["decisions"] = Field("decisions", description="Message kind.")
    rows: list[DecisionRow] = Field(
        min_length=1, max_length=MAX_DECISION_ROWS, description="The rows, oldest first."
    )

    @model_validator(mode="after")
    def _rows_of_this_device(self) -> DecisionUpload:
        for row in self.rows:
            if row.device_id != self.device_id:
                raise ValueError(
                    f"row {row.id} is of device {row.device_id!r}, the upload of {self.device_id!r}"
                )
        return self


class ThumbnailUpload(Message):
    """The JPEG thumbnail the decision log kept of one decision.

    Queued just before the upload batch that holds the decision; the fleet keeps it
    beside the decision, whichever of the two arrives first. ``data`` is the JPEG in
    standard base64; it is checked to be a JPEG of at most :data:`MAX_THUMBNAIL_BYTES`
    whose size can be read.
    """

    kind: Literal["thumbnail"] = Field("thumbnail", description="Message kind.")
    decision_id: RecordId = Field(description="The decision's id (DecisionRow.id).")
    decision_time: Timestamp = Field(description="Unix time of the decision.")
    content_type: Literal["image/jpeg"] = Field("image/jpeg", description="Image format.")
    data: str = Field(
        min_length=4,
        max_length=4 * ((MAX_THUMBNAIL_BYTES + 2) // 3),
        description="The JPEG, standard base64.",
    )

    @model_validator(mode="after")
    def _a_jpeg(self) -> ThumbnailUpload:
        data = self.jpeg()
        if len(data) > MAX_THUMBNAIL_BYTES:
            raise ValueError(f"data: a JPEG of {len(data)} bytes, over {MAX_THUMBNAIL_BYTES}")
        try:
            jpeg_size(data)
        except JpegError as exc:
            raise ValueError(f"data: {exc}") from exc
        return self

    def jpeg(self) -> bytes:
        """The JPEG bytes.

        Raises:
            ValueError: ``data`` is not standard base64.
        """
        try:
            return base64.b64decode(self.data, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"data: not base64: {exc}") from exc

    def key(self) -> tuple[str, str]:
        """The record's identity: (device_id, decision_id)."""
        return (self.device_id, self.decision_id)

    @classmethod
    def of(
        cls, device_id: str, decision_id: str, decision_time: float, jpeg: bytes
    ) -> ThumbnailUpload:
        """The message of a thumbnail file's bytes.

        Raises:
            MessageError: not a JPEG whose size can be read, over the size limit, or an
                invalid id or time.
        """
        try:
            return cls(
                device_id=device_id,
                decision_id=decision_id,
                decision_time=decision_time,
                data=base64.b64encode(jpeg).decode("ascii"),
            )
        except ValidationError as exc:
            raise MessageError("thumbnail", error_text(exc)) from exc


class Event(Message):
    """Something that happened once: an install step, an alarm, a rollback, a crash.

    Unlike the other messages, ``kind`` is the event's kind (see :data:`EVENT_KINDS`); the
    topic says it is an event.
    """

    kind: Annotated[str, AfterValidator(_event_kind)] = Field(
        description="install | rollback | crash | alarm | ..."
    )
    event_id: RecordId = Field(description="Made by the device; the same on every retry.")
    ts: Timestamp = Field(description="Unix time of the event.")
    payload: dict[str, Any] = Field(default_factory=dict, description="Kind-specific details.")

    def key(self) -> tuple[str, str]:
        """The record's identity: (device_id, event_id)."""
        return (self.device_id, self.event_id)


M = TypeVar("M", bound=Message)


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


def parse_object(
    kind: str, payload: bytes | bytearray | memoryview, max_bytes: int = MAX_PAYLOAD_BYTES
) -> dict[str, Any]:
    """A payload as a JSON object, size checked first; a gzip payload
    (:mod:`agent.wire.compress`) is inflated first, to at most ``max_bytes``. Parsed by
    :func:`agent.wire.untrusted.loads`: bounded depth, 64-bit integers, finite numbers,
    strings a database can store.

    Raises:
        PayloadTooLarge: over ``max_bytes``, sent or inflated.
        MessageError: not UTF-8 JSON, or not an object, or damaged gzip.
    """
    size = len(payload)
    if size > max_bytes:
        raise PayloadTooLarge(kind, size, max_bytes)
    if compress.is_compressed(payload):
        try:
            payload = compress.decompress(payload, max_bytes)
        except compress.CompressedPayloadError as exc:
            raise MessageError(kind, exc.reason) from exc
    try:
        raw = untrusted.loads(payload, what=f"{kind} message", max_bytes=max_bytes)
    except untrusted.PayloadTooLarge as exc:
        raise PayloadTooLarge(kind, exc.size, max_bytes) from None
    except untrusted.UntrustedInputError as exc:
        raise MessageError(kind, exc.reason) from None
    if not isinstance(raw, dict):
        raise MessageError(kind, f"a JSON {type(raw).__name__}, not an object")
    return raw


def _kind_of(model: type[Message]) -> str:
    field = model.model_fields.get("kind")
    default = field.default if field is not None else None
    return default if isinstance(default, str) else model.__name__.lower()


def parse(
    model: type[M], payload: bytes | bytearray | memoryview, max_bytes: int = MAX_PAYLOAD_BYTES
) -> M:
    """Validate a payload as a ``model`` message.

    Raises:
        PayloadTooLarge: over ``max_bytes`` (naming the size).
        MessageError: not JSON, not an object, or a field missing or invalid (named).
    """
    kind = _kind_of(model)
    raw = parse_object(kind, payload, max_bytes)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise MessageError(kind, error_text(exc)) from exc


def parse_telemetry(
    payload: bytes | bytearray | memoryview, max_bytes: int = MAX_PAYLOAD_BYTES
) -> Health | Telemetry:
    """A payload of the telemetry topic: :class:`Health` when ``kind`` is "health", else
    :class:`Telemetry`.

    Raises:
        PayloadTooLarge: over ``max_bytes``.
        MessageError: not JSON, not an object, or a field missing or invalid (named).
    """
    raw = parse_object("telemetry", payload, max_bytes)
    model: type[Health | Telemetry] = Health if raw.get("kind") == "health" else Telemetry
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise MessageError(_kind_of(model), error_text(exc)) from exc


def encode(message: Message, max_bytes: int = MAX_PAYLOAD_BYTES) -> bytes:
    """The message as its compact JSON payload, unknown fields kept.

    Raises:
        PayloadTooLarge: the payload would be over ``max_bytes``.
        MessageError: a value can't be JSON (NaN or infinity in an unknown field).
    """
    kind = _kind_of(type(message))
    try:
        text = json.dumps(
            message.model_dump(mode="json"),
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )
    except ValueError as exc:
        raise MessageError(kind, f"can't be JSON: {exc}") from exc
    data = text.encode("utf-8")
    if len(data) > max_bytes:
        raise PayloadTooLarge(kind, len(data), max_bytes)
    return data


def install_state_event(device_id: str, report: Mapping[str, Any]) -> Event:
    """The installer's retained report (``install/state``) as an ``install`` event.

    The report carries no id, so the event's id is a digest of its content: the same
    report delivered again (a retained copy on resubscribe) is the same record.

    Raises:
        MessageError: the device id is invalid, or the report's ``device_id`` differs.
    """
    claimed = report.get("device_id", device_id)
    if claimed != device_id:
        raise MessageError(
            "install-state", f"device_id {claimed!r} differs from the topic's {device_id!r}"
        )
    canonical = json.dumps(report, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(f"{device_id}\n{canonical}".encode()).hexdigest()[:32]
    ts = report.get("ts")
    when = float(ts) if isinstance(ts, (int, float)) and math.isfinite(ts) and ts > 0 else None
    try:
        return Event(
            device_id=device_id,
            kind=EVENT_INSTALL,
            event_id=f"install-state-{digest}",
            ts=when if when is not None else time.time(),
            payload=dict(report),
        )
    except ValidationError as exc:
        raise MessageError("install-state", error_text(exc)) from exc


__all__ = [
    "EVENT_ALARM",
    "EVENT_CRASH",
    "EVENT_INSTALL",
    "EVENT_KINDS",
    "EVENT_ROLLBACK",
    "MAX_DECISION_ROWS",
    "MAX_PAYLOAD_BYTES",
    "SCHEMA_VERSION",
    "BundleRef",
    "DecisionRow",
    "DecisionUpload",
    "Event",
    "Health",
    "Heartbeat",
    "Message",
    "MessageError",
    "PayloadTooLarge",
    "Percentiles",
    "ReportedState",
    "Sample",
    "Telemetry",
    "encode",
    "error_text",
    "install_state_event",
    "parse",
    "parse_object",
    "parse_telemetry",
]
