"""Turning a DecisionRecord into the row the writer inserts (on the writer thread)."""

from __future__ import annotations

import json
import json.encoder
import math
from collections.abc import Callable
from typing import Any

from agent.decisionlog.record import DecisionRecord


def _default(obj: Any) -> Any:
    """NumPy scalars and arrays become numbers and lists; anything else its repr."""
    tolist = getattr(obj, "tolist", None)  # numpy.generic.tolist() is the Python scalar
    if callable(tolist):
        return tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return repr(obj)


def _make_encoder() -> Callable[[Any], str]:
    """The C encoder made once (``JSONEncoder.encode`` builds one on every call)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # a Python without the C accelerator
        return json.JSONEncoder(
            separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_default
        ).encode
    # markers=None: no circular-reference check (decision fields are trees);
    # arguments: markers, default, encoder, indent, key_sep, item_sep, sort_keys,
    # skipkeys, allow_nan.
    c_encode = make(
        None, _default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )

    def encode(value: Any) -> str:
        return "".join(c_encode(value, 0))

    return encode


_encode = _make_encoder()


def _finite(obj: Any) -> Any:
    """A copy of ``obj`` with NaN and infinities as None (JSON has no such numbers)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return _finite(tolist())
    return obj


def to_json(value: dict[str, Any]) -> str:
    """Compact JSON text; NaN and infinities become null, unknown objects their repr."""
    try:
        return _encode(value)
    except (ValueError, TypeError):  # a NaN, an infinity or a key that is no string
        return _encode(_finite(value))


def e2e_ms(record: DecisionRecord) -> float | None:
    """The "e2e" latency if the record has one, else decision minus capture time."""
    value = record.latencies_ms.get("e2e")
    if value is None:  # to the microsecond: epoch seconds carry no finer difference
        value = round((record.decision_time - record.capture_time) * 1000.0, 3)
    value = float(value)
    return value if math.isfinite(value) else None


def row_of(
    record: DecisionRecord, device_id: str, thumbnail: str | None
) -> tuple[str | float | int | None, ...]:
    """The tuple for schema.INSERT_SQL, in schema.COLUMNS order."""
    return (
        record.id,
        float(record.capture_time),
        float(record.decision_time),
        device_id,
        record.source,
        record.line,
        record.model_name,
        record.model_version,
        record.bundle_digest,
        record.backend,
        record.config_hash,
        record.input_digest,
        to_json(record.outputs),
        record.outcome,
        to_json(record.thresholds),
        to_json(record.latencies_ms),
        e2e_ms(record),
        thumbnail,
        0,
        record.station,
        record.part_id,
        1 if record.deadline_missed else 0,
    )
