"""Turning one MQTT payload or one file line into a reading, or saying why it isn't one."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from agent.errors import SensorError
from agent.wire import untrusted

Reading = npt.NDArray[np.float64]

MAX_PAYLOAD_BYTES = 64 * 1024
"""A sensor payload (or replay line) larger than this is refused before it is parsed."""


class BadReading(SensorError):
    """One payload or line is not a usable reading (it is skipped and counted)."""


_NUMBER_RULES = ("is not a JSON number", "out of range", "out of the 64-bit range")
"""Reasons of :mod:`agent.wire.untrusted` that mean JSON holding a number no reading takes."""


def finite(value: object) -> float | None:
    """``value`` as a float when it is a finite JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def parse_number_text(text: str) -> float | None:
    """A finite number written as text, else None."""
    try:
        number = float(text.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def parse_payload(payload: bytes | str, fields: Sequence[str], sensor: str) -> Reading:
    """A reading from a bare number, a JSON number, or a JSON object holding ``fields``.

    Raises:
        BadReading: the payload is none of those, lacks a field, or has a non-finite or
            non-numeric value.
    """
    size = len(payload) if isinstance(payload, bytes) else len(payload.encode("utf-8", "replace"))
    if size > MAX_PAYLOAD_BYTES:
        raise BadReading(
            sensor, f"payload of {size} bytes is over the limit of {MAX_PAYLOAD_BYTES}"
        )
    try:
        text = payload.decode("utf-8") if isinstance(payload, bytes) else payload
    except UnicodeDecodeError as e:
        raise BadReading(sensor, f"payload is not UTF-8: {e}") from None
    text = text.strip()
    if not text:
        raise BadReading(sensor, "empty payload")
    try:
        doc: object = untrusted.loads(text, what="sensor payload", max_bytes=MAX_PAYLOAD_BYTES)
    except untrusted.UntrustedInputError as e:
        number = parse_number_text(text)
        if number is not None:  # a bare number JSON would not take, such as ".5"
            return _one(number, fields, sensor)
        if any(rule in e.reason for rule in _NUMBER_RULES):
            raise BadReading(
                sensor, f"expected a number or a JSON object of finite numbers: {e.reason}"
            ) from None
        raise BadReading(sensor, f"not a number or JSON: {text[:80]!r} ({e.reason})") from None
    if isinstance(doc, dict):
        values = []
        for field in fields:
            if field not in doc:
                raise BadReading(sensor, f"field {field!r} is missing")
            number = finite(doc[field])
            if number is None:
                raise BadReading(sensor, f"field {field!r} is not a finite number: {doc[field]!r}")
            values.append(number)
        return np.array(values, np.float64)
    number = finite(doc)
    if number is None:
        raise BadReading(sensor, f"expected a number or a JSON object, got {text[:80]!r}")
    return _one(number, fields, sensor)


def _one(number: float, fields: Sequence[str], sensor: str) -> Reading:
    if len(fields) != 1:
        raise BadReading(sensor, f"a bare number, but {len(fields)} fields are configured")
    return np.array([number], np.float64)


def parse_csv_row(
    row: Sequence[str], columns: Sequence[int], width: int, fields: Sequence[str], sensor: str
) -> Reading:
    """The configured ``fields`` (at ``columns``) of one CSV row of ``width`` columns.

    Raises:
        BadReading: wrong number of columns, or a value that is not a finite number.
    """
    if len(row) != width:
        raise BadReading(sensor, f"{len(row)} columns, the header has {width}")
    values = []
    for field, column in zip(fields, columns, strict=True):
        number = parse_number_text(row[column])
        if number is None:
            raise BadReading(sensor, f"field {field!r} is not a finite number: {row[column]!r}")
        values.append(number)
    return np.array(values, np.float64)
