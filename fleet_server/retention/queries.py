"""The SQL of retention: which rows a :class:`~fleet_server.retention.plan.Step` may
delete, and one bounded batch of them (the same on SQLite and PostgreSQL).

A batch is ``DELETE FROM t WHERE (primary key) IN (SELECT primary key FROM t WHERE
<past the budget, not protected> ORDER BY <time> LIMIT n)``: the oldest ``n`` rows,
found through the time index, in one short transaction. Decisions are taken by key
first, and their images deleted with them in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from agent.wire.messages import EVENT_INSTALL
from fleet_server.db import tables as t
from fleet_server.retention.plan import DECISIONS, IMAGES, SESSIONS, TOKENS, Step

TIME_COLUMNS: dict[str, sa.Column[Any]] = {
    "heartbeats": t.heartbeats.c.ts,
    "telemetry": t.telemetry.c.ts,
    "events": t.events.c.ts,
    DECISIONS: t.decisions.c.ts,
    IMAGES: t.decision_images.c.ts,
    "shadow_results": t.shadow_results.c.ts,
    "drift_hours": t.drift_hours.c.hour,
    "quarantine": t.quarantine.c.received_at,
    "audit_log": t.audit_log.c.ts,
    "alerts": t.alerts.c.resolved_at,  # NULL while firing: never before a cutoff
    "device_actions": t.device_actions.c.requested_at,
    "action_chunks": t.action_chunks.c.received_at,
    SESSIONS: t.user_sessions.c.expires_at,
    TOKENS: t.enrollment_tokens.c.expires_at,
}
"""The time each pruned table is judged and ordered by (an index serves each)."""

KEY_CHUNK = 1000
"""Decision keys per ``IN`` list (bound parameters stay far below either database's limit)."""


def _table(name: str) -> sa.Table:
    return t.metadata.tables[name]


def _review_protects(device_id: Any, decision_id: Any, step: Step) -> sa.ColumnElement[bool]:
    """A review of that decision that keeps it: within the labelled budget, or of a model
    a running rollout's gates may count."""
    r = t.decision_reviews
    keep: list[sa.ColumnElement[bool]] = []
    if step.labelled_cutoff is None:
        keep.append(sa.true())
    else:
        keep.append(r.c.decision_ts >= step.labelled_cutoff)
    if step.keep_models:
        keep.append(r.c.model_name.in_(step.keep_models))
    return (
        sa.select(sa.literal(1))
        .where(r.c.device_id == device_id, r.c.decision_id == decision_id, sa.or_(*keep))
        .exists()
    )


def _drift_reference(step: Step) -> list[sa.ColumnElement[bool]]:
    d = t.drift_hours
    m = t.drift_hours.alias("first")
    s = t.drift_status
    same = [m.c.model_name == d.c.model_name, m.c.model_version == d.c.model_version,
            m.c.line == d.c.line]  # fmt: skip
    first = sa.select(sa.func.min(m.c.hour)).where(*same).scalar_subquery()
    pinned = (
        sa.select(sa.literal(1))
        .where(
            s.c.model_name == d.c.model_name,
            s.c.model_version == d.c.model_version,
            s.c.line == d.c.line,
            s.c.pin_start.is_not(None),
            s.c.pin_end.is_not(None),
            d.c.hour + 3600 > s.c.pin_start,
            d.c.hour < s.c.pin_end,
        )
        .exists()
    )
    return [d.c.hour >= first + step.drift_reference_s, ~pinned]


def past_budget(step: Step) -> list[sa.ColumnElement[bool]]:
    """The WHERE clauses of the rows ``step`` may delete."""
    table = step.table
    if table == SESSIONS:
        s = t.user_sessions.c
        return [sa.or_(s.expires_at < step.cutoff, s.last_seen < step.cutoff - step.idle_s)]
    if table == TOKENS:
        k = t.enrollment_tokens.c
        return [sa.or_(k.expires_at < step.cutoff, k.used_at < step.cutoff)]
    where: list[sa.ColumnElement[bool]] = [TIME_COLUMNS[table] < step.cutoff]
    if table == DECISIONS:
        d = t.decisions.c
        where.append(~_review_protects(d.device_id, d.id, step))
    elif table == IMAGES:
        i = t.decision_images.c
        where.append(~_review_protects(i.device_id, i.decision_id, step))
    elif table == "events" and step.install_floor is not None:
        e = t.events.c
        where.append(sa.or_(e.kind != EVENT_INSTALL, e.ts < step.install_floor))
    elif table == "drift_hours":
        where += _drift_reference(step)
    return where


def _candidates(step: Step, n: int) -> sa.Select[Any]:
    table = _table(step.table)
    return (
        sa.select(*table.primary_key.columns)
        .where(*past_budget(step))
        .order_by(TIME_COLUMNS[step.table])
        .limit(n)
    )


def count_past(conn: Connection, step: Step) -> int:
    """How many rows ``step`` would delete now."""
    query = sa.select(sa.func.count()).select_from(_table(step.table)).where(*past_budget(step))
    return int(conn.execute(query).scalar_one())


def delete_batch(conn: Connection, step: Step, n: int) -> dict[str, int]:
    """Delete at most ``n`` of the oldest rows ``step`` may delete, in the caller's
    transaction; returns the rows deleted per table (a decision's images count under
    ``decision_images``)."""
    if step.table == DECISIONS:
        return _delete_decisions(conn, step, n)
    table = _table(step.table)
    keys = sa.tuple_(*table.primary_key.columns)
    result = conn.execute(table.delete().where(keys.in_(_candidates(step, n))))
    return {step.table: max(0, int(result.rowcount))}


def _delete_decisions(conn: Connection, step: Step, n: int) -> dict[str, int]:
    keys = [(row[0], row[1]) for row in conn.execute(_candidates(step, n))]
    deleted = {DECISIONS: 0, IMAGES: 0}
    d, i = t.decisions, t.decision_images
    for chunk in _chunks(keys, KEY_CHUNK):
        images = sa.tuple_(i.c.device_id, i.c.decision_id).in_(chunk)
        deleted[IMAGES] += max(0, int(conn.execute(i.delete().where(images)).rowcount))
        rows = sa.tuple_(d.c.device_id, d.c.id).in_(chunk)
        deleted[DECISIONS] += max(0, int(conn.execute(d.delete().where(rows)).rowcount))
    return deleted


def _chunks(keys: Sequence[tuple[Any, Any]], size: int) -> list[list[tuple[Any, Any]]]:
    return [list(keys[i : i + size]) for i in range(0, len(keys), size)]


def nth_newest(conn: Connection, table: str, rows: int) -> float | None:
    """The time of ``table``'s ``rows``-th newest row (None: it holds fewer)."""
    column = TIME_COLUMNS[table]
    query = (
        sa.select(column)
        .where(column.is_not(None))  # a firing alert has no time yet: not counted
        .order_by(column.desc())
        .offset(rows - 1)
        .limit(1)
    )
    value = conn.execute(query).scalar()
    return None if value is None else float(value)
