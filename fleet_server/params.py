"""Numeric request parameters, bounded in one place (pure).

Every number a caller puts in a query string, of the API or of the console, goes through
here: a count (``limit``), a cursor in a feed (``since`` of the labels), a Unix time, a
ratio. An endpoint declares its numeric query parameters with :func:`whole` or
:func:`number`, which always carry both bounds (and refuse NaN and infinities), so a
value beyond them (``since=2**70``, ``1e999``) is a 400 naming the parameter before any
code or database sees it; a number read out of a string (a time written as Unix
seconds, a number inside a page cursor) goes through :func:`check`.
A test walks every route of the server and fails on a numeric query parameter declared
without them.
"""

from __future__ import annotations

import math
from typing import Any

MAX_INT = 2**63 - 1
"""The largest whole number a database column holds (BIGINT; SQLite's INTEGER): a
counter or cursor beyond it can't be stored, so it can't be asked for either."""
MIN_TIME_S = 0.0
MAX_TIME_S = 253_402_300_799.0
"""Unix times a query may name: 1970-01-01 to 9999-12-31T23:59:59Z (what a datetime holds)."""


class ParamError(ValueError):
    """A numeric parameter that is not a number within its bounds.

    Attributes:
        param: the parameter's name.
        reason: what is wrong, in a few words.
    """

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f"{param}: {reason}")
        self.param = param
        self.reason = reason


def _bound(x: float) -> str:
    """A bound as people write it: ``0``, ``253402300799``, ``0.9999``, ``1.8e+308``."""
    return f"{x:.0f}" if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def check(param: str, value: object, lo: float, hi: float) -> float:
    """``value`` (already a number: parsed from a string or a cursor) as a float, when it
    is finite and in [``lo``, ``hi``].

    Raises:
        ParamError: not a number, not finite, or out of bounds (an integer too large for
            a float included), naming ``param``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParamError(param, f"{_shown(value)} is not a number")
    if isinstance(value, int) and not lo <= value <= hi:  # exact, before any float
        raise ParamError(param, f"{_shown(value)} is not within {_bound(lo)}..{_bound(hi)}")
    number = float(value)
    if not math.isfinite(number):
        raise ParamError(param, f"{_shown(value)} is not a finite number")
    if not lo <= number <= hi:
        raise ParamError(param, f"{_shown(value)} is not within {_bound(lo)}..{_bound(hi)}")
    return number


def whole(description: str, *, ge: int, le: int, alias: str | None = None) -> Any:
    """A whole-number query parameter in [``ge``, ``le``] (``le`` at most :data:`MAX_INT`):
    ``Annotated[int, whole("Rows", ge=1, le=500)]``."""
    if not -MAX_INT - 1 <= ge <= le <= MAX_INT:
        raise ValueError(f"bounds {ge}..{le} are not within a database integer")
    from fastapi import Query  # noqa: PLC0415 - the API's routes only: fleetctl stays light

    return Query(ge=ge, le=le, alias=alias, description=f"{description.rstrip('.')} ({ge}..{le}).")


def number(description: str, *, ge: float, le: float, alias: str | None = None) -> Any:
    """A finite number query parameter in [``ge``, ``le``] (NaN and infinities refused):
    ``Annotated[float, number("Confidence", ge=0.5, le=0.9999)]``."""
    if not (math.isfinite(ge) and math.isfinite(le) and ge <= le):
        raise ValueError(f"bounds {ge}..{le} are not finite")
    text = f"{description.rstrip('.')} ({_bound(ge)}..{_bound(le)})."
    from fastapi import Query  # noqa: PLC0415 - the API's routes only: fleetctl stays light

    return Query(ge=ge, le=le, allow_inf_nan=False, alias=alias, description=text)


def unix_time(description: str, alias: str | None = None) -> Any:
    """A Unix time query parameter (seconds) within :data:`MIN_TIME_S`..:data:`MAX_TIME_S`."""
    return number(description, ge=MIN_TIME_S, le=MAX_TIME_S, alias=alias)
