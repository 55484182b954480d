"""The decision log's model-quality rows as wire records: ``shadow_results`` rows as
:class:`agent.wire.quality.ShadowRecord` and closed ``drift_hours`` rows as
:class:`agent.wire.quality.DriftHour`, read on a read-only connection, and the upload
payloads made of them within the size cap (halving a batch until it fits).

Each record in an outbox entry is named by an id (:func:`shadow_id`, :func:`drift_id`):
a drift id carries the row's ``n``, so an acknowledgement marks the row uploaded only if
it still holds the totals that were sent.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from agent.decisionlog.connection import connect_reader
from agent.decisionlog.schema import (
    DRIFT_COLUMNS,
    DRIFT_TABLE,
    NOT_UPLOADED,
    SHADOW_COLUMNS,
    SHADOW_TABLE,
)
from agent.drift.store import PERIOD_KEY
from agent.errors import DecisionLogError
from agent.wire.codec import encode
from agent.wire.envelope import MAX_PAYLOAD_BYTES, Message, MessageError, error_text
from agent.wire.quality import HOUR_S, DriftHour, ShadowRecord

GRACE_S = 60
"""A drift bucket is uploaded this long after it is over (late decisions of its last
seconds are still counted into it), or half its length when that is shorter (a 10 s
bucket waits 5 s); a bucket that changes after its upload is sent again anyway."""
SHADOW_PREFIX = "s:"
DRIFT_PREFIX = "d:"

KEY_COLUMNS = ("model_name", "model_version", "line", "source", "hour")
R = TypeVar("R")
DriftKey = tuple[str, str, str, str, int]


def shadow_id(decision_id: str) -> str:
    """The outbox id of a shadow record."""
    return SHADOW_PREFIX + decision_id


def drift_id(hour: DriftHour) -> str:
    """The outbox id of a drift bucket: its key and its ``n``."""
    return DRIFT_PREFIX + json.dumps([*hour.key(), hour.n], separators=(",", ":"))


def parse_drift_id(value: str) -> tuple[DriftKey, int] | None:
    """(key, n) of a drift id; None when ``value`` is not one."""
    if not value.startswith(DRIFT_PREFIX):
        return None
    try:
        m, v, line, source, hour, n = json.loads(value[len(DRIFT_PREFIX) :])
    except (ValueError, TypeError):
        return None
    return (str(m), str(v), str(line), str(source), int(hour)), int(n)


def _read(db_path: Path, sql: str, params: Sequence[object]) -> list[dict[str, Any]]:
    if not Path(db_path).is_file():
        return []  # nothing decided yet
    conn = connect_reader(Path(db_path))
    try:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(sql, list(params))]
    except sqlite3.Error as exc:
        raise DecisionLogError(f"can't read decision log {db_path}: {exc}") from exc
    finally:
        conn.close()


def pending_shadow(
    db_path: Path, limit: int, exclude: Collection[str] = ()
) -> list[dict[str, Any]]:
    """Up to ``limit`` shadow_results rows with ``uploaded = 0``, oldest first, none of
    ``exclude`` (decision ids).

    Raises:
        DecisionLogError: the log can't be read.
    """
    skip = list(exclude)
    where = f"uploaded = {NOT_UPLOADED}"
    if skip:
        where += f" AND decision_id NOT IN ({', '.join('?' for _ in skip)})"
    sql = (
        f"SELECT {', '.join(SHADOW_COLUMNS)} FROM {SHADOW_TABLE} WHERE {where} "  # noqa: S608
        "ORDER BY ts, decision_id LIMIT ?"
    )
    return _read(db_path, sql, [*skip, limit])


def closed_drift(
    db_path: Path, now: float, limit: int, exclude: Collection[str] = ()
) -> list[dict[str, Any]]:
    """Up to ``limit`` drift_hours rows with ``uploaded = 0`` whose bucket ended at least
    :data:`GRACE_S` (or half its length) before ``now``, oldest first; none whose key (as JSON, see
    :func:`key_text`) is in ``exclude``.

    Raises:
        DecisionLogError: the log can't be read.
    """
    period = f"coalesce(json_extract(hist, '$.{PERIOD_KEY}'), {HOUR_S})"
    grace = f"min({GRACE_S}, {period} / 2.0)"
    sql = (
        f"SELECT {', '.join(DRIFT_COLUMNS)} FROM {DRIFT_TABLE} "  # noqa: S608 - fixed names
        f"WHERE uploaded = {NOT_UPLOADED} AND hour + {period} + {grace} <= ? "
        "ORDER BY hour, model_name, model_version, line, source LIMIT ?"
    )
    rows = _read(db_path, sql, [now, limit + len(exclude)])
    return [r for r in rows if key_text(r) not in exclude][:limit]


def key_text(row: Mapping[str, Any]) -> str:
    """A drift row's key as one string (for the set of rows set aside)."""
    return json.dumps([row.get(c) for c in KEY_COLUMNS])


def _outputs(text: Any) -> dict[str, object]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def shadow_record(row: Mapping[str, Any]) -> ShadowRecord:
    """A shadow_results row as its wire record.

    Raises:
        MessageError: a field is missing or out of range (named).
    """
    try:
        return ShadowRecord.model_validate(
            {
                "decision_id": row["decision_id"],
                "ts": row["ts"],
                "source": row["source"],
                "line": row["line"],
                "live": {
                    "model_name": row["live_model"],
                    "model_version": row["live_version"],
                    "outcome": row["live_outcome"],
                    "latency_ms": row["live_ms"],
                    "outputs": _outputs(row["live_outputs"]),
                },
                "shadow": {
                    "model_name": row["shadow_model"],
                    "model_version": row["shadow_version"],
                    "release": row["shadow_release"],
                    "outcome": row["shadow_outcome"],
                    "latency_ms": row["shadow_ms"],
                    "outputs": _outputs(row["shadow_outputs"]),
                    "digest": row["shadow_digest"],
                },
                "agree": bool(row["agree"]),
                "iou_threshold": row["iou_threshold"],
                "matched": row["matched"],
                "unmatched_live": row["unmatched_live"],
                "unmatched_shadow": row["unmatched_shadow"],
                "thumbnail": row["thumbnail"],
            }
        )
    except (ValidationError, KeyError) as exc:
        why = error_text(exc) if isinstance(exc, ValidationError) else f"no column {exc}"
        raise MessageError("shadow", why) from exc


def drift_hour(row: Mapping[str, Any]) -> DriftHour:
    """A drift_hours row as its wire record (the bucket length taken out of ``hist``).

    Raises:
        MessageError: a column is not valid JSON, or a field is out of range (named).
    """
    try:
        hist = json.loads(row["hist"])
        outcomes = json.loads(row["outcomes"])
        top_class = json.loads(row["top_class"])
    except (ValueError, TypeError, KeyError) as exc:
        raise MessageError("drift", f"a JSON column can't be read: {exc}") from exc
    if not isinstance(hist, dict):
        raise MessageError("drift", "hist is not a JSON object")
    period = hist.pop(PERIOD_KEY, HOUR_S)
    try:
        return DriftHour.model_validate(
            {
                "model_name": row["model_name"],
                "model_version": row["model_version"],
                "line": row["line"],
                "source": row["source"],
                "hour": row["hour"],
                "period_s": period,
                "n": row["n"],
                "outcomes": outcomes,
                "top_class": top_class,
                "hist": hist,
            }
        )
    except ValidationError as exc:
        raise MessageError("drift", error_text(exc)) from exc


@dataclass(frozen=True)
class Batch:
    """One upload: its payload (JSON, not compressed) and the ids of its records."""

    payload: bytes
    ids: tuple[str, ...]


def make_batch(
    records: Sequence[R],
    message: Callable[[list[R]], Message],
    ident: Callable[[R], str],
    max_bytes: int = MAX_PAYLOAD_BYTES,
) -> tuple[Batch | None, dict[str, str]]:
    """The longest leading run of ``records`` (halving) whose message fits ``max_bytes``;
    and, by id, a record that can't be sent at all (alone over the cap).

    Raises:
        MessageError: ``records`` is empty.
    """
    count = len(records)
    while count:
        chosen = list(records[:count])
        try:
            payload = encode(message(chosen), max_bytes)
        except MessageError as exc:
            if count == 1:
                return None, {ident(chosen[0]): exc.reason}
            count //= 2
            continue
        return Batch(payload, tuple(ident(r) for r in chosen)), {}
    raise MessageError("quality", "an upload needs at least one record")
