"""Hostile inputs for the parsers' property tests, and the property itself.

Every parser of device or user input must either return a result or raise its documented
error type with a message; anything else (a ``RecursionError``, ``OverflowError``,
``UnicodeEncodeError``, ``KeyError`` ...) fails the test.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import event
from hypothesis import strategies as st

T = TypeVar("T")

MAX_MESSAGE = 4096
"""A clear error is short: one that repeats the input (or every field of 1000 rows)
amplifies what a device sends into logs and quarantine tables."""

# Text with everything: lone surrogates, NUL, astral characters.
ANY_CHAR = st.characters(codec=None, exclude_categories=())
TEXT = st.text(ANY_CHAR, max_size=40)

HOSTILE_SCALARS: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**63,
    -(2**63) - 1,
    10**30,
    float("nan"),
    float("inf"),
    float("-inf"),
    1e308,
    -0.0,
    "",
    "\ud800",
    "a\x00b",
    "/",
    "#",
    "+",
    "x" * 10_000,
    [],
    {},
]

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT
    | st.sampled_from(HOSTILE_SCALARS),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
"""Any JSON-like value, lone surrogates, NaN, infinities and 64-bit overflow included."""

RAW_TOKENS = [
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e400",
    b"-1e999",
    b"9" * 30,
    b"9" * 5000,
    b"0." + b"1" * 100,
    b'"\\ud800"',
    b'"\\udfff\\ud800"',
    b'"\\u0000"',
    b'"\xed\xa0\x80"',
    b"\xff\xfe",
    b"[" * 40 + b"]" * 40,
    b"{" * 3,
    b'"' + b"x" * 70_000 + b'"',
    b"true",
    b"null",
    b"",
]


def dumps(value: Any) -> bytes:
    """``value`` as JSON bytes the way a hostile sender would write it: NaN and lone
    surrogates (as ``\\udXXX`` escapes) included."""
    return json.dumps(value, allow_nan=True, ensure_ascii=True).encode()


@st.composite
def deep(draw: st.DrawFn, max_depth: int = 200_000) -> bytes:
    """Arrays or objects nested 1 to ``max_depth`` levels, closed or not."""
    depth = draw(st.one_of(st.integers(1, 64), st.integers(1, max_depth)))
    kind = draw(st.sampled_from(["list", "dict", "mixed"]))
    inner = draw(st.sampled_from([b"1", b"NaN", b'"\\ud800"', b""]))
    if kind == "list":
        opened, closed = b"[" * depth, b"]" * depth
    elif kind == "dict":
        opened, closed = b'{"a":' * depth, b"}" * depth
    else:
        opened, closed = b'[{"a":' * (depth // 2), b"}]" * (depth // 2)
    if draw(st.booleans()):
        closed = closed[: len(closed) // 2]
    return opened + inner + closed


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for key, sub in value.items():
            out += _paths(sub, (*path, key))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            out += _paths(sub, (*path, i))
    return out


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


@st.composite
def mutated(draw: st.DrawFn, valid: Any) -> bytes:
    """``valid`` (a JSON-like value) encoded, then mutated: fields replaced by hostile
    values, removed, or added; or bytes of the encoding flipped, cut or repeated."""
    value = valid
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(value)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        if action == "replace" or not path:
            value = _replace(value, path, draw(json_values))
        elif action == "drop":
            parent = _get(value, path[:-1])
            if isinstance(parent, dict):
                value = _replace(
                    value, path[:-1], {k: v for k, v in parent.items() if k != path[-1]}
                )
        else:
            parent = _get(value, path[:-1])
            if isinstance(parent, dict):
                extra = {**parent, draw(TEXT): draw(json_values)}
                value = _replace(value, path[:-1], extra)
    data = dumps(value)
    if draw(st.booleans()):
        return data
    rng = random.Random(draw(st.integers(0, 2**32)))
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        op = rng.choice(["flip", "cut", "dup", "insert"])
        at = rng.randrange(len(buf) + 1)
        if op == "flip" and at < len(buf):
            buf[at] = rng.randrange(256)
        elif op == "cut":
            del buf[at : at + rng.randrange(1, 16)]
        elif op == "dup":
            buf[at:at] = buf[at : at + rng.randrange(1, 64)] * rng.randrange(1, 50)
        else:
            buf[at:at] = rng.choice(RAW_TOKENS)
    return bytes(buf)


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


@st.composite
def tweaked(draw: st.DrawFn, valid: Any) -> bytes:
    """``valid`` with one leaf changed to another value of its own type (mostly still
    valid: the parser's accepting paths get fuzzed too)."""
    paths = [p for p in _paths(valid) if p and not isinstance(_get(valid, p), dict | list)]
    path = draw(st.sampled_from(paths))
    old = _get(valid, path)
    new: Any
    if isinstance(old, bool):
        new = draw(st.booleans())
    elif isinstance(old, int):
        new = draw(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 100))
    elif isinstance(old, float):
        new = draw(st.floats(allow_nan=False, allow_infinity=False))
    elif isinstance(old, str):
        new = draw(st.text(ANY_CHAR, max_size=20) | st.just(old + "x"))
    else:
        new = old
    return dumps(_replace(valid, path, new))


def hostile_payloads(valid: Any, max_depth: int = 200_000) -> st.SearchStrategy[bytes]:
    """Every kind of hostile payload, around ``valid``."""
    return st.one_of(
        st.just(dumps(valid)),
        tweaked(valid),
        tweaked(valid),
        mutated(valid),
        mutated(valid),
        json_values.map(dumps),
        deep(max_depth),
        st.binary(max_size=512),
        st.sampled_from(RAW_TOKENS),
        st.lists(st.sampled_from(RAW_TOKENS), min_size=1, max_size=6).map(b",".join),
    )


def holds(call: Callable[[], T], *allowed: type[BaseException]) -> T | None:
    """Run ``call``: its result, or None when it raised one of ``allowed`` with a message.
    Any other exception goes up and fails the property."""
    try:
        result = call()
    except allowed as exc:
        refused = exc
    else:
        event("valid")
        return result
    event(f"refused: {type(refused).__name__}")
    message = str(refused)
    assert message.strip(), f"{type(refused).__name__} without a message"
    assert len(message) <= MAX_MESSAGE, f"{type(refused).__name__} of {len(message)} characters"
    return None
