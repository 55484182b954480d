"""Daily time ranges ("06:00-14:00") and whether an instant falls in one (pure).

Ranges are local wall-clock times in a named IANA time zone (a factory's shifts follow its
clock, daylight saving included). The start is inside the range, the end is not; a start
after the end wraps past midnight ("22:00-06:00"); "24:00" is allowed as an end.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_RANGE = re.compile(r"^(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})$")
DAY_MIN = 24 * 60


def parse_range(text: str) -> tuple[int, int]:
    """``"HH:MM-HH:MM"`` as (start, end) minutes after midnight; ValueError if malformed."""
    m = _RANGE.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a daily time range 'HH:MM-HH:MM' (e.g. '06:00-14:00')")
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if h1 > 23 or m1 > 59 or m2 > 59 or end > DAY_MIN:
        raise ValueError(f"{text!r}: hours 00-23 (24:00 only as an end), minutes 00-59")
    if start == end:
        raise ValueError(f"{text!r} is empty (start equals end); use '00:00-24:00' for all day")
    return start, end


def format_range(start: int, end: int) -> str:
    """The canonical text of a range: ``"06:00-14:00"``."""
    return f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"


def check_zone(name: str) -> str:
    """``name`` if it is a known IANA time zone, else ValueError."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(
            f"{name!r} is not a known time zone (e.g. 'UTC', 'Europe/Berlin')"
        ) from exc
    return name


def minute_of_day(now: float, zone: str) -> int:
    """Minutes after local midnight in ``zone`` at the POSIX time ``now``."""
    local = datetime.fromtimestamp(now, ZoneInfo(zone))
    return local.hour * 60 + local.minute


def in_ranges(ranges: Iterable[str], now: float, zone: str) -> bool:
    """Whether ``now`` falls in any of the daily ``ranges`` (local time in ``zone``)."""
    parsed = [parse_range(r) for r in ranges]
    if not parsed:
        return False
    minute = minute_of_day(now, zone)
    for start, end in parsed:
        if start < end:
            if start <= minute < end:
                return True
        elif minute >= start or minute < end:
            return True
    return False
