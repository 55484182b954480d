"""The decision log writer's drift hook: counts each written decision
(:class:`agent.drift.accumulator.DriftAccumulator`) and adds the counts to the
``drift_hours`` table (:func:`agent.drift.store.merge_into`) every ``flush_interval_s``
or ``flush_decisions`` decisions, on the writer's thread and connection.

Drift is a by-product: a decision it can't count, or counts it can't store, is logged and
counted (``drift_errors``), never a reason to lose or delay a decision row. Counts that
could not be stored are kept in memory and tried again at the next flush.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.drift.accumulator import DriftAccumulator
from agent.drift.config import DriftConfig
from agent.drift.store import merge_into

if TYPE_CHECKING:
    from agent.decisionlog.record import DecisionRecord

log = logging.getLogger(__name__)

_ERROR_LOG_INTERVAL_S = 60.0


@dataclass
class DriftStats:
    """Counters of the drift hook (written by the writer thread; the frame counter by
    ``append``'s admission of frames)."""

    decisions: int = 0
    frames: int = 0
    frames_skipped: int = 0
    errors: int = 0
    flushes: int = 0
    rows_written: int = 0


class DriftRecorder:
    """Counts decisions and stores the counts; use from the writer thread only."""

    def __init__(self, config: DriftConfig, stats: DriftStats | None = None) -> None:
        self.config = config
        self.stats = stats or DriftStats()
        self.acc = DriftAccumulator(config.period_s, image_stats=config.image_stats)
        self._due = time.monotonic() + config.flush_interval_s
        self._last_error_log = -_ERROR_LOG_INTERVAL_S

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    @property
    def pending(self) -> int:
        """Decisions counted in memory, not yet in drift_hours."""
        return self.acc.pending

    def observe(self, record: DecisionRecord, frame: Any = None) -> None:
        """Count ``record`` (``frame``: its input image, or None); never raises."""
        if not self.config.enabled:
            return
        try:
            self.acc.add(
                model_name=record.model_name,
                model_version=record.model_version,
                line=record.line,
                source=record.source,
                decision_time=record.decision_time,
                outcome=record.outcome,
                outputs=record.outputs,
                frame=frame,
            )
        except Exception as e:  # noqa: BLE001 - any bad field: count, log, go on
            self._error(f"decision {record.id} not counted for drift: {type(e).__name__}: {e}")
            return
        self.stats.decisions += 1
        if frame is not None and self.config.image_stats:
            self.stats.frames += 1

    def due(self) -> bool:
        """Whether the counts should be stored now."""
        return self.acc.pending > 0 and (
            self.acc.pending >= self.config.flush_decisions or time.monotonic() >= self._due
        )

    def flush(self, conn: sqlite3.Connection) -> None:
        """Add the counts to drift_hours now; never raises (on failure they are kept)."""
        self._due = time.monotonic() + self.config.flush_interval_s
        if not self.acc.pending:
            return
        rows = self.acc.take()
        try:
            written = merge_into(conn, rows, self.config.period_s, time.time())
        except Exception as e:  # noqa: BLE001 - a locked or full disk: keep, try again
            self.acc.put_back(rows.items())
            self._error(f"drift counts of {len(rows)} buckets not stored: {type(e).__name__}: {e}")
            return
        self.stats.flushes += 1
        self.stats.rows_written += written

    def _error(self, message: str) -> None:
        self.stats.errors += 1
        now = time.monotonic()
        if now - self._last_error_log >= _ERROR_LOG_INTERVAL_S:
            self._last_error_log = now
            log.error("%s (%d drift errors so far)", message, self.stats.errors)
