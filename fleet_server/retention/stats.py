"""``fleetctl db stats``: per table its rows, size, oldest and newest time, budget, and
how many rows are past the budget now.

Size: PostgreSQL's ``pg_total_relation_size`` (table, indexes, TOAST); SQLite's
``dbstat`` table (the table's and its indexes' pages) when the library has it, else
None ("n/a").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from fleet_server.db import tables as t
from fleet_server.db._tx import reading
from fleet_server.retention import queries
from fleet_server.retention.config import RetentionSection
from fleet_server.retention.plan import BUDGETED, SESSIONS, TOKENS, Step, plan
from fleet_server.retention.prune import gather_facts


@dataclass(frozen=True)
class TableStats:
    """One table's figures (times are Unix s of ``time_column``)."""

    table: str
    rows: int
    size_bytes: int | None
    time_column: str | None
    oldest: float | None
    newest: float | None
    budget: str
    past_budget: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(vars(self))


def _size(conn: Connection, table: str) -> int | None:
    if conn.dialect.name == "postgresql":
        size = conn.execute(sa.text("SELECT pg_total_relation_size(:t)"), {"t": table}).scalar()
        return None if size is None else int(size)
    names = [table, *(ix.name for ix in t.metadata.tables[table].indexes if ix.name)]
    try:
        total = 0
        for name in names:
            query = sa.text("SELECT sum(pgsize) FROM dbstat WHERE name = :n AND aggregate = TRUE")
            total += int(conn.execute(query, {"n": name}).scalar() or 0)
    except OperationalError:  # no dbstat in this SQLite build
        conn.rollback()
        return None
    return total


def _budget(section: RetentionSection, table: str) -> str:
    if table == SESSIONS:
        return f"expired + {section.expired.sessions_after_days:g}d"
    if table == TOKENS:
        return f"used or expired + {section.expired.tokens_after_days:g}d"
    name = BUDGETED.get(table)
    if name is None:
        return "-"
    budget = getattr(section, name)
    parts = []
    if budget.max_age_days is not None:
        parts.append(f"{budget.max_age_days:g}d")
    if budget.max_rows is not None:
        parts.append(f"{budget.max_rows:,} rows")
    if table == "decisions" and section.decisions.labelled_days is not None:
        parts.append(f"reviewed {section.decisions.labelled_days:g}d")
    return " / ".join(parts) or "kept"


def table_stats(
    engine: Engine,
    section: RetentionSection,
    *,
    now: float | None = None,
    drift_reference_s: float = 24 * 3600.0,
    session_idle_s: float = 1800.0,
) -> list[TableStats]:
    """Every table of the schema, by name (see the module docstring).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database can't be read.
    """
    at = time.time() if now is None else now
    facts = gather_facts(
        engine, section, at, drift_reference_s=drift_reference_s, session_idle_s=session_idle_s
    )
    steps: dict[str, Step] = {s.table: s for s in plan(section, facts)}
    out = []
    with reading(engine) as conn:
        for name in sorted(t.metadata.tables):
            table = t.metadata.tables[name]
            column = queries.TIME_COLUMNS.get(name)
            oldest = newest = None
            if column is not None:
                row = conn.execute(sa.select(sa.func.min(column), sa.func.max(column))).one()
                oldest, newest = row[0], row[1]
            rows = int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())
            step = steps.get(name)
            past = queries.count_past(conn, step) if step is not None else None
            out.append(
                TableStats(
                    table=name,
                    rows=rows,
                    size_bytes=_size(conn, name),
                    time_column=None if column is None else column.name,
                    oldest=None if oldest is None else float(oldest),
                    newest=None if newest is None else float(newest),
                    budget=_budget(section, name),
                    past_budget=past,
                )
            )
    return out
