"""A review queue: the decisions of a filter still to review, and where one stands in it.

A line manager reviews a filter's decisions one after the other ("save and next"): the
next one is the next older unreviewed decision of the same filter (the list's order),
or, past the oldest, the newest one still unreviewed; "how many left" counts the filter's
unreviewed decisions up to :data:`MAX_COUNTED` (a queue longer than that says so rather
than reads a million rows).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sqlalchemy as sa

from fleet_server.db._tx import Bind, reading
from fleet_server.review.filters import Cursor, DecisionFilter
from fleet_server.review.query import list_decisions, page_query
from fleet_server.review.rows import DecisionSummary

MAX_COUNTED = 1000
"""Unreviewed decisions counted at most."""


@dataclass(frozen=True)
class QueuePlace:
    """Where a decision stands in its filter's review queue.

    Attributes:
        next: the next decision to review (None: nothing else is left).
        left: unreviewed decisions in the filter (this one included while unreviewed),
            at most :data:`MAX_COUNTED`.
        more: there are more than :data:`MAX_COUNTED`.
    """

    next: DecisionSummary | None
    left: int
    more: bool


def unreviewed(f: DecisionFilter) -> DecisionFilter:
    """``f`` narrowed to the decisions nobody reviewed yet."""
    return dataclasses.replace(f, reviewed=False)


def count_unreviewed(bind: Bind, f: DecisionFilter) -> tuple[int, bool]:
    """``(n, more)``: the filter's unreviewed decisions, counted up to
    :data:`MAX_COUNTED` (``more``: there are more)."""
    with reading(bind) as conn:
        query = page_query(conn, unreviewed(f), None, MAX_COUNTED + 1)
        if query is None:
            return 0, False
        n = int(conn.execute(sa.select(sa.func.count()).select_from(query.subquery())).scalar_one())
    return min(n, MAX_COUNTED), n > MAX_COUNTED


def place(bind: Bind, f: DecisionFilter, current: DecisionSummary) -> QueuePlace:
    """The decision to review after ``current`` in ``f``'s queue, and how many are left."""
    todo = unreviewed(f)
    older = list_decisions(bind, todo, after=Cursor(current.ts, current.id), limit=1).rows
    following = older[0] if older else None
    if following is None:  # past the oldest: the newest still to review, if not this one
        newest = list_decisions(bind, todo, limit=2).rows
        following = next(
            (r for r in newest if (r.device_id, r.id) != (current.device_id, current.id)), None
        )
    left, more = count_unreviewed(bind, f)
    return QueuePlace(following, left, more)
