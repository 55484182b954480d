"""The writer thread: the only code that writes the decision log's database.

It takes records off the bounded queue, encodes them (JSON, thumbnails) and inserts them
with ``executemany`` in one transaction per batch: when ``batch_size`` records are
waiting or the oldest has waited ``flush_interval_s``. Commands on the same queue
(flush, mark uploaded, stop) first commit what came before them, so they see every
record appended before they were.

Each record is also counted for drift (:class:`agent.drift.recorder.DriftRecorder`, with
its frame's input statistics), and the counts go to the ``drift_hours`` table every few
seconds, at a flush and at stop, in a transaction of their own: drift accounting that
fails is logged and counted, never a lost decision.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agent.decisionlog import thumbnails as thumbs
from agent.decisionlog.config import DecisionLogConfig
from agent.decisionlog.connection import transaction
from agent.decisionlog.encode import row_of
from agent.decisionlog.handoff import Handoff
from agent.decisionlog.record import DecisionRecord
from agent.decisionlog.retention import Retention, RetentionResult
from agent.decisionlog.schema import INSERT_SQL, TABLE

if TYPE_CHECKING:  # agent.drift imports the decision log's modules
    from agent.drift.recorder import DriftRecorder

log = logging.getLogger(__name__)

ALARM_CORRUPT = "decision_log_corrupt"
ALARM_EVICTED_UNUPLOADED = "decision_log_evicted_unuploaded"
ALARM_FOREIGN = "decision_log_foreign"
"""The path held something that is not a decision log (not a regular file, or another
schema); it was moved aside like a corrupt one."""
ALARM_WRITE_FAILED = "decision_log_write_failed"

_UPDATE_CHUNK = 500


@dataclass
class Stats:
    """Counters; written by the writer thread (``dropped`` by append's slow path)."""

    written: int = 0
    dropped: int = 0
    lost: int = 0
    duplicates: int = 0
    batches: int = 0
    write_errors: int = 0
    evicted: int = 0
    aged: int = 0
    evicted_unuploaded: int = 0
    retention_runs: int = 0
    thumbnails: int = 0
    thumbnail_errors: int = 0
    thumbnails_dropped: int = 0
    marked_uploaded: int = 0
    last_batch_ms: float = 0.0

    def add_retention(self, result: RetentionResult) -> None:
        self.retention_runs += 1
        self.aged += result.aged
        self.evicted += result.deleted
        self.evicted_unuploaded += result.evicted_unuploaded


@dataclass
class Command:
    """Something for the writer to do in queue order; ``done`` is set when it has."""

    kind: str  # "flush", "mark_uploaded" or "stop"
    ids: Sequence[str] = ()
    state: int = 1  # for "mark_uploaded": the new value of ``uploaded``
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


Alarm = Callable[[str, str], None]
Item = DecisionRecord | Command


class Release(Protocol):
    """Gives back the queued image bytes a record held (``frame_only``: the frame bound)."""

    def __call__(self, nbytes: int, *, frame_only: bool = False) -> None: ...


class Writer(threading.Thread):
    """Drains the queue into the database; see the module docstring."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        items: Handoff[Item],
        config: DecisionLogConfig,
        device_id: str,
        store: thumbs.ThumbnailStore,
        retention: Retention,
        stats: Stats,
        alarm: Alarm,
        release_thumbnail: Release,
        drift: DriftRecorder | None = None,
    ) -> None:
        super().__init__(name="decision-log-writer", daemon=True)
        self.conn = conn
        self.items = items
        self.config = config
        self.device_id = device_id
        self.store = store
        self.retention = retention
        self.stats = stats
        self.alarm = alarm
        self.release_thumbnail = release_thumbnail
        self.drift = drift

    def run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # a bug: say so loudly, appends will be dropped and counted
            log.exception("decision log writer thread stopped")
            self.alarm(ALARM_WRITE_FAILED, f"writer thread stopped: {type(e).__name__}: {e}")
        finally:
            self.conn.close()

    def _loop(self) -> None:
        cfg = self.config
        q = self.items
        batch_size = cfg.batch_size
        deadline: float | None = None  # when the oldest queued record must be committed
        next_retention = time.monotonic() + cfg.retention_interval_s
        while True:
            q.clear_wakeup()
            urgent = q.take_urgent()
            n = len(q)
            now = time.monotonic()
            if n and deadline is None:
                deadline = now + cfg.flush_interval_s
            if n and (urgent or n >= batch_size or (deadline is not None and now >= deadline)):
                due = urgent or (deadline is not None and now >= deadline)
                if self._drain(n if due else n - n % batch_size):
                    return
                if not len(q) or due:
                    deadline = None
            now = time.monotonic()
            if now >= next_retention:
                self._flush_drift()
                self._retention()
                next_retention = time.monotonic() + cfg.retention_interval_s
            if len(q) >= batch_size:
                continue
            wake = next_retention if deadline is None else min(deadline, next_retention)
            q.wait(wake - time.monotonic())

    def _drain(self, n: int) -> bool:
        """Write the ``n`` oldest items in order, running commands among them; True: stop."""
        q = self.items
        batch_size = self.config.batch_size
        batch: list[DecisionRecord] = []
        for _ in range(n):
            item = q.pop()
            if isinstance(item, DecisionRecord):
                batch.append(item)
                if len(batch) >= batch_size:
                    self._write(batch)
                    batch = []
                continue
            if batch:
                self._write(batch)
                batch = []
            if item.kind in ("stop", "flush"):
                self._flush_drift(force=True)
            if item.kind == "stop":
                item.done.set()
                return True
            if item.kind == "mark_uploaded":
                self._mark_uploaded(item)
            item.done.set()
        if batch:
            self._write(batch)
        self._flush_drift()
        return False

    def _write(self, batch: list[DecisionRecord]) -> None:
        """Encode and insert one batch in one transaction; never raises."""
        t0 = time.perf_counter()
        written: list[str] = []
        rows = []
        for record in batch:
            image = self._take_image(record)
            if self.drift is not None:
                self.drift.observe(record, image)
            thumbnail = self._thumbnail(record, image, written)
            try:
                rows.append(row_of(record, self.device_id, thumbnail))
            except Exception:  # a field of the wrong type, an object whose repr fails, ...
                self.stats.lost += 1
                log.exception("decision %s not logged, a field is unusable", record.id)
                if thumbnail:
                    written.remove(thumbnail)
                    self.store.delete([thumbnail])
        try:
            try:
                n = self._insert(rows)
            except sqlite3.OperationalError:  # the disk may be full: make room, try once more
                log.warning("decision log insert failed; retrying after retention", exc_info=True)
                self._retention()
                n = self._insert(rows)
        except Exception as e:  # counted, logged and alarmed: the thread lives on
            self.stats.write_errors += 1
            self.stats.lost += len(rows)
            self.store.delete(written)
            log.exception("decision log batch of %d rows failed", len(rows))
            msg = f"lost a batch of {len(rows)} decisions: {type(e).__name__}: {e}"
            self.alarm(ALARM_WRITE_FAILED, msg)
            return
        self.stats.written += n
        self.stats.batches += 1
        self.stats.last_batch_ms = (time.perf_counter() - t0) * 1000.0

    def _insert(self, rows: list[tuple[str | float | int | None, ...]]) -> int:
        """Insert ``rows`` in one transaction; returns how many went in."""
        conn = self.conn
        try:
            with transaction(conn):
                conn.executemany(INSERT_SQL, rows)
        except sqlite3.IntegrityError:
            pass  # a repeated id (ids given by the caller): insert the others one by one
        else:
            return len(rows)
        duplicates = 0
        with transaction(conn):
            for row in rows:
                try:
                    conn.execute(INSERT_SQL, row)
                except sqlite3.IntegrityError as e:
                    duplicates += 1
                    log.error("decision %s not logged: %s", row[0], e)  # noqa: TRY400
        self.stats.duplicates += duplicates
        return len(rows) - duplicates

    def _take_image(self, record: DecisionRecord) -> Any:
        """The record's image (None if it has none), taken off it and its queued bytes
        given back."""
        image = record.thumbnail
        if image is None:
            return None
        record.thumbnail = None
        self.release_thumbnail(getattr(image, "nbytes", 0), frame_only=record.frame_only)
        return image

    def _thumbnail(self, record: DecisionRecord, image: Any, written: list[str]) -> str | None:
        """Encode and store the record's thumbnail if it keeps one (``append`` decided);
        its relative path."""
        if image is None or record.frame_only:
            return None
        cfg = self.config
        try:
            data = thumbs.encode_jpeg(
                image, cfg.thumbnail_max_side, cfg.thumbnail_max_bytes, cfg.jpeg_quality
            )
            rel = thumbs.relpath(record.id, record.decision_time)
            self.store.write(rel, data)
        except (ValueError, OSError) as e:
            self.stats.thumbnail_errors += 1
            log.error("decision %s logged without its thumbnail: %s", record.id, e)  # noqa: TRY400
            return None
        except Exception:  # cv2.error and the like: no thumbnail is worth the row
            self.stats.thumbnail_errors += 1
            log.exception("decision %s logged without its thumbnail", record.id)
            return None
        self.stats.thumbnails += 1
        written.append(rel)
        return rel

    def _mark_uploaded(self, command: Command) -> None:
        ids = list(command.ids)
        conn = self.conn
        try:
            with transaction(conn):
                for i in range(0, len(ids), _UPDATE_CHUNK):
                    chunk = ids[i : i + _UPDATE_CHUNK]
                    conn.execute(
                        f"UPDATE {TABLE} SET uploaded = ? "  # noqa: S608
                        f"WHERE id IN ({', '.join('?' for _ in chunk)})",
                        [command.state, *chunk],
                    )
        except sqlite3.Error as e:
            command.error = f"{type(e).__name__}: {e}"
            log.exception("decision log could not mark %d decisions uploaded", len(ids))
            return
        if command.state == 1:
            self.stats.marked_uploaded += len(ids)

    def _flush_drift(self, *, force: bool = False) -> None:
        """Store the drift counts when due (or now with ``force``); never raises."""
        drift = self.drift
        if drift is not None and (drift.due() or (force and drift.pending)):
            drift.flush(self.conn)

    def _retention(self) -> None:
        try:
            result = self.retention.run(time.time())
        except (sqlite3.Error, OSError):
            self.stats.write_errors += 1
            log.exception("decision log retention failed")
            return
        self.stats.add_retention(result)
        report_eviction(result, self.retention.budget_bytes, self.alarm)


def report_eviction(result: RetentionResult, budget_bytes: int, alarm: Alarm) -> None:
    """Alarm when retention had to delete rows not yet uploaded."""
    if not result.evicted_unuploaded:
        return
    oldest = result.oldest_unuploaded_evicted
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(oldest)) if oldest is not None else "?"
    msg = (
        f"disk budget of {budget_bytes} bytes exhausted: deleted "
        f"{result.evicted_unuploaded} decisions not yet uploaded (oldest from {since})"
    )
    alarm(ALARM_EVICTED_UNUPLOADED, msg)
