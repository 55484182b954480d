"""The decision list: filtered, newest first, paginated by keyset on ``(ts, id)``.

A page is one statement with ``LIMIT``; there is no OFFSET, the next page starts after
the last row's ``(ts, id)``. The filter is split into disjoint :class:`Branch` es, each
reading one index in order and stopping after a page; several branches are merged by
``UNION ALL``. A branch *pins* the leading columns of its index (see
:func:`_branch_select` for why they are written as ranges and lead the ORDER BY), and
its other equality filters are written so that no index serves them
(:func:`unindexed`): the planner reads the pinned index whatever its statistics say.
So a single filter reads about one page of index entries at any depth.

Two filters name sets of devices: ``site`` (devices labelled with it) and the part of
``line`` that falls back to the device's label (rows written without a line; only the
labelled devices that have such rows count). A small set (up to
:data:`SPLIT_DEVICES`) becomes one branch per device, pinned to it; a larger one is
checked row by row while the branch's index (the time index when nothing else is
pinned) is read.

A part (``part_id``) has a handful of decisions: a filter naming one reads the part id
index alone, and checks every other filter (the device set too) row by row. ``station``
has no index; it is checked row by row while the branch's index is read.

Two filters are driven by a smaller table instead: only reviewed decisions read the
reviews (ordered by the review's copy of the decision time), and only disagreements
(``disagreement``: a candidate in the device's shadow slot decided otherwise) read the
disagreeing ``shadow_results`` rows, ordered by the comparison's time (``ts`` of the
shadow record, taken on the device right after the live decision) and the decision id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from fleet_server.db._tx import Bind, reading
from fleet_server.db.tables import (
    LINE_EXPRESSION,
    decision_reviews,
    decisions,
    devices,
    shadow_results,
)
from fleet_server.review.errors import BadQuery
from fleet_server.review.filters import Cursor, DecisionFilter, check_limit
from fleet_server.review.rows import DecisionSummary, Review, summarize

SPLIT_DEVICES = 32
"""A device set up to this size is read device by device (see the module docstring)."""

PROBE_BATCH = 500
"""Devices probed per statement for rows without a line."""

R = decision_reviews
S = shadow_results
REVIEW_COLUMNS = ("seq", "decided", "verdict", "outcome", "note", "reviewer", "reviewed_at")
_SELECTED = [
    decisions.c.id,
    decisions.c.ts,
    decisions.c.device_id,
    decisions.c.source,
    decisions.c.outcome,
    decisions.c.model_name,
    decisions.c.model_version,
    decisions.c.payload,
    decisions.c.station,
    decisions.c.part_id,
    decisions.c.deadline_missed,
    *(R.c[name].label(f"r_{name}") for name in REVIEW_COLUMNS),
]


@dataclass(frozen=True)
class Page:
    """One page of decisions, newest first; ``next_cursor`` is None on the last page."""

    rows: list[DecisionSummary]
    next_cursor: Cursor | None


def line_column(dialect: str) -> sa.ColumnElement[Any]:
    """The decision row's ``line``, spelt as the index ``ix_decisions_line_ts`` is.

    Raises:
        BadQuery: a database other than SQLite or PostgreSQL.
    """
    text = LINE_EXPRESSION.get(dialect)
    if text is None:
        raise BadQuery("database", f"decision review does not support '{dialect}'")
    return sa.literal_column(text)


def devices_labelled(conn: Connection, key: str, value: str) -> list[str]:
    """The ids of the devices whose label ``key`` is ``value``, sorted."""
    query = (
        sa.select(devices.c.device_id)
        .where(devices.c.labels[key].as_string() == value)
        .order_by(devices.c.device_id)
    )
    return [str(d) for d in conn.scalars(query)]


def device_labels(conn: Connection, device_ids: Iterable[str]) -> dict[str, dict[str, str]]:
    """The labels of these devices (a device not registered is left out)."""
    wanted = sorted(set(device_ids))
    if not wanted:
        return {}
    query = sa.select(devices.c.device_id, devices.c.labels).where(devices.c.device_id.in_(wanted))
    return {str(d): dict(labels or {}) for d, labels in conn.execute(query)}


Pin = tuple[sa.ColumnElement[Any], str]
"""A leading column of the index a branch reads, and the value it must have."""
PLAIN = (
    ("model_version", decisions.c.model_version),
    ("outcome", decisions.c.outcome),
    ("source", decisions.c.source),
)
"""Equality filters with an index of their own, in the order one is picked to drive a
branch (a model version clusters in time, so it goes first)."""


@dataclass(frozen=True)
class Branch:
    """One part of a filter: rows whose ``pins`` columns have their values (the leading
    columns of the index to read, in its order) and that meet ``conds``."""

    pins: tuple[Pin, ...]
    conds: tuple[sa.ColumnElement[bool], ...]


def unindexed(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """``column || ''``: the same value, but no index serves a condition on it, so the
    planner reads the index the branch pins and checks this row by row."""
    return column.op("||")(sa.literal_column("''"))


def _branches_for(
    pins: tuple[Pin, ...],
    plain: list[Pin],
    conds: list[sa.ColumnElement[bool]],
    ids: Sequence[str] | None,
) -> list[Branch]:
    """Branches for the devices ``ids`` (None: any device): one per device (pinned to
    it) when they are few, else one that checks the set row by row."""
    if ids is not None and len(ids) <= SPLIT_DEVICES:
        eq = [unindexed(column) == value for column, value in plain]
        return [Branch(((decisions.c.device_id, d), *pins), (*eq, *conds)) for d in ids]
    where = [*conds] if ids is None else [*conds, unindexed(decisions.c.device_id).in_(ids)]
    if not pins and plain:
        pins, plain = (plain[0],), plain[1:]
    eq = [unindexed(column) == value for column, value in plain]
    return [Branch(pins, (*eq, *where))]


def branches(conn: Connection, f: DecisionFilter) -> list[Branch]:
    """The filter as disjoint branches; ``[]`` when nothing can match."""
    plain: list[Pin] = [(c, getattr(f, n)) for n, c in PLAIN if getattr(f, n) is not None]
    conds: list[sa.ColumnElement[bool]] = []
    if f.since is not None:
        conds.append(decisions.c.ts >= f.since)
    if f.until is not None:
        conds.append(decisions.c.ts < f.until)
    if f.station is not None:
        conds.append(decisions.c.station == f.station)
    ids: list[str] | None = None
    if f.device is not None:
        ids = [f.device]
    if f.site is not None:
        in_site = devices_labelled(conn, "site", f.site)
        ids = in_site if ids is None else [d for d in ids if d in set(in_site)]
    if ids is not None and not ids:
        return []
    if f.part_id is not None:
        return _part_branches(conn, f.part_id, f.line, plain, conds, ids)
    if f.line is None:
        return _branches_for((), plain, conds, ids)
    line = line_column(conn.dialect.name)
    written = _branches_for(((line, f.line),), plain, conds, ids)
    labelled = devices_labelled(conn, "line", f.line)
    if ids is not None:
        labelled = [d for d in labelled if d in set(ids)]
    unlined = _writing_no_line(conn, labelled, line)
    if not unlined:
        return written
    return written + _branches_for(((line, ""),), plain, conds, unlined)


def _part_branches(
    conn: Connection,
    part_id: str,
    line_value: str | None,
    plain: list[Pin],
    conds: list[sa.ColumnElement[bool]],
    ids: Sequence[str] | None,
) -> list[Branch]:
    """The branches of a filter naming a part: each pinned to the part id index (a few
    rows), every other filter checked row by row; with ``line``, one branch for rows
    that name it and one for rows without a line of the devices labelled with it."""
    pins: tuple[Pin, ...] = ((decisions.c.part_id, part_id),)
    where = [*(unindexed(column) == value for column, value in plain), *conds]
    if ids is not None:
        where.append(unindexed(decisions.c.device_id).in_(ids))
    if line_value is None:
        return [Branch(pins, tuple(where))]
    line = line_column(conn.dialect.name)
    written = Branch(pins, (*where, unindexed(line) == line_value))
    labelled = devices_labelled(conn, "line", line_value)
    if ids is not None:
        labelled = [d for d in labelled if d in set(ids)]
    unlined = _writing_no_line(conn, labelled, line)
    if not unlined:
        return [written]
    fallback = (unindexed(line) == "", unindexed(decisions.c.device_id).in_(unlined))
    return [written, Branch(pins, (*where, *fallback))]


def _writing_no_line(
    conn: Connection, device_ids: Sequence[str], line: sa.ColumnElement[Any]
) -> list[str]:
    """Those of ``device_ids`` that have decisions without a line (one probe of the
    device-and-line index each): the others need no fallback branch."""
    if not device_ids:
        return []
    found: list[str] = []
    for start in range(0, len(device_ids), PROBE_BATCH):
        probe = sa.select(devices.c.device_id).where(
            devices.c.device_id.in_(device_ids[start : start + PROBE_BATCH]),
            sa.exists().where(decisions.c.device_id == devices.c.device_id, line == ""),
        )
        found += [str(d) for d in conn.scalars(probe)]
    return sorted(found)


D = (
    sa.select(S.c.device_id, S.c.decision_id, S.c.ts)
    .where(S.c.agree == sa.false())
    .subquery("disagreements")
)
"""The disagreeing shadow records, only the columns the list needs (a subquery: the
line's expression names ``payload`` unqualified, which shadow_results has too)."""


def _order(f: DecisionFilter) -> tuple[sa.ColumnElement[Any], sa.ColumnElement[Any]]:
    """The columns the page is ordered by: the disagreeing shadow record's time and id
    when only disagreements are listed, the review's copy of the decision's when only
    reviewed decisions are (so the few rows of those drive the reading, not a million
    decisions), else the decision's own."""
    if f.disagreement:
        return D.c.ts, D.c.decision_id
    if f.reviewed:
        return R.c.decision_ts, R.c.decision_id
    return decisions.c.ts, decisions.c.id


_REVIEW_OF = sa.and_(R.c.device_id == decisions.c.device_id, R.c.decision_id == decisions.c.id)
"""A review belongs to the decision of the same device and id."""
_DISAGREEMENT_OF = sa.and_(
    D.c.device_id == decisions.c.device_id, D.c.decision_id == decisions.c.id
)
"""A shadow record belongs to the live decision of the same device and id."""


def _source(f: DecisionFilter) -> sa.FromClause:
    if f.disagreement:
        base = D.join(decisions, _DISAGREEMENT_OF)
        return base.join(R, _REVIEW_OF) if f.reviewed else base.outerjoin(R, _REVIEW_OF)
    if f.reviewed:
        return R.join(decisions, _REVIEW_OF)
    return decisions.outerjoin(R, _REVIEW_OF)


def _branch_select(
    branch: Branch,
    f: DecisionFilter,
    common: list[sa.ColumnElement[bool]],
    limit: int,
) -> sa.Select[Any]:
    """One branch's rows. Its pins are written ``col >= v AND col <= v`` and lead the
    ORDER BY: a planner takes ``col = v`` for a constant and drops it from the order,
    and may then read the time index and filter, which takes long when the value's
    rows are old (a replaced model version); ordered by the pins, only the index that
    starts with them gives the order, so that is the one read."""
    ts, did = _order(f)
    driven = bool(f.reviewed or f.disagreement)
    where = [*branch.conds, *common]
    order: list[sa.ColumnElement[Any]] = []
    for column, value in branch.pins:
        if driven:  # the reviews or the shadow records drive: the pins are plain filters
            where.append(column == value)
        else:
            where += [column >= value, column <= value]
            order.append(column.desc())
    return (
        sa.select(*_SELECTED, ts.label("sort_ts"), did.label("sort_id"))
        .select_from(_source(f))
        .where(*where)
        .order_by(*order, ts.desc(), did.desc())
        .limit(limit)
    )


def page_query(
    conn: Connection, f: DecisionFilter, after: Cursor | None, limit: int
) -> sa.Select[Any] | None:
    """The statement of one page (``limit`` rows at most, ordered by ``sort_ts`` and
    ``sort_id`` descending), or None when the filter can't match anything."""
    parts = branches(conn, f)
    if not parts:
        return None
    ts, did = _order(f)
    common: list[sa.ColumnElement[bool]] = []
    if f.reviewed is False:
        common.append(R.c.decision_id.is_(None))
    if f.disagreement is False:
        common.append(
            ~sa.exists().where(
                S.c.device_id == decisions.c.device_id,
                S.c.decision_id == decisions.c.id,
                S.c.agree == sa.false(),
            )
        )
    if after is not None:
        common += [ts <= after.ts, sa.or_(ts < after.ts, did < after.id)]
    selects = [_branch_select(b, f, common, limit) for b in parts]
    if len(selects) == 1:
        return selects[0]
    merged = sa.union_all(*(sa.select(s.subquery()) for s in selects)).subquery()
    return sa.select(merged).order_by(merged.c.sort_ts.desc(), merged.c.sort_id.desc()).limit(limit)


def review_of(row: Mapping[Any, Any]) -> Review | None:
    """The review columns (``r_*``) of a selected row, or None when it has none."""
    if row["r_seq"] is None:
        return None
    return Review(**{name: row[f"r_{name}"] for name in REVIEW_COLUMNS})


def summaries(conn: Connection, rows: Sequence[Mapping[Any, Any]]) -> list[DecisionSummary]:
    """The list rows of selected rows, with their devices' labels."""
    labels = device_labels(conn, (r["device_id"] for r in rows))
    return [summarize(r, labels.get(r["device_id"], {}), review_of(r)) for r in rows]


def list_decisions(
    bind: Bind, f: DecisionFilter, *, after: Cursor | None = None, limit: int = 50
) -> Page:
    """One page of the decisions matching ``f``, newest first, after the cursor.

    Raises:
        BadQuery: ``limit`` is not within 1..MAX_LIMIT.
    """
    check_limit(limit)
    with reading(bind) as conn:
        query = page_query(conn, f, after, limit + 1)
        if query is None:
            return Page([], None)
        rows = [r._mapping for r in conn.execute(query)]
        more = len(rows) > limit
        rows = rows[:limit]
        out = summaries(conn, rows)
    last = rows[-1] if more else None
    return Page(out, Cursor(last["sort_ts"], last["sort_id"]) if last is not None else None)
