"""The value types a station reads from and writes to a PLC, and the one conversion of a
Python value into each (every driver uses it, so a value that does not fit is refused the
same way everywhere, with ``type_mismatch``)."""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

ValueType = Literal[
    "bool", "int16", "uint16", "int32", "uint32", "int64", "float32", "float64", "string"
]
VALUE_TYPES: tuple[str, ...] = get_args(ValueType)

_INT_RANGES: dict[str, tuple[int, int]] = {
    "int16": (-(1 << 15), (1 << 15) - 1),
    "uint16": (0, (1 << 16) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "uint32": (0, (1 << 32) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
}
_FLOAT32_MAX = 3.4028234663852886e38
MAX_STRING_BYTES = 254
"""The longest string written to a PLC (an S7 STRING holds 254 characters)."""


class ValueMismatch(ValueError):
    """The value does not fit the type (the driver turns it into ``type_mismatch``)."""


def coerce(value: Any, vtype: str) -> Any:
    """``value`` as a Python value of PLC type ``vtype``: bool, int in range, finite float,
    or a string of at most :data:`MAX_STRING_BYTES` UTF-8 bytes.

    A float is rounded to an integer type; a bool is 0/1 for a number type; anything is
    ``str()``-ed for a string.

    Raises:
        ValueMismatch: it does not fit (out of range, not finite, not a number, too long).
    """
    if vtype == "bool":
        if isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value)):
            return bool(value)
        raise ValueMismatch(f"{value!r} is not a bool")
    if vtype in _INT_RANGES:
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueMismatch(f"{value!r} is not a finite number for {vtype}")
            value = round(value)
        if not isinstance(value, int):
            raise ValueMismatch(f"{value!r} is not a number for {vtype}")
        lo, hi = _INT_RANGES[vtype]
        if not lo <= int(value) <= hi:
            raise ValueMismatch(f"{value} is outside {vtype} ({lo}..{hi})")
        return int(value)
    if vtype in ("float32", "float64"):
        if not isinstance(value, int | float) or not math.isfinite(float(value)):
            raise ValueMismatch(f"{value!r} is not a finite number for {vtype}")
        if vtype == "float32" and abs(float(value)) > _FLOAT32_MAX:
            raise ValueMismatch(f"{value} is outside float32")
        return float(value)
    if vtype == "string":
        text = str(value)
        size = len(text.encode("utf-8"))
        if size > MAX_STRING_BYTES:
            raise ValueMismatch(f"a string of {size} bytes is over {MAX_STRING_BYTES}")
        return text
    raise ValueMismatch(f"unknown type {vtype!r} (known: {', '.join(VALUE_TYPES)})")
