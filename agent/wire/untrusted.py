"""The one entry point for JSON that comes from outside: a device, a user, a file.

:func:`loads` enforces, before anything else sees the data, what every consumer needs
to hold: a size limit (checked before a byte is decoded), a nesting depth, integers
that fit in 64 bits, finite floats (no NaN or infinities, no 1e400), and strings and
keys that are valid Unicode a database can store (no lone surrogates such as ``"\\ud800"``,
no NUL). Every failure is one :class:`UntrustedInputError` naming what was wrong and
where (``$.rows[3].outputs``); no ``RecursionError``, ``OverflowError`` or
``UnicodeEncodeError`` leaves this module.

Callers never call ``json.loads`` on raw device or user bytes themselves; they call
:func:`loads` (or a parser built on it, such as :func:`agent.wire.messages.parse`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from agent.kernel.errors import EdgefleetError

MAX_DEPTH = 32
"""Deepest nesting of arrays and objects accepted by default."""
MAX_INT_DIGITS = 20
"""Longest integer literal parsed (a 64-bit integer has at most 20 characters)."""
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1
"""Integers outside [INT_MIN, INT_MAX] are refused: no database column holds them."""
MAX_STRING_CHARS = 1 << 20
"""Longest string value or key (characters)."""


class UntrustedInputError(EdgefleetError):
    """Bytes from outside are not JSON this code accepts.

    Attributes:
        what: what was being read ("heartbeat message", "sign-in body" ...).
        reason: what is wrong, with where (a JSON path such as ``$.rows[2].id``).
    """

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")


class PayloadTooLarge(UntrustedInputError):
    """Over the size limit: refused before it was decoded.

    Attributes:
        size: bytes given (or read so far).
        limit: the limit it is over.
    """

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(what, f"payload of {size} bytes is over the limit of {limit} bytes")


def _parse_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(text)} digits is out of range")
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise ValueError(f"integer {text} is out of the 64-bit range")
    return value


def _parse_float(text: str) -> float:
    if len(text) > 64:
        raise ValueError(f"number of {len(text)} characters is out of range")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _bad_text(text: str) -> str:
    """Why ``text`` can't be stored ("" when it can)."""
    if len(text) > MAX_STRING_CHARS:
        return f"a string of {len(text)} characters (limit {MAX_STRING_CHARS})"
    if "\x00" in text:
        return "a string holding NUL (\\u0000)"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"a string that is not valid Unicode (lone surrogate at {exc.start})"
    return ""


def check_value(value: Any, what: str, max_depth: int = MAX_DEPTH) -> None:
    """Check an already-parsed JSON value against the rules of :func:`loads`.

    Iterative: a deep value can't overflow the stack here.

    Raises:
        UntrustedInputError: too deep, an integer out of range, a non-finite float, a
            string or key that is not storable Unicode, or a type JSON does not have.
    """
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            why = _bad_text(item)
            if why:
                raise UntrustedInputError(what, f"{path}: {why}")
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not INT_MIN <= item <= INT_MAX:
                raise UntrustedInputError(what, f"{path}: integer out of the 64-bit range")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise UntrustedInputError(what, f"{path}: number out of range")
        elif isinstance(item, dict):
            if depth >= max_depth:
                raise UntrustedInputError(what, f"{path}: nested deeper than {max_depth} levels")
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise UntrustedInputError(what, f"{path}: a key that is not a string")
                why = _bad_text(key)
                if why:
                    raise UntrustedInputError(what, f"{path}: key: {why}")
                stack.append((sub, f"{path}.{key[:40]}", depth + 1))
        elif isinstance(item, (list, tuple)):
            if depth >= max_depth:
                raise UntrustedInputError(what, f"{path}: nested deeper than {max_depth} levels")
            stack.extend((sub, f"{path}[{i}]", depth + 1) for i, sub in enumerate(item))
        else:
            raise UntrustedInputError(what, f"{path}: a {type(item).__name__} is not JSON")


def loads(
    data: bytes | bytearray | memoryview | str,
    *,
    what: str,
    max_bytes: int,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """Parse untrusted JSON: size first, then syntax, depth, numbers and strings.

    Args:
        data: the raw bytes (UTF-8) or text.
        what: names the input in errors ("heartbeat message", "sign-in body").
        max_bytes: the most bytes accepted (of ``data`` as UTF-8 for text).
        max_depth: the deepest nesting of arrays and objects accepted.

    Raises:
        PayloadTooLarge: over ``max_bytes``, before anything is decoded.
        UntrustedInputError: not UTF-8, not JSON, or against a rule above (named).
    """
    size = len(data) if not isinstance(data, str) else len(data) * 4
    if size > max_bytes and isinstance(data, str):
        size = len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise PayloadTooLarge(what, size, max_bytes)
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UntrustedInputError(
            what, f"not JSON: not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        value = json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_no_constant,
        )
    except RecursionError:
        raise UntrustedInputError(what, f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, and the number hooks
        raise UntrustedInputError(what, f"not JSON: {exc}") from None
    check_value(value, what, max_depth)
    return value


def loads_object(
    data: bytes | bytearray | memoryview | str,
    *,
    what: str,
    max_bytes: int,
    max_depth: int = MAX_DEPTH,
) -> dict[str, Any]:
    """:func:`loads`, and the value must be a JSON object.

    Raises:
        PayloadTooLarge: over ``max_bytes``.
        UntrustedInputError: as :func:`loads`, or not an object.
    """
    value = loads(data, what=what, max_bytes=max_bytes, max_depth=max_depth)
    if not isinstance(value, dict):
        raise UntrustedInputError(what, f"a JSON {type(value).__name__}, not an object")
    return value


__all__ = [
    "INT_MAX",
    "INT_MIN",
    "MAX_DEPTH",
    "PayloadTooLarge",
    "UntrustedInputError",
    "check_value",
    "loads",
    "loads_object",
]
