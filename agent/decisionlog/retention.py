"""Retention: age and disk budget, oldest first, uploaded rows before un-uploaded ones.

Runs on the writer's connection (at open and every ``retention_interval_s`` on the
writer thread). Usage is the database file, its WAL and the thumbnails. Rows not yet
uploaded are kept past their age, and are deleted only when the budget is still
exceeded after every uploaded row is gone.

The model-quality tables go with the decisions: ``shadow_results`` (and the frame a
disagreement keeps) and ``drift_hours`` rows past the age are deleted once uploaded; over
the budget, uploaded ones of any age and un-uploaded ones past the age go before any
decision does.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from agent.decisionlog.connection import BUSY_TIMEOUT_S, WAL_LIMIT_BYTES, transaction
from agent.decisionlog.schema import DRIFT_TABLE, SHADOW_TABLE, TABLE, UPLOADED
from agent.decisionlog.thumbnails import ThumbnailStore

log = logging.getLogger(__name__)

_MAX_CHUNK = 5_000
_MAX_ROUNDS = 3
_MAX_CHUNKS = 10_000
_CHECKPOINT_BUSY_MS = 200


@dataclass
class RetentionResult:
    """What one run deleted, and whether usage still exceeds the budget."""

    aged: int = 0
    quality_deleted: int = 0
    """``shadow_results`` and ``drift_hours`` rows deleted."""
    evicted: int = 0
    evicted_unuploaded: int = 0
    oldest_unuploaded_evicted: float | None = None
    over_budget: bool = False

    @property
    def deleted(self) -> int:
        return self.aged + self.evicted + self.evicted_unuploaded


class Retention:
    """Applies the age and budget limits to one log's database and thumbnails."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        db_path: Path,
        thumbnails: ThumbnailStore,
        budget_bytes: int,
        max_age_s: float,
    ) -> None:
        self.conn = conn
        self.db_path = db_path
        self.thumbnails = thumbnails
        self.budget_bytes = budget_bytes
        self.max_age_s = max_age_s
        self._over_budget = False  # warned about it already

    def usage(self) -> int:
        """Bytes on disk now: database file, WAL and thumbnails."""
        return _size(self.db_path) + _size(Path(f"{self.db_path}-wal")) + self.thumbnails.bytes

    def _excess(self) -> int:
        """Bytes over budget that deleting rows can win back. A WAL a reader keeps from
        being checkpointed counts only up to its usual size: deleting rows would grow it."""
        wal = min(_size(Path(f"{self.db_path}-wal")), WAL_LIMIT_BYTES)
        return _size(self.db_path) + wal + self.thumbnails.bytes - self.budget_bytes

    def run(self, now: float) -> RetentionResult:
        """Delete uploaded rows past their age, then the oldest rows while over budget."""
        result = RetentionResult()
        cutoff = now - self.max_age_s
        for _ in range(_MAX_CHUNKS):
            n, _, _ = self._delete_oldest("uploaded = 1 AND decision_time < ?", (cutoff,))
            result.aged += n
            if n < _MAX_CHUNK:
                break
        result.quality_deleted += self._delete_quality(cutoff, uploaded_only=True)
        if result.aged or result.quality_deleted:
            self._compact()
        for round_ in range(_MAX_ROUNDS):
            if self.usage() <= self.budget_bytes:
                break
            if round_ == 0:  # past the budget: quality rows go before decisions do
                result.quality_deleted += self._delete_quality(cutoff, uploaded_only=False)
            self._compact()  # a checkpoint alone may bring the WAL back under budget
            excess = self._excess()
            if excess <= 0:
                break
            if not self._shrink_used(self._used() - excess, result):
                break  # nothing left to delete
            self._compact()
        result.over_budget = self.usage() > self.budget_bytes
        if result.over_budget and not self._over_budget:
            log.warning(
                "decision log uses %d bytes, over its budget of %d bytes, and can't delete "
                "more (an open reader may hold the WAL)",
                self.usage(),
                self.budget_bytes,
            )
        self._over_budget = result.over_budget
        return result

    def _delete_quality(self, cutoff: float, *, uploaded_only: bool) -> int:
        """Delete ``shadow_results`` and ``drift_hours`` rows past ``cutoff`` that were
        uploaded (``uploaded_only``); else uploaded ones of any age and the rest past
        ``cutoff``. Returns the rows deleted."""
        if uploaded_only:
            where, params = "uploaded = ? AND {t} < ?", (UPLOADED, cutoff)
        else:
            where, params = "uploaded = ? OR {t} < ?", (UPLOADED, cutoff)
        shadow_where = where.format(t="ts")
        # A drift bucket is past the age when it started before the cutoff.
        drift_where = where.format(t="hour")
        files = [
            str(r[0])
            for r in self.conn.execute(
                f"SELECT thumbnail FROM {SHADOW_TABLE} "  # noqa: S608 - fixed names
                f"WHERE ({shadow_where}) AND thumbnail IS NOT NULL",
                params,
            )
        ]
        with transaction(self.conn):
            n = self.conn.execute(
                f"DELETE FROM {SHADOW_TABLE} WHERE {shadow_where}",  # noqa: S608
                params,
            ).rowcount
            n += self.conn.execute(
                f"DELETE FROM {DRIFT_TABLE} WHERE {drift_where}",  # noqa: S608
                params,
            ).rowcount
        self._unlink_shadow_frames(files)
        return int(n)

    def _unlink_shadow_frames(self, rels: list[str]) -> None:
        """Remove the frames deleted shadow rows kept (paths under the state directory)."""
        root = self.thumbnails.state_dir
        for rel in rels:
            path = Path(rel)
            if path.is_absolute() or ".." in path.parts:
                log.warning("shadow frame %r is outside the state directory; left alone", rel)
                continue
            try:
                (root / path).unlink()
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("shadow frame %s not deleted: %s", rel, e)

    def _used(self) -> int:
        """Bytes of database pages in use (free pages not counted) plus thumbnails."""
        pages, free, size = (
            self.conn.execute(f"PRAGMA {p}").fetchone()[0]
            for p in ("page_count", "freelist_count", "page_size")
        )
        return int((pages - free) * size) + self.thumbnails.bytes

    def _shrink_used(self, target: int, result: RetentionResult) -> bool:
        """Delete oldest rows (uploaded first) until used bytes <= target; False if none."""
        rows = int(self.conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0])  # noqa: S608
        deleted_any = False
        for _ in range(_MAX_CHUNKS):
            used = self._used()
            if used <= target or rows <= 0:
                break
            # Rows are about the same size: aim at the target, then close in on it.
            chunk = min(_MAX_CHUNK, max(1, math.ceil((used - target) * rows / used)))
            n, _, _ = self._delete_oldest("uploaded = 1", (), chunk)
            result.evicted += n
            if n == 0:
                n, oldest, _ = self._delete_oldest("uploaded <> 1", (), chunk)
                result.evicted_unuploaded += n
                if result.oldest_unuploaded_evicted is None:
                    result.oldest_unuploaded_evicted = oldest
            if n == 0:
                break
            rows -= n
            deleted_any = True
        return deleted_any

    def _delete_oldest(
        self, where: str, params: tuple[float, ...], limit: int = _MAX_CHUNK
    ) -> tuple[int, float | None, int]:
        """Delete up to ``limit`` oldest rows matching ``where`` and their thumbnails.

        Returns (rows deleted, decision time of the oldest, thumbnail bytes freed).
        """
        rows = self.conn.execute(
            f"SELECT rowid, decision_time, thumbnail FROM {TABLE} WHERE {where} "  # noqa: S608
            "ORDER BY decision_time LIMIT ?",
            (*params, limit),
        ).fetchall()
        if not rows:
            return 0, None, 0
        with transaction(self.conn):
            self.conn.executemany(
                f"DELETE FROM {TABLE} WHERE rowid = ?",  # noqa: S608
                [(r[0],) for r in rows],
            )
        freed = self.thumbnails.delete(r[2] for r in rows if r[2])
        return len(rows), float(rows[0][1]), freed

    def _compact(self) -> None:
        """Give free pages back to the disk and fold the WAL into the database."""
        self.conn.execute("PRAGMA incremental_vacuum").fetchall()
        self.conn.execute(f"PRAGMA busy_timeout={_CHECKPOINT_BUSY_MS}")
        try:
            busy, _, _ = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            self.conn.execute(f"PRAGMA busy_timeout={int(1000 * BUSY_TIMEOUT_S)}")
        if busy:
            log.info("decision log checkpoint held up by a reader; WAL truncated later")


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
