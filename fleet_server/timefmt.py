"""Times as people read them, from whatever a device's clock said (pure, never raises).

Stored times (``last_seen``, a heartbeat's or a decision's ``ts``) come from device
clocks: they may be 1e300, negative, NaN, infinite, past the year 9999 or not a number
at all. Every view that shows a stored time goes through here, so one absurd row shows
as ``invalid time (1e+300)`` instead of failing the page, the export or the command
that lists it.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone, tzinfo

INVALID = "invalid time"
MISSING = "—"
_MAX_SHOWN = 40
"""At most this many characters of an invalid value are shown."""


def seconds(ts: object) -> float | None:
    """``ts`` as a finite float, or None when it is not a finite number."""
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        return None
    try:
        value = float(ts)
    except OverflowError:  # an int beyond a double
        return None
    return value if math.isfinite(value) else None


def invalid(ts: object) -> str:
    """``invalid time (<value>)``, the value shortened to a few dozen characters."""
    try:
        text = repr(ts)
    except Exception:  # noqa: BLE001 (a foreign __repr__ may raise anything)
        text = "?"
    if len(text) > _MAX_SHOWN:
        text = text[: _MAX_SHOWN - 1] + "…"
    return f"{INVALID} ({text})"


def epoch(ts: object) -> float | None:
    """``ts`` as a float when it is an instant a datetime holds (years 1 to 9999 UTC),
    else None."""
    value = seconds(ts)
    return value if value is not None and as_datetime(value) is not None else None


def as_datetime(ts: object, tz: tzinfo | None = timezone.utc) -> datetime | None:
    """``ts`` (seconds since the epoch) as an aware datetime in ``tz`` (None: the local
    zone), or None when it is not a time a datetime holds (years 1 to 9999)."""
    value = seconds(ts)
    if value is None:
        return None
    try:
        return datetime.fromtimestamp(value, tz if tz is not None else timezone.utc).astimezone(tz)
    except (OverflowError, OSError, ValueError):
        return None


def stamp(
    ts: object, fmt: str = "%Y-%m-%dT%H:%M:%SZ", *, tz: tzinfo | None = timezone.utc,
    missing: str = MISSING,
) -> str:  # fmt: skip
    """``ts`` formatted with ``fmt`` in ``tz`` (None: local time); ``missing`` for None,
    :func:`invalid` text for a value that is not a time."""
    if ts is None:
        return missing
    when = as_datetime(ts, tz)
    if when is None:
        return invalid(ts)
    try:
        return when.strftime(fmt)
    except (ValueError, OverflowError):
        return invalid(ts)


def iso(ts: object, *, missing: str = MISSING, ms: bool = False) -> str:
    """``2026-11-24T05:03:41Z`` (``.123`` milliseconds with ``ms``) in UTC, ``missing``
    for None, :func:`invalid` text for a value that is not a time."""
    if ts is None:
        return missing
    when = as_datetime(ts)
    if when is None:
        return invalid(ts)
    spec = "milliseconds" if ms else "seconds"
    return when.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def duration(span: object) -> str:
    """``42 s``, ``7 min``, ``3 h``, ``2 d`` (negative shows as 0 s); ``?`` when
    ``span`` (seconds) is not a finite number."""
    value = seconds(span)
    if value is None:
        return "?"
    s = max(0.0, value)
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 36 * 3600:
        return f"{s / 3600:.0f} h"
    days = s / 86400
    if days >= 1e6:
        return f"{days:.3g} d"
    return f"{days:.0f} d"


def ago(ts: object, now: float) -> str:
    """How long before ``now`` ``ts`` was (``7 min``), ``in the future (…)`` for a time
    more than a minute ahead, ``missing`` for None, or :func:`invalid` text."""
    if ts is None:
        return MISSING
    value = epoch(ts)
    if value is None:
        return invalid(ts)
    diff = now - value
    if diff < -60:
        return f"in the future ({iso(value)})"
    return duration(diff)
