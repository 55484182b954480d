"""Adding in-memory drift counts to the decision log's ``drift_hours`` rows.

A row holds totals: :func:`merge_into` reads the row of each key, adds the new counts
and writes the sum back with ``uploaded = 0`` (changed since its last upload; the uplink
sends it again once its bucket is over, and the fleet keeps the newer total). All keys in
one transaction on the caller's connection (the decision log writer's).

The bucket length is kept in the row's ``hist`` JSON under :data:`PERIOD_KEY` (the table
has no column for it); a bucket start that is a multiple of two periods (after a changed
``[drift] period_s``) keeps the period of its first counts.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Mapping
from typing import Any

from agent.decisionlog.connection import transaction
from agent.decisionlog.schema import DRIFT_COLUMNS, DRIFT_TABLE, NOT_UPLOADED
from agent.drift.accumulator import HourCounts, Key
from agent.wire.quality import HOUR_S

log = logging.getLogger(__name__)

PERIOD_KEY = "_period_s"
"""Where a row's bucket length is kept in its ``hist`` JSON."""

_SELECT = (
    f"SELECT n, outcomes, top_class, hist FROM {DRIFT_TABLE} "  # noqa: S608 - fixed names
    "WHERE model_name = ? AND model_version = ? AND line = ? AND source = ? AND hour = ?"
)
_UPSERT = (
    f"INSERT OR REPLACE INTO {DRIFT_TABLE} ({', '.join(DRIFT_COLUMNS)}) "  # noqa: S608
    f"VALUES ({', '.join('?' for _ in DRIFT_COLUMNS)})"
)


def to_columns(counts: HourCounts, period_s: int) -> tuple[int, str, str, str]:
    """(n, outcomes, top_class, hist) as the row stores them (JSON texts)."""
    hist: dict[str, Any] = dict(counts.hist)
    hist[PERIOD_KEY] = period_s
    return (
        counts.n,
        json.dumps(counts.outcomes, separators=(",", ":"), sort_keys=True),
        json.dumps(counts.top_class, separators=(",", ":"), sort_keys=True),
        json.dumps(hist, separators=(",", ":"), sort_keys=True),
    )


def from_columns(n: int, outcomes: str, top_class: str, hist: str) -> tuple[HourCounts, int]:
    """A stored row's counts and its bucket length.

    Raises:
        ValueError: a column is not the JSON object of counts it should be.
    """
    out = _counts(outcomes, "outcomes")
    top = _counts(top_class, "top_class")
    raw = json.loads(hist)
    if not isinstance(raw, dict):
        raise ValueError("hist is not a JSON object")  # noqa: TRY004 - bad data, not a bug
    period = raw.pop(PERIOD_KEY, HOUR_S)
    if isinstance(period, bool) or not isinstance(period, int):
        raise ValueError(f"hist.{PERIOD_KEY} is {period!r}, not seconds")  # noqa: TRY004
    histograms: dict[str, list[int]] = {}
    for name, counts in raw.items():
        if not isinstance(counts, list) or not all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in counts
        ):
            raise ValueError(f"hist.{name} is not a list of counts")
        histograms[name] = counts
    return HourCounts(int(n), out, top, histograms), period


def _counts(text: str, what: str) -> dict[str, int]:
    raw = json.loads(text)
    if not isinstance(raw, dict) or not all(
        isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in raw.values()
    ):
        raise ValueError(f"{what} is not a JSON object of counts")
    return {str(key): int(value) for key, value in raw.items()}


def merge_into(
    conn: sqlite3.Connection, rows: Mapping[Key, HourCounts], period_s: int, now: float
) -> int:
    """Add ``rows`` to their drift_hours rows in one transaction; how many rows changed.

    A stored row that can't be read (not this schema's JSON) is replaced by the new
    counts.

    Raises:
        sqlite3.Error: the database can't be read or written (nothing was changed).
    """
    if not rows:
        return 0
    with transaction(conn):
        for key, counts in rows.items():
            total, period = HourCounts(), period_s
            found = conn.execute(_SELECT, key).fetchone()
            if found is not None:
                try:
                    total, period = from_columns(*found)
                except (ValueError, TypeError) as e:
                    log.error("drift row %s unreadable (%s); counting it again", key, e)  # noqa: TRY400
                    total, period = HourCounts(), period_s
            try:
                total.merge(counts)
            except ValueError:  # bins of another length: the new counts start again
                total = counts
            conn.execute(_UPSERT, (*key, *to_columns(total, period), now, NOT_UPLOADED))
    return len(rows)
