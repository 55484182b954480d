"""Decision uploads: the decision log's rows not yet uploaded, read on a read-only
connection, made into :class:`agent.wire.messages.DecisionUpload` payloads within the size
cap, gzipped and queued in the outbox (:class:`Batcher`). The thumbnail a row keeps goes
into the outbox as its own :class:`agent.wire.messages.ThumbnailUpload`, queued just before
the batch.

Only the log's writer changes a row's ``uploaded`` state
(:meth:`agent.decisionlog.DecisionLog.mark_uploaded`).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.decisionlog import NOT_UPLOADED, QUEUED, UPLOADED, DecisionLog
from agent.decisionlog.connection import connect_reader
from agent.decisionlog.schema import COLUMNS, TABLE
from agent.errors import DecisionLogError
from agent.uplink.acks import Publisher
from agent.uplink.outbox import KIND_DECISIONS, KIND_THUMBNAIL, Entry, Outbox
from agent.wire import topics
from agent.wire.compress import compress
from agent.wire.messages import (
    MAX_PAYLOAD_BYTES,
    DecisionRow,
    DecisionUpload,
    MessageError,
    ThumbnailUpload,
    encode,
)

log = logging.getLogger(__name__)

BAD_IDS_BOUND = 1000
YIELD_EVERY = 8


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
    """Log rows as wire rows; the rows that can't be sent, by id, with the reason.

    Every :data:`YIELD_EVERY` rows it lets other threads run: validating a batch of 200
    rows at once holds the GIL for several ms, which the pipeline threads of the same
    process wait out (measured: a thread's p99 +4.1 ms with batches of 200, +0.3 ms with
    a yield every 20 rows, none with one every 5).
    """
    rows: list[DecisionRow] = []
    bad: dict[str, str] = {}
    for n, item in enumerate(raw, 1):
        if n % YIELD_EVERY == 0:
            time.sleep(0)  # give the GIL to a waiting pipeline thread
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


class Batcher:
    """Moves the log's un-uploaded rows into the outbox as gzipped upload batches.

    A batch is stored in the outbox first, then its rows are marked ``QUEUED`` in the log;
    once the broker acknowledged it (:meth:`delivered`) they are marked ``UPLOADED``, and
    only then is the batch deleted from the outbox. A crash between two of those steps
    sends some rows twice, never none: the fleet stores each decision once by its id.
    Rows that can't be sent are set aside (logged and counted as ``decisions_invalid``),
    at most :data:`BAD_IDS_BOUND` of them remembered.

    With ``thumbnails_dir`` (the log's state directory), the thumbnail file of each row
    in a batch is queued as a ``thumbnail`` record just before the batch. A thumbnail is
    best effort: one deleted by retention or lost in a power cut is counted as
    ``thumbnails_missing``, and the outbox drops thumbnails first when it is full.
    """

    def __init__(
        self,
        decision_log: DecisionLog,
        device_id: str,
        outbox: Outbox,
        publisher: Publisher,
        *,
        batch: int,
        thumbnails_dir: Path | None = None,
    ) -> None:
        self.log = decision_log
        self.thumbnails_dir = thumbnails_dir
        self.thumbnail_topic = topics.thumbnails(device_id)
        self.device_id = device_id
        self.outbox = outbox
        self.publisher = publisher
        self.batch = batch
        self.topic = topics.decisions(device_id)
        self._bad_ids: dict[str, str] = {}
        self.more_waiting = False
        """After :meth:`fill_once`: rows were left for the next batch."""

    def reconcile(self) -> int:
        """Give rows marked ``QUEUED`` whose batch is not in the outbox (lost with a
        damaged outbox, or a crash) back to the queue; how many.

        Raises:
            DecisionLogError: the log can't be read or written.
            OutboxError: the outbox can't be read.
        """
        queued = rows_in_state(self.log.path, QUEUED)
        lost = sorted(set(queued) - self.outbox.decision_ids())
        if lost:
            self.log.mark_uploaded(lost, state=NOT_UPLOADED)
            log.warning(
                "uplink: %d decisions queued in no outbox batch are queued again", len(lost)
            )
        return len(lost)

    def fill_once(self) -> int:
        """Queue one batch of the oldest un-uploaded rows; how many rows it holds (0: none
        waiting, or only rows that can't be sent).

        Raises:
            DecisionLogError: the log can't be read, or the rows can't be marked.
            OutboxError: the outbox can't be written.
        """
        raw = pending_rows(self.log.path, self.batch, self._bad_ids.keys())
        rows, bad = to_wire(raw, self.device_id)
        batch = None
        if rows:
            batch, unsendable = make_batch(self.device_id, rows)
            bad.update(unsendable)
        self._set_aside(bad)
        self.more_waiting = False
        if batch is None:
            return 0
        if self.thumbnails_dir is not None:
            self._queue_thumbnails(raw, batch.ids)
        seq = self.outbox.put(KIND_DECISIONS, self.topic, compress(batch.payload), batch.ids)
        if seq is None:
            return 0  # dropped by the outbox's policy, counted there; rows stay un-uploaded
        self.log.mark_uploaded(batch.ids, state=QUEUED)
        self.publisher.count("decisions_queued", len(batch.ids))
        self.publisher.count("decision_batches")
        # a batch cut to fit the payload cap leaves rows waiting: say it was full
        self.more_waiting = len(raw) >= self.batch or len(batch.ids) < len(rows)
        return len(batch.ids)

    def delivered(self, entries: Sequence[Entry]) -> None:
        """Mark the rows of acknowledged batches ``UPLOADED``.

        Raises:
            DecisionLogError: the rows can't be marked (the batches stay and are resent).
        """
        ids = [i for e in entries if e.kind == KIND_DECISIONS for i in e.ids]
        if ids:
            self.log.mark_uploaded(ids, state=UPLOADED)
            self.publisher.count("decisions_uploaded", len(ids))
        thumbnails = sum(1 for e in entries if e.kind == KIND_THUMBNAIL)
        if thumbnails:
            self.publisher.count("thumbnails_uploaded", thumbnails)

    def dropped(self, entry: Entry) -> None:
        """A batch the outbox dropped: its rows go back to the queue (they are still in
        the log)."""
        if entry.kind == KIND_DECISIONS and entry.ids:
            self.log.mark_uploaded(entry.ids, state=NOT_UPLOADED)

    def _queue_thumbnails(self, raw: Sequence[Mapping[str, Any]], ids: Collection[str]) -> None:
        """Queue the thumbnail of each row of ``raw`` whose id is in ``ids``.

        Raises:
            OutboxError: the outbox can't be written.
        """
        assert self.thumbnails_dir is not None  # noqa: S101 - the caller checked
        chosen = set(ids)
        for row in raw:
            rel, row_id = row.get("thumbnail"), str(row.get("id"))
            if not rel or row_id not in chosen:
                continue
            queue_thumbnail(
                self.outbox,
                self.publisher,
                self.thumbnails_dir,
                str(rel),
                self.device_id,
                row_id,
                float(row["decision_time"]),
            )

    def _set_aside(self, bad: Mapping[str, str]) -> None:
        for row_id, reason in bad.items():
            log.error("uplink: decision %s can't be uploaded: %s", row_id, reason)
            self.publisher.count("decisions_invalid")
            if len(self._bad_ids) >= BAD_IDS_BOUND:
                self._bad_ids.pop(next(iter(self._bad_ids)))
            self._bad_ids[row_id] = reason


def queue_thumbnail(
    outbox: Outbox,
    publisher: Publisher,
    state_dir: Path,
    rel: str,
    device_id: str,
    decision_id: str,
    ts: float,
) -> bool:
    """Queue the JPEG at ``state_dir / rel`` as the thumbnail of decision ``decision_id``;
    whether it was queued. A path outside the state directory, a missing file (retention
    deleted it) or one that is not a thumbnail is counted and skipped.

    Raises:
        OutboxError: the outbox can't be written.
    """
    path = state_dir / rel
    if Path(rel).is_absolute() or ".." in Path(rel).parts:
        log.error("uplink: decision %s names thumbnail %r outside the log", decision_id, rel)
        publisher.count("thumbnails_invalid")
        return False
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        publisher.count("thumbnails_missing")  # deleted by retention, or lost
        return False
    except OSError as exc:
        log.error("uplink: thumbnail %s can't be read: %s", path, exc)  # noqa: TRY400
        publisher.count("thumbnails_invalid")
        return False
    try:
        payload = encode(ThumbnailUpload.of(device_id, decision_id, ts, data))
    except MessageError as exc:
        log.error("uplink: thumbnail %s can't be uploaded: %s", path, exc.reason)  # noqa: TRY400
        publisher.count("thumbnails_invalid")
        return False
    topic = topics.thumbnails(device_id)
    if outbox.put(KIND_THUMBNAIL, topic, payload, (decision_id,)) is None:
        return False
    publisher.count("thumbnails_queued")
    return True


def rows_in_state(db_path: Path, state: int) -> list[str]:
    """Ids of the rows whose ``uploaded`` is ``state``.

    Raises:
        DecisionLogError: the log can't be read.
    """
    if not Path(db_path).is_file():
        return []
    conn = connect_reader(Path(db_path))
    try:
        sql = f"SELECT id FROM {TABLE} WHERE uploaded = ?"  # noqa: S608 - fixed name
        return [str(r[0]) for r in conn.execute(sql, (state,))]
    except sqlite3.Error as exc:
        raise DecisionLogError(f"can't read decision log {db_path}: {exc}") from exc
    finally:
        conn.close()
