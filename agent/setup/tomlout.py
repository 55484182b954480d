"""TOML text for values read from a TOML file: what ``edge-agent setup`` writes back of a
previous config's sections it keeps (tables, arrays of tables, every value ``tomllib``
returns), so that ``tomllib`` reads the same data again.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f"}
_ESCAPES["\r"] = "\\r"


def string(value: str) -> str:
    """A TOML basic string: quote, backslash and every control character escaped.

    Raises:
        ValueError: ``value`` holds a lone surrogate (not Unicode text TOML can hold).
    """
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"{value!r} is not valid Unicode (a lone surrogate)")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def key(name: str) -> str:
    """A key, bare when it can be."""
    return name if _BARE_KEY.match(name) else string(name)


def _float(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(v)


def value(v: object) -> str:
    """An inline value (arrays and tables inline).

    Raises:
        ValueError: not a TOML value, or text TOML can't hold.
    """
    text: str | None = None
    if isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, int):
        text = str(v)
    elif isinstance(v, float):
        text = _float(v)
    elif isinstance(v, str):
        text = string(v)
    elif isinstance(v, (dt.datetime, dt.date, dt.time)):
        text = v.isoformat()
    elif isinstance(v, Mapping):
        inner = ", ".join(f"{key(str(k))} = {value(x)}" for k, x in v.items())
        text = "{ " + inner + " }" if inner else "{}"
    elif isinstance(v, Sequence):
        text = "[" + ", ".join(value(x) for x in v) + "]"
    if text is None:
        raise ValueError(f"{v!r} is not a TOML value")
    return text


def _is_table(v: object) -> bool:
    return isinstance(v, Mapping)


def _is_tables(v: object) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, Mapping) for x in v)


def _path(path: Sequence[str]) -> str:
    return ".".join(key(p) for p in path)


def body(path: Sequence[str], table: Mapping[str, Any]) -> list[str]:
    """The lines of the table at ``path`` after its header: its values, then its tables
    and arrays of tables, each with its own header."""
    out = [
        f"{key(k)} = {value(v)}" for k, v in table.items() if not _is_table(v) and not _is_tables(v)
    ]
    for k, v in table.items():
        sub = (*path, k)
        if _is_table(v):
            out += ["", f"[{_path(sub)}]", *body(sub, v)]
        elif _is_tables(v):
            for item in v:
                out += ["", f"[[{_path(sub)}]]", *body(sub, item)]
    return out


def section(name: str, v: object) -> list[str]:
    """A top-level table or array of tables, headers included."""
    if _is_tables(v):
        assert isinstance(v, list)  # noqa: S101 - _is_tables
        out: list[str] = []
        for item in v:
            out += ["", f"[[{key(name)}]]", *body((name,), item)]
        return out
    if _is_table(v):
        assert isinstance(v, Mapping)  # noqa: S101 - _is_table
        return ["", f"[{key(name)}]", *body((name,), v)]
    return [f"{key(name)} = {value(v)}"]
