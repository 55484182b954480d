"""Decision uploads: the decision log's rows not yet uploaded, read on a read-only
connection, sent as :class:`agent.wire.messages.DecisionUpload` payloads within the size
cap (:class:`Uploader`).

Only the log's writer marks rows uploaded (:meth:`agent.decisionlog.DecisionLog.mark_uploaded`),
after the broker acknowledged the upload.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.decisionlog import DecisionLog
from agent.decisionlog.connection import connect_reader
from agent.decisionlog.schema import COLUMNS, TABLE
from agent.errors import AgentError, DecisionLogError
from agent.uplink.acks import Publisher
from agent.wire import topics
from agent.wire.messages import (
    MAX_PAYLOAD_BYTES,
    DecisionRow,
    DecisionUpload,
    MessageError,
    encode,
)

log = logging.getLogger(__name__)

BAD_IDS_BOUND = 1000


class UploadFailed(AgentError):
    """A decision upload was not acknowledged; its rows stay un-uploaded.

    Attributes:
        reason: what failed (the broker's reason code, a timeout, paho's refusal).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"decision upload: {reason}")


@dataclass(frozen=True)
class Batch:
    """One upload: its payload and the ids of the rows in it."""

    payload: bytes
    ids: tuple[str, ...]


def pending_rows(db_path: Path, limit: int, exclude: Collection[str] = ()) -> list[dict[str, Any]]:
    """Up to ``limit`` rows with ``uploaded = 0``, oldest first, none of ``exclude``.

    Raises:
        DecisionLogError: the log can't be read.
    """
    if not Path(db_path).is_file():
        return []  # nothing decided yet
    skip = list(exclude)
    where = "uploaded = 0"
    if skip:
        where += f" AND id NOT IN ({', '.join('?' for _ in skip)})"
    sql = (
        f"SELECT {', '.join(COLUMNS)} FROM {TABLE} WHERE {where} "  # noqa: S608 - fixed names
        "ORDER BY decision_time, id LIMIT ?"
    )
    conn = connect_reader(Path(db_path))
    try:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(sql, [*skip, limit])]
    except sqlite3.Error as exc:
        raise DecisionLogError(f"can't read decision log {db_path}: {exc}") from exc
    finally:
        conn.close()


def to_wire(raw: list[dict[str, Any]], device_id: str) -> tuple[list[DecisionRow], dict[str, str]]:
    """Log rows as wire rows; the rows that can't be sent, by id, with the reason."""
    rows: list[DecisionRow] = []
    bad: dict[str, str] = {}
    for item in raw:
        row_id = str(item.get("id"))
        try:
            row = DecisionRow.from_log_row(item)
        except MessageError as exc:
            bad[row_id] = exc.reason
            continue
        if row.device_id != device_id:
            bad[row_id] = f"decided by device {row.device_id!r}, this uplink is {device_id!r}"
            continue
        rows.append(row)
    return rows, bad


def make_batch(
    device_id: str, rows: list[DecisionRow], max_bytes: int = MAX_PAYLOAD_BYTES
) -> tuple[Batch | None, dict[str, str]]:
    """The longest leading run of ``rows`` (halving) whose upload fits ``max_bytes``; and
    the rows that can't be sent at all (one alone is over the cap, or not encodable).

    Raises:
        MessageError: ``rows`` is empty or mixes devices.
    """
    count = len(rows)
    while count:
        chosen = rows[:count]
        try:
            payload = encode(DecisionUpload(device_id=device_id, rows=chosen), max_bytes)
        except MessageError as exc:  # PayloadTooLarge, or a value JSON can't hold
            if count == 1:
                return None, {chosen[0].id: exc.reason}
            count //= 2
            continue
        return Batch(payload, tuple(r.id for r in chosen)), {}
    raise MessageError("decisions", "an upload needs at least one row")


class Uploader:
    """Uploads the log's un-uploaded rows in batches, one in flight, and marks a batch
    uploaded only after a success PUBACK. A refused or unanswered upload raises; its rows
    are sent again on a later call. Rows that can't be sent are set aside (logged and
    counted as ``decisions_invalid``), at most :data:`BAD_IDS_BOUND` of them remembered.
    """

    def __init__(
        self,
        decision_log: DecisionLog,
        device_id: str,
        publisher: Publisher,
        *,
        batch: int,
        ack_timeout_s: float,
        stop: threading.Event,
    ) -> None:
        self.log = decision_log
        self.device_id = device_id
        self.publisher = publisher
        self.batch = batch
        self.ack_timeout_s = ack_timeout_s
        self.stop = stop
        self.topic = topics.decisions(device_id)
        self._bad_ids: dict[str, str] = {}

    def upload_once(self) -> bool:
        """Upload one batch; whether more rows may be waiting.

        Raises:
            UploadFailed: the broker refused the upload or did not answer in time.
            DecisionLogError: the log can't be read, or the rows can't be marked.
        """
        raw = pending_rows(self.log.path, self.batch, self._bad_ids.keys())
        rows, bad = to_wire(raw, self.device_id)
        batch = None
        if rows:
            batch, unsendable = make_batch(self.device_id, rows)
            bad.update(unsendable)
        self._set_aside(bad)
        if batch is None:
            return bool(bad)
        pub = self.publisher
        pending = pub.send("decisions", self.topic, batch.payload)
        if pending is None:
            raise UploadFailed(f"{len(batch.ids)} decisions not sent: {pub.last_error}")
        if not pending.wait(self.ack_timeout_s, self.stop):
            pub.acks.forget(pending)
            pub.count("decision_timeouts")
            raise UploadFailed(
                f"no PUBACK for {len(batch.ids)} decisions within {self.ack_timeout_s:g} s"
            )
        if not pending.ok:
            pub.count("decision_failures")
            raise UploadFailed(f"the broker refused {len(batch.ids)} decisions: {pending.reason}")
        self.log.mark_uploaded(batch.ids)
        pub.count("decisions_uploaded", len(batch.ids))
        pub.count("decision_batches")
        return len(raw) >= self.batch

    def _set_aside(self, bad: Mapping[str, str]) -> None:
        for row_id, reason in bad.items():
            log.error("uplink: decision %s can't be uploaded: %s", row_id, reason)
            self.publisher.count("decisions_invalid")
            if len(self._bad_ids) >= BAD_IDS_BOUND:
                self._bad_ids.pop(next(iter(self._bad_ids)))
            self._bad_ids[row_id] = reason
