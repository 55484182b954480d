"""Model-quality uploads: the decision log's shadow comparisons (``shadow_results``) and
closed drift buckets (``drift_hours``) as gzipped :class:`agent.wire.quality.ShadowBatch`
and :class:`agent.wire.quality.DriftBatch` records of kind ``quality`` in the outbox, to
:func:`agent.wire.topics.quality`.

The rows' ``uploaded`` state follows the decision uploads' (:mod:`agent.uplink.decisions`):
a batch is stored in the outbox first, then its rows are marked queued (2); once the broker
acknowledged it they are marked uploaded (1). A batch the outbox drops, or one lost with a
damaged outbox (:meth:`QualitySender.reconcile` at start), gives its rows back (0).

A drift row holds totals and may change after it was queued (a late decision of its
bucket): the writer then sets it back to 0, the acknowledgement of the older totals does
not mark it (every mark names the ``n`` it sent), and it is sent again; the fleet keeps
one row per key, so an offline bucket arrives later and is stored once.

The marks are written on a connection of this sender's own to the decision log (WAL, a
busy timeout), from the uplink's threads, in the hot path's process or the companion's.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from agent.decisionlog.connection import connect_writer, transaction
from agent.decisionlog.schema import (
    DRIFT_TABLE,
    NOT_UPLOADED,
    QUEUED,
    SHADOW_TABLE,
    UPLOADED,
)
from agent.errors import DecisionLogError
from agent.uplink import quality_rows as rows
from agent.uplink.acks import Publisher
from agent.uplink.decisions import queue_thumbnail
from agent.uplink.outbox import KIND_QUALITY, Entry, Outbox
from agent.wire import topics
from agent.wire.compress import compress
from agent.wire.envelope import MessageError
from agent.wire.quality import DriftBatch, DriftHour, ShadowBatch, ShadowRecord

log = logging.getLogger(__name__)

BAD_BOUND = 1000
"""Rows that can't be sent, remembered so that they are not read again (at most)."""
_CHUNK = 400
_DRIFT_WHERE = "model_name = ? AND model_version = ? AND line = ? AND source = ? AND hour = ?"


class QualityMarks:
    """Sets ``uploaded`` of shadow_results and drift_hours rows (see the module docstring).

    Raises (every method):
        DecisionLogError: the log is not there yet, or the update failed.
    """

    def __init__(self, db_path: Path) -> None:
        self.path = Path(db_path)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def shadow(self, decision_ids: Sequence[str], state: int, *, was: Iterable[int]) -> int:
        """Set ``uploaded = state`` on these shadow rows whose state is one of ``was``."""
        olds = tuple(was)
        ids = list(decision_ids)
        changed = 0

        def run(conn: sqlite3.Connection) -> None:
            nonlocal changed
            for i in range(0, len(ids), _CHUNK):
                chunk = ids[i : i + _CHUNK]
                changed += conn.execute(
                    f"UPDATE {SHADOW_TABLE} SET uploaded = ? "  # noqa: S608 - placeholders
                    f"WHERE decision_id IN ({', '.join('?' for _ in chunk)}) "
                    f"AND uploaded IN ({', '.join('?' for _ in olds)})",
                    [state, *chunk, *olds],
                ).rowcount

        self._write(run, f"{len(ids)} shadow results")
        return changed

    def drift(
        self, hours: Sequence[tuple[rows.DriftKey, int | None]], state: int, *, was: int
    ) -> int:
        """Set ``uploaded = state`` on these drift rows whose state is ``was`` and, where
        an ``n`` is given, whose ``n`` still is that."""
        changed = 0

        def run(conn: sqlite3.Connection) -> None:
            nonlocal changed
            for key, n in hours:
                if n is None:
                    sql = f"UPDATE {DRIFT_TABLE} SET uploaded = ? WHERE {_DRIFT_WHERE} AND uploaded = ?"  # noqa: S608, E501
                    params: list[object] = [state, *key, was]
                else:
                    sql = f"UPDATE {DRIFT_TABLE} SET uploaded = ? WHERE {_DRIFT_WHERE} AND uploaded = ? AND n = ?"  # noqa: S608, E501
                    params = [state, *key, was, n]
                changed += conn.execute(sql, params).rowcount

        self._write(run, f"{len(hours)} drift buckets")
        return changed

    def queued(self) -> tuple[list[str], list[rows.DriftKey]]:
        """Shadow decision ids and drift keys marked queued."""
        with self._lock:
            conn = self._connection()
            try:
                shadow = [
                    str(r[0])
                    for r in conn.execute(
                        f"SELECT decision_id FROM {SHADOW_TABLE} WHERE uploaded = ?",  # noqa: S608
                        (QUEUED,),
                    )
                ]
                drift = [
                    (str(a), str(b), str(c), str(d), int(e))
                    for a, b, c, d, e in conn.execute(
                        f"SELECT model_name, model_version, line, source, hour FROM {DRIFT_TABLE} "  # noqa: S608
                        "WHERE uploaded = ?",
                        (QUEUED,),
                    )
                ]
            except sqlite3.Error as exc:
                self._close()
                raise DecisionLogError(f"can't read decision log {self.path}: {exc}") from exc
        return shadow, drift

    def close(self) -> None:
        with self._lock:
            self._close()

    def _write(self, run: Callable[[sqlite3.Connection], None], what: str) -> None:
        with self._lock:
            conn = self._connection()
            try:
                with transaction(conn):
                    run(conn)
            except sqlite3.Error as exc:
                self._close()
                raise DecisionLogError(f"marking {what} in {self.path} failed: {exc}") from exc

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            if not self.path.is_file():
                raise DecisionLogError(f"no decision log at {self.path} yet")
            self._conn = connect_writer(self.path)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class QualitySender:
    """Moves the log's model-quality rows into the outbox (see the module docstring).

    Rows that can't be sent (a field out of range, one record alone over the size cap)
    are set aside: logged, counted as ``quality_invalid`` and not read again while this
    sender runs (at most :data:`BAD_BOUND` remembered).
    """

    def __init__(
        self,
        db_path: Path,
        device_id: str,
        outbox: Outbox,
        publisher: Publisher,
        *,
        batch: int,
        clock: Callable[[], float] = time.time,
        thumbnails_dir: Path | None = None,
    ) -> None:
        self.db_path = Path(db_path)
        self.thumbnails_dir = thumbnails_dir
        """Where the log keeps its files: the frame a disagreeing shadow row kept is
        queued as its decision's thumbnail (the same frame), so the fleet's review can
        draw both models on it; None uploads no frames."""
        self.device_id = device_id
        self.outbox = outbox
        self.publisher = publisher
        self.batch = batch
        self.topic = topics.quality(device_id)
        self.marks = QualityMarks(self.db_path)
        self._clock = clock
        self._bad_shadow: dict[str, str] = {}
        self._bad_drift: dict[str, str] = {}
        self.more_waiting = False
        """After :meth:`fill_once`: rows were left for the next batch."""

    def reconcile(self) -> int:
        """Give rows marked queued whose batch is not in the outbox back to the queue;
        how many.

        Raises:
            DecisionLogError: the log can't be read or written.
            OutboxError: the outbox can't be read.
        """
        if not self.db_path.is_file():
            return 0
        held = self.outbox.ids_of(KIND_QUALITY)
        shadow, drift = self.marks.queued()
        lost_shadow = [i for i in shadow if rows.shadow_id(i) not in held]
        held_keys = {parsed[0] for parsed in map(rows.parse_drift_id, held) if parsed}
        lost_drift: list[tuple[rows.DriftKey, int | None]] = [
            (k, None) for k in drift if k not in held_keys
        ]
        n = 0
        if lost_shadow:
            n += self.marks.shadow(lost_shadow, NOT_UPLOADED, was=(QUEUED,))
        if lost_drift:
            n += self.marks.drift(lost_drift, NOT_UPLOADED, was=QUEUED)
        if n:
            log.warning("uplink: %d quality rows queued in no outbox batch are queued again", n)
        return n

    def fill_once(self) -> int:
        """Queue at most one shadow batch and one drift batch; how many records they hold.

        Raises:
            DecisionLogError: the log can't be read, or the rows can't be marked.
            OutboxError: the outbox can't be written.
        """
        self.more_waiting = False
        return self._fill_shadow() + self._fill_drift(self._clock())

    def _fill_shadow(self) -> int:
        raw = rows.pending_shadow(self.db_path, self.batch, self._bad_shadow.keys())
        records: list[ShadowRecord] = []
        bad: dict[str, str] = {}
        for row in raw:
            try:
                records.append(rows.shadow_record(row))
            except MessageError as exc:
                bad[str(row.get("decision_id"))] = exc.reason
        batch = None
        if records:
            batch, unsendable = rows.make_batch(
                records,
                lambda chosen: ShadowBatch(device_id=self.device_id, records=chosen),
                lambda r: rows.shadow_id(r.decision_id),
            )
            bad.update({k[len(rows.SHADOW_PREFIX) :]: v for k, v in unsendable.items()})
        self._set_aside(self._bad_shadow, bad, "shadow result")
        if batch is None or not self._put(batch):
            return 0
        ids = [i[len(rows.SHADOW_PREFIX) :] for i in batch.ids]
        self.marks.shadow(ids, QUEUED, was=(NOT_UPLOADED,))
        self.publisher.count("shadow_queued", len(ids))
        if self.thumbnails_dir is not None:
            chosen = set(ids)
            for row in raw:
                decision_id, rel = str(row.get("decision_id")), row.get("thumbnail")
                if rel and decision_id in chosen:
                    queue_thumbnail(
                        self.outbox,
                        self.publisher,
                        self.thumbnails_dir,
                        str(rel),
                        self.device_id,
                        decision_id,
                        float(row["ts"]),
                    )
        self.more_waiting |= len(raw) >= self.batch or len(ids) < len(records)
        return len(ids)

    def _fill_drift(self, now: float) -> int:
        raw = rows.closed_drift(self.db_path, now, self.batch, self._bad_drift.keys())
        hours: list[DriftHour] = []
        bad: dict[str, str] = {}
        for row in raw:
            try:
                hours.append(rows.drift_hour(row))
            except MessageError as exc:
                bad[rows.key_text(row)] = exc.reason
        batch = None
        if hours:
            batch, unsendable = rows.make_batch(
                hours,
                lambda chosen: DriftBatch(device_id=self.device_id, hours=chosen),
                rows.drift_id,
            )
            for ident, reason in unsendable.items():
                parsed = rows.parse_drift_id(ident)
                if parsed is not None:
                    bad[rows.key_text(dict(zip(rows.KEY_COLUMNS, parsed[0], strict=True)))] = reason
        self._set_aside(self._bad_drift, bad, "drift bucket")
        if batch is None or not self._put(batch):
            return 0
        sent = [p for p in map(rows.parse_drift_id, batch.ids) if p is not None]
        self.marks.drift([(k, n) for k, n in sent], QUEUED, was=NOT_UPLOADED)
        self.publisher.count("drift_queued", len(sent))
        self.more_waiting |= len(raw) >= self.batch or len(sent) < len(hours)
        return len(sent)

    def _put(self, batch: rows.Batch) -> bool:
        seq = self.outbox.put(KIND_QUALITY, self.topic, compress(batch.payload), batch.ids)
        if seq is None:
            return False  # dropped by the outbox's policy, counted there; rows stay at 0
        self.publisher.count("quality_batches")
        return True

    def delivered(self, entries: Sequence[Entry]) -> None:
        """Mark the rows of acknowledged quality batches uploaded.

        Raises:
            DecisionLogError: the rows can't be marked (the batches stay and are resent).
        """
        shadow, drift = _split(e for e in entries if e.kind == KIND_QUALITY)
        if shadow:
            self.marks.shadow(shadow, UPLOADED, was=(QUEUED,))
            self.publisher.count("shadow_uploaded", len(shadow))
        if drift:
            self.marks.drift([(k, n) for k, n in drift], UPLOADED, was=QUEUED)
            self.publisher.count("drift_uploaded", len(drift))

    def dropped(self, entry: Entry) -> None:
        """A quality batch the outbox dropped: its rows go back to the queue."""
        if entry.kind != KIND_QUALITY:
            return
        shadow, drift = _split([entry])
        if shadow:
            self.marks.shadow(shadow, NOT_UPLOADED, was=(QUEUED,))
        if drift:
            self.marks.drift([(k, None) for k, _ in drift], NOT_UPLOADED, was=QUEUED)

    def close(self) -> None:
        self.marks.close()

    def _set_aside(self, into: dict[str, str], bad: Mapping[str, str], what: str) -> None:
        for ident, reason in bad.items():
            log.error("uplink: %s %s can't be uploaded: %s", what, ident, reason)
            self.publisher.count("quality_invalid")
            if len(into) >= BAD_BOUND:
                into.pop(next(iter(into)))
            into[ident] = reason


def _split(entries: Iterable[Entry]) -> tuple[list[str], list[tuple[rows.DriftKey, int]]]:
    """Shadow decision ids and drift (key, n) named by these entries."""
    shadow: list[str] = []
    drift: list[tuple[rows.DriftKey, int]] = []
    for entry in entries:
        for ident in entry.ids:
            if ident.startswith(rows.SHADOW_PREFIX):
                shadow.append(ident[len(rows.SHADOW_PREFIX) :])
                continue
            parsed = rows.parse_drift_id(ident)
            if parsed is not None:
                drift.append(parsed)
    return shadow, drift
