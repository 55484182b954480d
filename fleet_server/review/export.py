"""CSV export of a filtered decision list, streamed page by page (bounded memory), with
the review columns.

The export walks the same keyset pages as the list, so it sees what the list shows.
Before the first byte it checks that at most ``max_rows`` decisions match (an export
never ends early without saying so). Text cells that a spreadsheet would take for a
formula (starting with ``=``, ``+``, ``-``, ``@``, tab or carriage return) get a
leading ``'``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import sqlalchemy as sa

from fleet_server import timefmt
from fleet_server.db._tx import Bind, reading
from fleet_server.review.errors import BadQuery
from fleet_server.review.filters import MAX_LIMIT, Cursor, DecisionFilter
from fleet_server.review.query import list_decisions, page_query
from fleet_server.review.rows import DecisionSummary

MAX_EXPORT_ROWS = 1_000_000
"""The most decisions one export holds."""
BATCH = MAX_LIMIT
"""Rows read per page while exporting."""
COLUMNS = (
    "id",
    "decision_time",
    "decision_time_utc",
    "capture_time",
    "device_id",
    "site",
    "line",
    "source",
    "model_name",
    "model_version",
    "bundle_digest",
    "outcome",
    "top_score",
    "top_label",
    "e2e_ms",
    "reviewed",
    "review_verdict",
    "reviewed_outcome",
    "review_note",
    "reviewer",
    "reviewed_at",
    "reviewed_at_utc",
    "station",
    "part_id",
    "deadline_missed",
)
"""The station columns come last, so that a script reading the columns before them by
position reads what it did."""
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _text(value: str | None) -> str:
    if value is None:
        return ""
    return "'" + value if value.startswith(_FORMULA) else value


def _number(value: float | None) -> str:
    return "" if value is None else repr(value)


def _utc(ts: float | None) -> str:
    """ISO 8601 in UTC; ``invalid time (...)`` for a device time no calendar holds, so
    one absurd row never cuts the export short."""
    if ts is None:
        return ""
    when = timefmt.as_datetime(ts)
    return timefmt.invalid(ts) if when is None else when.isoformat(timespec="milliseconds")


def csv_row(row: DecisionSummary) -> list[str]:
    """The cells of one decision, in :data:`COLUMNS` order."""
    r = row.review
    return [
        _text(row.id),
        _number(row.ts),
        _utc(row.ts),
        _number(row.capture_time),
        _text(row.device_id),
        _text(row.site),
        _text(row.line),
        _text(row.source),
        _text(row.model_name),
        _text(row.model_version),
        _text(row.bundle_digest),
        _text(row.outcome),
        _number(row.top_score),
        _text(row.top_label),
        _number(row.e2e_ms),
        "yes" if r is not None else "no",
        _text(r.verdict if r else None),
        _text(r.outcome if r else None),
        _text(r.note if r else None),
        _text(r.reviewer if r else None),
        _number(r.reviewed_at if r else None),
        _utc(r.reviewed_at if r else None),
        _text(row.station),
        _text(row.part_id),
        "yes" if row.deadline_missed else "no",
    ]


def check_export_size(bind: Bind, f: DecisionFilter, max_rows: int = MAX_EXPORT_ROWS) -> int:
    """How many decisions match ``f`` (counting stops past ``max_rows``).

    Raises:
        BadQuery: more than ``max_rows`` match (``limit``), or ``max_rows`` is out of
            1..MAX_EXPORT_ROWS.
    """
    if not 1 <= max_rows <= MAX_EXPORT_ROWS:
        raise BadQuery("limit", f"{max_rows} is not within 1..{MAX_EXPORT_ROWS}")
    with reading(bind) as conn:
        query = page_query(conn, f, None, max_rows + 1)
        if query is None:
            return 0
        counted = sa.select(sa.func.count()).select_from(query.subquery())
        count = int(conn.execute(counted).scalar_one())
    if count > max_rows:
        raise BadQuery(
            "limit",
            f"more than {max_rows} decisions match: narrow the filter (since, until) "
            f"or raise limit (at most {MAX_EXPORT_ROWS})",
        )
    return count


def export_csv(
    bind: Bind, f: DecisionFilter, *, max_rows: int = MAX_EXPORT_ROWS, batch: int = BATCH
) -> Iterator[str]:
    """The CSV text of the decisions matching ``f`` (newest first), a header line and
    then about ``batch`` rows per chunk; at most ``max_rows`` rows."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    yield buffer.getvalue()
    after: Cursor | None = None
    left = max_rows
    for _ in range(max_rows // batch + 1):  # bounded: each round takes a page
        page = list_decisions(bind, f, after=after, limit=min(batch, left))
        buffer.seek(0)
        buffer.truncate()
        writer.writerows(csv_row(row) for row in page.rows)
        yield buffer.getvalue()
        left -= len(page.rows)
        if page.next_cursor is None or left <= 0:
            return
        after = page.next_cursor
