"""The one helper for text a camera (or any device) supplied before it is shown or
written: names, scopes, URIs, SOAP fault reasons, a V4L2 driver's card name.

Such text may hold line breaks that forge lines in a report or a config comment, bidi and
other format controls (U+202E turns what follows around), C1 controls that some
terminals obey, or lone surrogates that can't be encoded at all. :func:`one_line` makes it
one printable line: each of those characters becomes a visible escape (``\\x0a``,
``\\u202e``), nothing else changes, and the result is cut at ``max_chars``.
"""

from __future__ import annotations

import unicodedata
from typing import Any

ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""Control, format (bidi, zero-width), surrogate, private-use, unassigned, line and
paragraph separators."""
MAX_CHARS = 512


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def one_line(value: object, max_chars: int = MAX_CHARS) -> str:
    """``value`` as one line of printable text (see the module doc)."""
    text = value if isinstance(value, str) else str(value)
    out = []
    for ch in text:
        if ch == " " or (ch.isprintable() and unicodedata.category(ch) not in ESCAPED_CATEGORIES):
            out.append(ch)
        else:
            out.append(_escape(ch))
    cleaned = "".join(out)
    return cleaned if len(cleaned) <= max_chars else cleaned[: max_chars - 1] + "…"


def cleaned(data: Any, max_chars: int = MAX_CHARS) -> Any:
    """``data`` (JSON-like: dicts, lists, strings, numbers) with every string, keys
    included, passed through :func:`one_line`."""
    if isinstance(data, str):
        return one_line(data, max_chars)
    if isinstance(data, dict):
        return {one_line(k, max_chars): cleaned(v, max_chars) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [cleaned(v, max_chars) for v in data]
    return data
