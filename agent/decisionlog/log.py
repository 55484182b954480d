"""DecisionLog: the hot path's handle on the decision log.

``append()`` only stamps an id and puts the record on a bounded queue; the writer thread
(:mod:`agent.decisionlog.writer`) does the encoding, the thumbnails and the disk.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from agent.decisionlog import integrity, schema
from agent.decisionlog import thumbnails as thumbs
from agent.decisionlog.config import DecisionLogConfig
from agent.decisionlog.connection import connect_writer
from agent.decisionlog.handoff import Handoff
from agent.decisionlog.record import DecisionRecord, new_id
from agent.decisionlog.retention import Retention
from agent.decisionlog.schema import NOT_UPLOADED, QUEUED, UPLOADED
from agent.decisionlog.writer import (
    ALARM_CORRUPT,
    ALARM_FOREIGN,
    Command,
    Item,
    Stats,
    Writer,
    report_eviction,
)
from agent.drift.config import DriftConfig
from agent.errors import DecisionLogError

log = logging.getLogger(__name__)

_DROP_LOG_INTERVAL_S = 1.0
_MIB = 1024 * 1024
_DAY_S = 86_400.0


class DecisionLog:
    """One SQLite decision log under ``state_dir``; see docs/decision-log.md.

    ``on_alarm(kind, message)`` is called (from the opening thread or the writer thread)
    when the log was corrupt (or not a decision log at all) and moved aside, when
    un-uploaded decisions had to be deleted for the disk budget, and when a batch could
    not be written.

    ``drift`` (default: on, hourly buckets) is what the writer counts of each decision for
    the fleet's drift check (:mod:`agent.drift`); ``rng`` draws the review sample of
    'pass' thumbnails (``pass_sample``; seeded in tests).
    """

    def __init__(
        self,
        state_dir: Path,
        config: DecisionLogConfig,
        *,
        device_id: str,
        on_alarm: Callable[[str, str], None] | None = None,
        drift: DriftConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.config = config
        self.drift = drift or DriftConfig()
        self._rng = rng or random.Random()  # noqa: S311 - a sample, not a secret
        from agent.drift.recorder import DriftStats  # noqa: PLC0415 - a cycle at import

        self._drift_stats = DriftStats()
        self._frames_pending = 0
        self._frame_bound = int(self.drift.frame_queue_mb * _MIB)
        self._drift_frames = self.drift.enabled and self.drift.image_stats
        self.device_id = device_id
        self._on_alarm = on_alarm
        self._queue: Handoff[Item] = Handoff(config.queue_bound, config.batch_size)
        self._stats = Stats()
        self._store = thumbs.ThumbnailStore(self.state_dir)
        self._writer: Writer | None = None
        self._lock = threading.Lock()  # the drop counters and the pending image bytes
        self._last_drop_log = 0.0
        self._drops_unlogged = 0
        self._thumb_pending = 0
        self._thumb_bound = int(config.thumbnail_queue_mb * _MIB)

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self.state_dir / self.config.path

    def open(self) -> None:
        """Check the file (moving aside a corrupt one, one that is not a regular file, or
        a database of another schema), migrate, apply retention, start the writer thread.

        Raises:
            DecisionLogError: already open, or the file can't be created or set up.
        """
        if self._writer is not None:
            raise DecisionLogError(f"decision log {self.path} is already open")
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DecisionLogError(f"can't create the directory of {path}: {e}") from e
        odd = integrity.not_a_file(path)
        if odd is not None:
            self._move_aside(path, integrity.NOT_A_FILE, ALARM_FOREIGN, f"is {odd}")
        for stray in integrity.move_stray_side_files(path):
            log.warning("moved %s, left without its database, aside", stray)
        problem = integrity.check(path)
        if problem is not None:
            self._move_aside(
                path, integrity.CORRUPT, ALARM_CORRUPT, f"failed its integrity check ({problem})"
            )
        else:
            other = integrity.foreign(path)
            if other is not None:
                self._move_aside(
                    path, integrity.FOREIGN, ALARM_FOREIGN, f"is not a decision log ({other})"
                )
        conn = connect_writer(path)
        try:
            applied = schema.migrate(conn)
            if applied:
                log.info("decision log %s: applied migrations %s", path, ", ".join(applied))
            self._store.scan(conn, schema.TABLE)
            retention = Retention(
                conn,
                path,
                self._store,
                budget_bytes=int(self.config.budget_mb * _MIB),
                max_age_s=self.config.max_age_days * _DAY_S,
            )
            result = retention.run(time.time())
        except Exception as e:
            conn.close()
            raise DecisionLogError(f"can't set up decision log {path}: {e}") from e
        self._stats.add_retention(result)
        report_eviction(result, retention.budget_bytes, self._alarm)
        from agent.drift.recorder import DriftRecorder  # noqa: PLC0415 - a cycle at import

        writer = Writer(
            conn,
            self._queue,
            self.config,
            self.device_id,
            self._store,
            retention,
            self._stats,
            self._alarm,
            self._release_thumbnail,
            DriftRecorder(self.drift, self._drift_stats),
        )
        writer.start()
        self._writer = writer

    def append(self, record: DecisionRecord) -> str:
        """Queue ``record`` for writing; returns its id (assigned here when empty).

        Never waits for the disk. When the queue is full it waits at most
        ``append_timeout_s``, then drops the record: counted in ``stats()["dropped"]``
        and logged at error level (at most one line a second, with the count).

        Raises:
            DecisionLogError: the log is not open, or the decision time can't make an id.
        """
        if self._writer is None:
            raise DecisionLogError(f"decision log {self.path} is not open")
        if not record.id:
            try:
                record.id = new_id(record.decision_time)
            except (ValueError, TypeError) as e:
                raise DecisionLogError(f"decision from '{record.source}': {e}") from e
        if record.thumbnail is not None:
            self._admit_thumbnail(record)
        if not self._queue.put(record, self.config.append_timeout_s):
            self._drop(record)
        return record.id

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every record appended before this call is committed (or timeout)."""
        return self._command(Command("flush"), timeout_s)

    def mark_uploaded(
        self, ids: Sequence[str], timeout_s: float = 5.0, *, state: int = UPLOADED
    ) -> None:
        """Set ``uploaded`` on these decisions (committed when this returns): to
        :data:`UPLOADED` (the fleet has them), :data:`QUEUED` (in the uplink's outbox) or
        :data:`NOT_UPLOADED` (to be queued again).

        Raises:
            DecisionLogError: the log is not open, or the update failed or timed out.
        """
        if state not in (NOT_UPLOADED, UPLOADED, QUEUED):
            raise DecisionLogError(f"uploaded state {state!r} is not 0, 1 or 2")
        if self._writer is None:
            raise DecisionLogError(f"decision log {self.path} is not open")
        command = Command("mark_uploaded", ids=tuple(ids), state=state)
        if not self._command(command, timeout_s):
            raise DecisionLogError(
                f"marking {len(command.ids)} decisions uploaded={state} in {self.path} "
                f"did not finish within {timeout_s} s"
            )
        if command.error:
            raise DecisionLogError(
                f"marking decisions uploaded={state} in {self.path} failed: {command.error}"
            )

    def close(self, timeout_s: float = 5.0) -> None:
        """Commit what is queued and stop the writer thread (waits at most ``timeout_s``)."""
        writer = self._writer
        if writer is None:
            return
        deadline = time.monotonic() + timeout_s
        self._command(Command("stop"), timeout_s)
        writer.join(max(0.0, deadline - time.monotonic()))
        self._writer = None
        if writer.is_alive():
            log.error(
                "decision log writer did not stop within %.1f s; %d records still queued",
                timeout_s,
                len(self._queue),
            )

    def stats(self) -> dict[str, int | float]:
        """Counters and sizes: writer_alive, queued, written, dropped, batches, evicted,
        evicted_unuploaded, thumbnails, db_bytes, ... (see docs/decision-log.md)."""
        s = self._stats
        db = _size(self.path)
        wal = _size(Path(f"{self.path}-wal"))
        writer = self._writer
        return {
            "writer_alive": int(writer is not None and writer.is_alive()),
            "queued": len(self._queue),
            "written": s.written,
            "dropped": s.dropped,
            "lost": s.lost,
            "duplicates": s.duplicates,
            "batches": s.batches,
            "write_errors": s.write_errors,
            "evicted": s.evicted,
            "aged": s.aged,
            "evicted_unuploaded": s.evicted_unuploaded,
            "retention_runs": s.retention_runs,
            "thumbnails": s.thumbnails,
            "thumbnail_errors": s.thumbnail_errors,
            "thumbnails_dropped": s.thumbnails_dropped,
            "marked_uploaded": s.marked_uploaded,
            "last_batch_ms": s.last_batch_ms,
            "db_bytes": db + wal,
            "wal_bytes": wal,
            "thumbnail_bytes": self._store.bytes,
            "drift_decisions": self._drift_stats.decisions,
            "drift_frames": self._drift_stats.frames,
            "drift_frames_skipped": self._drift_stats.frames_skipped,
            "drift_errors": self._drift_stats.errors,
            "drift_flushes": self._drift_stats.flushes,
        }

    def __enter__(self) -> DecisionLog:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _command(self, command: Command, timeout_s: float) -> bool:
        writer = self._writer
        if writer is None or not writer.is_alive():
            return False
        self._queue.put_urgent(command)
        return command.done.wait(max(0.0, timeout_s))

    def _admit_thumbnail(self, record: DecisionRecord) -> None:
        """Keep the image as a thumbnail if wanted (or drawn into the review sample of
        passes) and the queued thumbnail bytes stay in bound; else, with drift input
        statistics on, for those only while the queued frame bytes stay in theirs."""
        cfg = self.config
        nbytes = getattr(record.thumbnail, "nbytes", 0)  # not an array: the writer says so
        if thumbs.keep(cfg.thumbnails, record.outcome, cfg.pass_sample, self._rng):
            with self._lock:
                if self._thumb_pending + nbytes <= self._thumb_bound:
                    self._thumb_pending += nbytes
                    return
                self._stats.thumbnails_dropped += 1
            log.warning("decision %s queued without its thumbnail: image queue full", record.id)
        if self._drift_frames:
            with self._lock:
                if self._frames_pending + nbytes <= self._frame_bound:
                    self._frames_pending += nbytes
                    record.frame_only = True
                    return
                self._drift_stats.frames_skipped += 1
        record.thumbnail = None

    def _release_thumbnail(self, nbytes: int, *, frame_only: bool = False) -> None:
        with self._lock:
            if frame_only:
                self._frames_pending -= nbytes
            else:
                self._thumb_pending -= nbytes

    def _drop(self, record: DecisionRecord) -> None:
        if record.thumbnail is not None:
            nbytes = getattr(record.thumbnail, "nbytes", 0)
            self._release_thumbnail(nbytes, frame_only=record.frame_only)
        now = time.monotonic()
        with self._lock:
            self._stats.dropped += 1
            self._drops_unlogged += 1
            if now - self._last_drop_log < _DROP_LOG_INTERVAL_S:
                return
            self._last_drop_log = now
            count, self._drops_unlogged = self._drops_unlogged, 0
        log.error(
            "decision log queue full (%d records): dropped %d decisions, the last %s; "
            "%d dropped since open",
            self.config.queue_bound,
            count,
            record.id,
            self._stats.dropped,
        )

    def _move_aside(self, path: Path, why: str, alarm: str, what: str) -> None:
        moved = integrity.move_aside(path, why)
        self._alarm(
            alarm, f"decision log {path} {what}; moved to {moved.name} and started a new one"
        )

    def _alarm(self, kind: str, message: str) -> None:
        log.error("decision log alarm %s: %s", kind, message)
        if self._on_alarm is None:
            return
        try:
            self._on_alarm(kind, message)
        except Exception:
            log.exception("decision log on_alarm callback failed for %s", kind)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
