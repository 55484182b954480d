"""Reading the decision log: filtered queries, one decision, times, and output formats.

Readers open the file read-only (URI ``mode=ro``), so they work while the agent writes.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from agent.decisionlog.connection import connect_reader
from agent.decisionlog.schema import VIEW
from agent.errors import DecisionLogError

JSON_COLUMNS = ("outputs", "thresholds", "latencies_ms")
TABLE_COLUMNS = (
    "id",
    "decision_time_utc",
    "source",
    "line",
    "station",
    "part_id",
    "outcome",
    "model_version",
    "e2e_ms",
    "thumbnail",
    "uploaded",
)
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*(?:ago)?\s*$", re.IGNORECASE)
_NUMBER = re.compile(r"^\s*\d+(?:\.\d+)?\s*$")
_CELL_WIDTH = 40


def query(
    db_path: Path,
    *,
    since: float | None = None,
    until: float | None = None,
    source: str | None = None,
    outcome: str | None = None,
    model_version: str | None = None,
    station: str | None = None,
    part_id: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Decisions matching every given filter, newest first, at most ``limit``.

    ``since`` is inclusive and ``until`` exclusive (unix seconds of the decision time);
    ``station`` and ``part_id`` match exactly (``part_id`` reads its index: every
    decision about one part). Rows carry the ISO-8601 UTC times, the JSON columns
    decoded and ``deadline_missed`` as a bool.

    Raises:
        DecisionLogError: no readable decision log at ``db_path``, or ``limit`` < 1.
    """
    if limit < 1:
        raise DecisionLogError(f"limit must be at least 1, not {limit}")
    where: list[str] = []
    params: list[Any] = []
    for clause, value in (
        ("decision_time >= ?", since),
        ("decision_time < ?", until),
        ("source = ?", source),
        ("outcome = ?", outcome),
        ("model_version = ?", model_version),
        ("station = ?", station),
        ("part_id = ?", part_id),
    ):
        if value is not None:
            where.append(clause)
            params.append(value)
    sql = f"SELECT * FROM {VIEW}"  # noqa: S608 - fixed names, values are parameters
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY decision_time DESC, id DESC LIMIT ?"
    return _fetch(db_path, sql, [*params, limit])


def get(db_path: Path, decision_id: str) -> dict[str, Any] | None:
    """One decision by id, or None.

    Raises:
        DecisionLogError: no readable decision log at ``db_path``.
    """
    rows = _fetch(db_path, f"SELECT * FROM {VIEW} WHERE id = ?", [decision_id])  # noqa: S608
    return rows[0] if rows else None


def _fetch(db_path: Path, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    conn = connect_reader(Path(db_path))
    try:
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute(sql, params)]
    except sqlite3.Error as e:
        raise DecisionLogError(f"can't read decision log {db_path}: {e}") from e
    finally:
        conn.close()
    for row in rows:
        for col in JSON_COLUMNS:
            if isinstance(row.get(col), str):
                row[col] = json.loads(row[col])
        if "deadline_missed" in row:
            row["deadline_missed"] = bool(row["deadline_missed"])
    return rows


def parse_time(text: str, now: float | None = None) -> float:
    """Unix seconds from ISO-8601 or an age before ``now``.

    Accepts "2026-11-21T10:00:00" (UTC when no offset is given), "...Z", "...+02:00",
    "2026-11-21" (midnight UTC), ages "90s", "15m", "2h", "1d", "1w" (optionally
    followed by "ago"), and plain unix seconds.

    Raises:
        ValueError: naming ``text`` when it is none of these.
    """
    age = _AGE.match(text)
    if age:
        ref = time.time() if now is None else now
        return ref - float(age.group(1)) * _UNITS[age.group(2).lower()]
    if _NUMBER.match(text):
        return float(text)
    iso = text.strip()
    if iso[-1:] in ("Z", "z"):
        iso = iso[:-1] + "+00:00"
    try:
        when = dt.datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(
            f"can't read the time {text!r}: give ISO-8601 (2026-11-21T10:00:00Z, "
            "2026-11-21) or an age (15m, 2h, 1d)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def format_rows(
    rows: Iterable[dict[str, Any]],
    fmt: Literal["table", "csv", "jsonl"],
    columns: Sequence[str] | None = None,
) -> str:
    """Rows as an aligned text table, CSV (JSON columns as JSON text) or JSON lines.

    ``columns`` picks and orders columns; by default a table shows a short selection
    and CSV and JSON lines show every column of the first row.

    Raises:
        ValueError: ``fmt`` is not one of the three.
    """
    rows = list(rows)
    if fmt == "jsonl":
        cols = columns
        return "".join(
            json.dumps({c: r.get(c) for c in cols} if cols else r, ensure_ascii=False) + "\n"
            for r in rows
        )
    if fmt == "csv":
        cols = list(columns or (rows[0].keys() if rows else TABLE_COLUMNS))
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(cols)
        writer.writerows([_text(r.get(c)) for c in cols] for r in rows)
        return out.getvalue()
    if fmt == "table":
        return _table(rows, columns)
    raise ValueError(f"unknown format {fmt!r}: use table, csv or jsonl")


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


def _table(rows: list[dict[str, Any]], columns: Sequence[str] | None) -> str:
    if columns is None:
        first = rows[0].keys() if rows else TABLE_COLUMNS
        columns = [c for c in TABLE_COLUMNS if c in first] or list(first)
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells)
    if not rows:
        lines.append("(no decisions)")
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _cell(value: Any) -> str:
    text = _text(value)
    return text if len(text) <= _CELL_WIDTH else text[: _CELL_WIDTH - 1] + "…"
