"""What a decision list asks for: filters, a keyset cursor and a page size; pure
parsing and checking, no database.

Every text a caller gives is checked here, and a bad one is a :class:`BadQuery` naming
the query parameter, so the HTTP layer can answer 400 with that name.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from fleet_server import params
from fleet_server.review.errors import BadQuery

TEXT_FILTERS = (
    "site", "line", "device", "source", "outcome", "model_version", "station", "part_id",
)  # fmt: skip
"""Filters that match one text value exactly."""
FILTER_PARAMS = (*TEXT_FILTERS, "since", "until", "reviewed", "disagreement")
MAX_TEXT = 200
"""The longest filter value taken."""
MAX_LIMIT = 500
"""The most rows one page holds."""
DEFAULT_LIMIT = 50
_YES = frozenset({"yes", "true", "1"})
_NO = frozenset({"no", "false", "0"})
_CURSOR_VERSION = 1


@dataclass(frozen=True)
class DecisionFilter:
    """Which decisions a list or an export shows; ``None`` leaves a field open.

    Attributes:
        site: the ``site`` label of the deciding device.
        line: the decision's line: the line the device wrote into the row, or, for rows
            written without one, the device's ``line`` label.
        device: the device id.
        source: the camera or sensor.
        outcome: the outcome the device decided.
        model_version: the version of the (first) model that decided.
        station: the station whose PLC trigger the decision answers.
        part_id: the part id the PLC passed with the trigger (exact match).
        since: decision time at or after (Unix seconds).
        until: decision time before (Unix seconds).
        reviewed: only reviewed (True) or only unreviewed (False) decisions.
        disagreement: only decisions a candidate in the device's shadow slot decided
            otherwise (True: a ``shadow_results`` row of the same device and decision
            with ``agree`` false), or only the others (False).
    """

    site: str | None = None
    line: str | None = None
    device: str | None = None
    source: str | None = None
    outcome: str | None = None
    model_version: str | None = None
    station: str | None = None
    part_id: str | None = None
    since: float | None = None
    until: float | None = None
    reviewed: bool | None = None
    disagreement: bool | None = None


@dataclass(frozen=True)
class Cursor:
    """Where a page ends: the last row's decision time and id (rows come ordered by
    ``(ts, id)`` descending; the next page starts strictly after this one)."""

    ts: float
    id: str


def check_text(param: str, value: str) -> str:
    """``value`` as a filter or label value: 1-200 characters, no control characters.

    Raises:
        BadQuery: it is empty, too long or holds a control character.
    """
    if not value:
        raise BadQuery(param, "must not be empty (leave the parameter out to match any)")
    if len(value) > MAX_TEXT:
        raise BadQuery(param, f"longer than {MAX_TEXT} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise BadQuery(param, "holds a control character")
    return value


def parse_time(param: str, value: str) -> float:
    """A time given as Unix seconds (``1735689600.5``) or ISO 8601 with a zone
    (``2025-01-01T00:00:00Z``, ``2025-01-01T01:00:00+01:00``).

    Raises:
        BadQuery: neither, a time without a zone, or not finite.
    """
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return _in_time_range(param, seconds)
    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        parsed = datetime.fromisoformat(iso)
    except ValueError:
        raise BadQuery(param, f"{value!r} is neither Unix seconds nor an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise BadQuery(param, f"{value!r} has no time zone (add Z or an offset like +01:00)")
    try:
        return _in_time_range(param, parsed.timestamp())
    except OverflowError:  # an aware time past year 9999 in UTC
        raise BadQuery(param, f"{value!r} is not within the years 1970..9999") from None


def _in_time_range(param: str, seconds: float) -> float:
    """``seconds`` when it is a Unix time a query may name (fleet_server.params)."""
    try:
        return params.check(param, seconds, params.MIN_TIME_S, params.MAX_TIME_S)
    except params.ParamError as exc:
        raise BadQuery(param, f"{exc.reason} (Unix seconds, years 1970..9999)") from None


def parse_yes_no(value: str, param: str = "reviewed") -> bool:
    """``yes``/``true``/``1`` or ``no``/``false``/``0``.

    Raises:
        BadQuery: anything else (naming ``param``).
    """
    word = value.strip().lower()
    if word in _YES:
        return True
    if word in _NO:
        return False
    raise BadQuery(param, f"{value!r} is not yes or no")


def parse_reviewed(value: str) -> bool:
    """``yes``/``true``/``1`` or ``no``/``false``/``0``.

    Raises:
        BadQuery: anything else.
    """
    return parse_yes_no(value, "reviewed")


def parse_filter(params: Mapping[str, str | None]) -> DecisionFilter:
    """The filter of query parameters named as in :data:`FILTER_PARAMS` (others are
    not looked at; ``None`` or absent: no filter on that field).

    Raises:
        BadQuery: a value is malformed, or ``since`` is not before ``until``.
    """
    texts = {
        name: check_text(name, value)
        for name in TEXT_FILTERS
        if (value := params.get(name)) is not None
    }
    since_text, until_text = params.get("since"), params.get("until")
    since = None if since_text is None else parse_time("since", since_text)
    until = None if until_text is None else parse_time("until", until_text)
    if since is not None and until is not None and since >= until:
        raise BadQuery("until", f"{until_text!r} is not after since ({since_text!r})")
    reviewed_text = params.get("reviewed")
    reviewed = None if reviewed_text is None else parse_reviewed(reviewed_text)
    disagreement_text = params.get("disagreement")
    disagreement = (
        None if disagreement_text is None else parse_yes_no(disagreement_text, "disagreement")
    )
    return DecisionFilter(
        **texts, since=since, until=until, reviewed=reviewed, disagreement=disagreement
    )


def check_limit(limit: int) -> int:
    """``limit`` if it is within 1..:data:`MAX_LIMIT`.

    Raises:
        BadQuery: it is not.
    """
    if not 1 <= limit <= MAX_LIMIT:
        raise BadQuery("limit", f"{limit} is not within 1..{MAX_LIMIT}")
    return limit


def encode_cursor(cursor: Cursor) -> str:
    """The opaque text form of ``cursor`` (URL-safe, no padding)."""
    raw = json.dumps([_CURSOR_VERSION, cursor.ts, cursor.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(text: str) -> Cursor:
    """The cursor a previous page answered as ``next_cursor``.

    Raises:
        BadQuery: ``text`` is not such a cursor.
    """
    if not text or len(text) > 512:
        raise BadQuery("cursor", "not a cursor from a previous page's next_cursor")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        version, ts, decision_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        raise BadQuery("cursor", "not a cursor from a previous page's next_cursor") from None
    try:  # a stored decision's time: any double a device clock gave, nothing beyond
        at = params.check("cursor", ts, -sys.float_info.max, sys.float_info.max)
    except params.ParamError:
        at = None
    valid = (
        version == _CURSOR_VERSION
        and at is not None
        and isinstance(decision_id, str)
        and 0 < len(decision_id) <= MAX_TEXT
    )
    if at is None or not valid:
        raise BadQuery("cursor", "not a cursor from a previous page's next_cursor")
    return Cursor(at, decision_id)
