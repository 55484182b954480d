"""Reading and writing device messages: a payload is size-checked, inflated when gzip,
parsed as untrusted JSON and validated as its kind (:func:`parse`); a message is written as
compact JSON within the size limit (:func:`encode`).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import ValidationError

from agent.wire import compress, untrusted
from agent.wire.envelope import (
    MAX_PAYLOAD_BYTES,
    Message,
    MessageError,
    PayloadTooLarge,
    error_text,
)
from agent.wire.quality import DriftBatch, ShadowBatch
from agent.wire.reports import Health, Telemetry

M = TypeVar("M", bound=Message)


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


def parse_quality(
    payload: bytes | bytearray | memoryview, max_bytes: int = MAX_PAYLOAD_BYTES
) -> ShadowBatch | DriftBatch:
    """A payload of the quality topic: :class:`ShadowBatch` when ``kind`` is "shadow",
    :class:`DriftBatch` when it is "drift".

    Raises:
        PayloadTooLarge: over ``max_bytes``.
        MessageError: not JSON, not an object, an unknown kind, or a field missing or
            invalid (named).
    """
    raw = parse_object("quality", payload, max_bytes)
    kind = raw.get("kind")
    models: dict[object, type[ShadowBatch | DriftBatch]] = {
        "shadow": ShadowBatch,
        "drift": DriftBatch,
    }
    model = models.get(kind)
    if model is None:
        raise MessageError("quality", f"kind {kind!r} is neither 'shadow' nor 'drift'")
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
