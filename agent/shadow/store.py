"""Writing shadow comparisons to the decision log (table ``shadow_results``) and keeping
the frame of each disagreement as a JPEG.

One :class:`ShadowStore` per shadow thread, on a connection of its own to the decision
log's SQLite file (WAL, a busy timeout): the shadow thread waits for the disk, the live
path never does. A row per compared frame, keyed by the live decision's id; rows are
committed in batches (:data:`BATCH_ROWS`, or when the oldest has waited
:data:`FLUSH_S`, and at close), so a shadow at many frames a second costs a commit a
second, not one a frame.

Thumbnails go to ``<state_dir>/shadow-thumbnails/YYYY-MM-DD/<decision id>.jpg`` (their
own directory: the decision log's start-up scan deletes files under ``thumbnails/`` that no
decision refers to), encoded like the decision log's (same size and quality settings,
temp file and rename), within :data:`THUMBNAIL_BUDGET_BYTES`; past it a disagreement is
stored without its frame and counted.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.decisionlog import schema
from agent.decisionlog import thumbnails as thumbs
from agent.decisionlog.config import DecisionLogConfig
from agent.decisionlog.connection import connect_writer, transaction
from agent.decisionlog.encode import to_json
from agent.shadow.stats import ShadowKey

log = logging.getLogger(__name__)

THUMBNAIL_DIR = "shadow-thumbnails"
THUMBNAIL_BUDGET_BYTES = 64 * 1024 * 1024
"""Disk the shadow's thumbnails may take together; past it none is kept."""
BATCH_ROWS = 64
"""Rows committed together at most."""
FLUSH_S = 1.0
"""The longest a row waits for its commit (while the shadow thread runs)."""
SEED_LIMIT = 1_000_000
"""The most stored comparisons read back to seed a candidate's totals."""

_NAMES = ", ".join(schema.SHADOW_COLUMNS)
_MARKS = ", ".join("?" for _ in schema.SHADOW_COLUMNS)
INSERT_SQL = f"INSERT OR IGNORE INTO {schema.SHADOW_TABLE} ({_NAMES}) VALUES ({_MARKS})"  # noqa: S608 - fixed names


@dataclass
class ShadowRow:
    """One row of ``shadow_results``, fields in :data:`schema.SHADOW_COLUMNS` order."""

    decision_id: str
    ts: float
    source: str
    line: str
    live_model: str
    live_version: str
    live_outcome: str
    live_ms: float
    live_outputs: dict[str, Any]
    shadow_model: str
    shadow_version: str
    shadow_release: int | None
    shadow_digest: str
    shadow_outcome: str
    shadow_ms: float
    shadow_outputs: dict[str, Any]
    agree: bool
    iou_threshold: float
    matched: int
    unmatched_live: int
    unmatched_shadow: int
    thumbnail: str | None = None
    uploaded: int = schema.NOT_UPLOADED

    def values(self) -> tuple[Any, ...]:
        v = list(astuple(self))
        names = list(schema.SHADOW_COLUMNS)
        v[names.index("live_outputs")] = to_json(self.live_outputs)
        v[names.index("shadow_outputs")] = to_json(self.shadow_outputs)
        v[names.index("agree")] = int(self.agree)
        return tuple(v)


def thumbnail_relpath(decision_id: str, ts: float) -> str:
    """A disagreement's frame, relative to the state dir (UTC date of the comparison)."""
    day = time.strftime("%Y-%m-%d", time.gmtime(ts))
    return f"{THUMBNAIL_DIR}/{day}/{decision_id}.jpg"


class ShadowStore:
    """Rows and thumbnails of one shadow thread. Use from one thread at a time.

    Raises (constructor):
        DecisionLogError: the decision log's file can't be opened or set up.
    """

    def __init__(self, state_dir: Path, config: DecisionLogConfig) -> None:
        self.state_dir = Path(state_dir)
        self.config = config
        self.path = self.state_dir / config.path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = connect_writer(self.path)
        if not _has_table(self.conn, schema.SHADOW_TABLE):  # nobody opened the log yet
            schema.migrate(self.conn)
        self._thumbs = thumbs.ThumbnailStore(self.state_dir)
        self._thumbs.bytes = _dir_bytes(self.state_dir / THUMBNAIL_DIR)
        self._batch: list[tuple[Any, ...]] = []
        self._batch_at = 0.0
        self.written = 0
        self.thumbnails = 0
        self.thumbnails_dropped = 0
        self.errors = 0

    def write(self, row: ShadowRow, frame: np.ndarray | None = None) -> None:
        """Queue ``row`` for the next commit (committed now when the batch is full or its
        oldest row waited :data:`FLUSH_S`); with ``frame`` (an image: HxWx3 BGR or HxW),
        first keep it as the row's thumbnail."""
        if frame is not None:
            row.thumbnail = self._thumbnail(row, frame)
        if not self._batch:
            self._batch_at = time.monotonic()
        self._batch.append(row.values())
        self.flush_due()

    def flush_due(self) -> None:
        """Commit the queued rows if the batch is full or its oldest row waited long
        enough (call it now and then while idle)."""
        if len(self._batch) >= BATCH_ROWS or (
            self._batch and time.monotonic() - self._batch_at >= FLUSH_S
        ):
            self.flush()

    def flush(self) -> int:
        """Commit the queued rows; how many were written. A failed batch is logged,
        counted (``errors``) and dropped: the comparisons are still in the totals."""
        batch, self._batch = self._batch, []
        if not batch:
            return 0
        try:
            with transaction(self.conn):
                self.conn.executemany(INSERT_SQL, batch)
        except sqlite3.Error as e:
            self.errors += len(batch)
            log.error("%d shadow results not written: %s", len(batch), e)  # noqa: TRY400
            return 0
        self.written += len(batch)
        return len(batch)

    def seed_rows(self, key: ShadowKey) -> list[tuple[float, float, int]]:
        """``(shadow_ms, live_ms, agree)`` of the comparisons stored for candidate ``key``."""
        rows = self.conn.execute(
            f"SELECT shadow_ms, live_ms, agree FROM {schema.SHADOW_TABLE} "  # noqa: S608
            "WHERE shadow_model = ? AND shadow_version = ? AND shadow_digest = ? "
            "AND shadow_release IS ? LIMIT ?",
            (key.bundle, key.version, key.digest, key.release, SEED_LIMIT),
        ).fetchall()
        return [(float(a), float(b), int(c)) for a, b, c in rows]

    def close(self) -> None:
        """Commit what is queued and close the connection."""
        try:
            self.flush()
        finally:
            self.conn.close()

    def _thumbnail(self, row: ShadowRow, frame: np.ndarray) -> str | None:
        if self._thumbs.bytes >= THUMBNAIL_BUDGET_BYTES:
            self.thumbnails_dropped += 1
            return None
        image = frame[:, :, 0] if frame.ndim == 3 and frame.shape[2] == 1 else frame
        cfg = self.config
        try:
            data = thumbs.encode_jpeg(
                image, cfg.thumbnail_max_side, cfg.thumbnail_max_bytes, cfg.jpeg_quality
            )
            rel = thumbnail_relpath(row.decision_id, row.ts)
            self._thumbs.write(rel, data)
        except (ValueError, OSError) as e:
            self.thumbnails_dropped += 1
            log.warning(
                "shadow result of decision %s kept without its frame: %s", row.decision_id, e
            )
            return None
        self.thumbnails += 1
        return rel


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return row.fetchone() is not None


def _dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += (Path(dirpath) / f).stat().st_size
            except OSError:
                continue
    return total
