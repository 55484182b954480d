"""The uplink's handle on the decision log when it runs in the companion process: it reads
the rows waiting for upload and sets their ``uploaded`` state on a connection of its own.

SQLite in WAL mode keeps one writer at a time: an update here waits (up to the busy
timeout) for the hot path's writer to commit its batch, and the writer waits for an
update the same way. Neither is on the hot path: the pipelines only put records on the
writer's queue.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from agent.decisionlog.config import DecisionLogConfig
from agent.decisionlog.connection import connect_writer, transaction
from agent.decisionlog.schema import NOT_UPLOADED, QUEUED, TABLE, UPLOADED
from agent.errors import DecisionLogError

_UPDATE_CHUNK = 500


class UploadMarks:
    """``path``, ``state_dir`` and ``mark_uploaded`` of a decision log another process
    writes (the same calls the uplink makes on :class:`agent.decisionlog.DecisionLog`)."""

    def __init__(self, state_dir: Path, config: DecisionLogConfig) -> None:
        self.state_dir = Path(state_dir)
        self.config = config
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self.marked = 0

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self.state_dir / self.config.path

    def mark_uploaded(
        self, ids: Sequence[str], timeout_s: float = 5.0, *, state: int = UPLOADED
    ) -> None:
        """Set ``uploaded`` on these decisions, committed when this returns.

        Raises:
            DecisionLogError: a state other than 0, 1 or 2, no log yet, or the update
                failed (the log stayed locked for longer than ``timeout_s``).
        """
        if state not in (NOT_UPLOADED, UPLOADED, QUEUED):
            raise DecisionLogError(f"uploaded state {state!r} is not 0, 1 or 2")
        chunks = [list(ids[i : i + _UPDATE_CHUNK]) for i in range(0, len(ids), _UPDATE_CHUNK)]
        deadline = time.monotonic() + timeout_s
        with self._lock:
            conn = self._connection()
            try:
                conn.execute(f"PRAGMA busy_timeout={int(max(0.0, timeout_s) * 1000)}")
                with transaction(conn):
                    for chunk in chunks:
                        conn.execute(
                            f"UPDATE {TABLE} SET uploaded = ? "  # noqa: S608 - placeholders only
                            f"WHERE id IN ({', '.join('?' for _ in chunk)})",
                            [state, *chunk],
                        )
            except sqlite3.Error as exc:
                self._close()
                late = " (timed out)" if time.monotonic() > deadline else ""
                raise DecisionLogError(
                    f"marking {len(ids)} decisions uploaded={state} in {self.path} "
                    f"failed{late}: {exc}"
                ) from exc
        if state == UPLOADED:
            self.marked += len(ids)

    def close(self) -> None:
        with self._lock:
            self._close()

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
