"""The outbox: every record for the fleet (health reports, events, decision-upload
batches, decision thumbnails, model-quality batches) is written here, durably, before it
is sent, and deleted only when the broker's PUBACK says success (:mod:`agent.uplink.drain`).
paho keeps unacknowledged messages in memory only; this SQLite file is what survives a
SIGKILL, a power cut or a week offline.

It is bounded: ``max_bytes`` of payload. To admit a record past it, whole records are
dropped oldest first in ``drop_order`` (default: thumbnails first, then quality batches,
health, events, decisions last); a record that can't fit even then is itself dropped.
Every drop is counted by kind, and the first one after a quiet spell raises the
``outbox_dropping`` alarm; the alarm clears when the outbox is back under half its budget.
A full disk (SQLite's ``SQLITE_FULL``) is handled the same way: drop by policy, try
again, and count the record lost only if that fails too. Before that point, when the
file system is down to ``disk_reserve_bytes``, the outbox stops growing its file and
makes room the same way, so the policy decides what goes, not whichever write hits the
full disk first.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.decisionlog import integrity
from agent.errors import AgentError
from agent.kernel.errors import EdgefleetError

log = logging.getLogger(__name__)

KIND_HEALTH = "health"
KIND_EVENT = "event"
KIND_DECISIONS = "decisions"
KIND_THUMBNAIL = "thumbnail"
KIND_QUALITY = "quality"
"""Shadow comparisons and closed drift buckets (:mod:`agent.uplink.quality`)."""
KINDS = (KIND_THUMBNAIL, KIND_QUALITY, KIND_HEALTH, KIND_EVENT, KIND_DECISIONS)
DEFAULT_DROP_ORDER = KINDS
"""Thumbnails first (the device keeps its own copy), then quality batches (their rows
stay in the decision log and are queued again), telemetry, decisions last."""
ALARM_DROPPING = "outbox_dropping"
ROW_OVERHEAD_BYTES = 96
"""Counted per record on top of its payload (its row: seq, kind, topic, ids, times)."""
_BUSY_TIMEOUT_S = 5.0
_FULL_RETRIES = 8
DISK_RESERVE_BYTES = 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    ids TEXT,
    created REAL NOT NULL,
    nbytes INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_outbox_kind_seq ON outbox (kind, seq);
"""


def full_drop_order(order: Sequence[str]) -> tuple[str, ...]:
    """``order`` as a drop order of every kind: each of :data:`KINDS` once, where
    ``thumbnail`` may be left out (an order written before thumbnails were uploaded) and
    then comes first, and ``quality`` may be left out (an order written before quality
    batches) and then comes right after ``thumbnail``.

    Raises:
        ValueError: a kind unknown, repeated or missing.
    """
    given = list(order)
    if KIND_THUMBNAIL not in given:
        given.insert(0, KIND_THUMBNAIL)
    if KIND_QUALITY not in given:
        given.insert(given.index(KIND_THUMBNAIL) + 1, KIND_QUALITY)
    if sorted(given) != sorted(KINDS):
        raise ValueError(f"must name each of {', '.join(KINDS)} once, got {list(order)}")
    return tuple(given)


class OutboxError(AgentError):
    """The outbox can't be opened or written.

    Attributes:
        path: the outbox file.
        reason: what failed.
    """

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"outbox {path}: {reason}")


@dataclass(frozen=True)
class Entry:
    """One record waiting for its PUBACK."""

    seq: int
    kind: str
    topic: str
    payload: bytes
    ids: tuple[str, ...]
    """For a decision batch: the decision ids in it; for a quality batch, its rows' keys."""
    created: float

    @property
    def size(self) -> int:
        """What it counts against the budget."""
        return len(self.payload) + ROW_OVERHEAD_BYTES


Alarm = Callable[[str, str], None]
Dropped = Callable[[Entry], None]


class Outbox:
    """A durable FIFO of records for the fleet (see the module docstring).

    Safe to use from several threads (one connection behind a lock; each call is one
    short transaction, committed with ``synchronous=FULL`` before it returns).

    Args:
        path: the SQLite file (created with its directory's parent existing).
        max_bytes: the budget for payloads plus :data:`ROW_OVERHEAD_BYTES` per record.
        drop_order: kinds in the order they are dropped when over budget.
        on_alarm: called with (kind, message) when dropping starts.
        on_dropped: called with each dropped record (a decision batch's rows go back to
            the decision log's queue).
        disk_reserve_bytes: free space kept on the file system; below it records are
            dropped by policy to make room in the file instead of growing it.

    Raises:
        OutboxError: ``drop_order`` is not an order of :data:`KINDS` (see
            :func:`full_drop_order`).
    """

    def __init__(
        self,
        path: Path,
        max_bytes: int,
        *,
        drop_order: Sequence[str] = DEFAULT_DROP_ORDER,
        on_alarm: Alarm | None = None,
        on_dropped: Dropped | None = None,
        disk_reserve_bytes: int = DISK_RESERVE_BYTES,
    ) -> None:
        try:
            order = full_drop_order(drop_order)
        except ValueError as exc:
            raise OutboxError(path, f"drop order: {exc}") from exc
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.drop_order = order
        self.on_alarm = on_alarm
        self.on_dropped = on_dropped
        self.disk_reserve_bytes = disk_reserve_bytes
        self.dropped: Counter[str] = Counter()
        self.put_count: Counter[str] = Counter()
        self.deleted = 0
        self.full_errors = 0
        self.dropping = False
        self.alarms = 0
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._bytes = 0
        self._pending: Counter[str] = Counter()
        self._alarm_due: str | None = None

    # -- life cycle --------------------------------------------------------------------

    def open(self) -> Outbox:
        """Open (or create) the file; one found corrupt is moved aside and logged.

        Raises:
            OutboxError: the file can't be opened or set up.
        """
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            for stray in integrity.move_stray_side_files(path):
                log.warning("moved %s, left without its outbox, aside", stray)
            problem = integrity.check(path)
            if problem is not None:
                moved = integrity.move_aside(path)
                log.error(
                    "outbox %s failed its integrity check (%s); moved to %s", path, problem, moved
                )
        except EdgefleetError as exc:
            raise OutboxError(path, str(exc)) from exc
        try:
            conn = sqlite3.connect(
                str(path), isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S
            )
            if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
                conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            # A rollback journal kept in place (PERSIST), not WAL: its blocks stay
            # allocated, so on a full disk a record can still be deleted to make room.
            conn.execute("PRAGMA journal_mode=PERSIST")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)
            rows = conn.execute("SELECT kind, count(*), sum(nbytes) FROM outbox GROUP BY kind")
            for kind, count, nbytes in rows:
                self._pending[str(kind)] = int(count)
                self._bytes += int(nbytes or 0) + int(count) * ROW_OVERHEAD_BYTES
        except sqlite3.Error as exc:
            raise OutboxError(path, f"can't open: {exc}") from exc
        self._conn = conn
        return self

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Outbox:
        return self.open()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------------

    def put(self, kind: str, topic: str, payload: bytes, ids: Sequence[str] = ()) -> int | None:
        """Store a record durably; its sequence number, or None when it had to be dropped
        (counted; the alarm raised).

        Raises:
            OutboxError: unknown kind, or the file can't be written (other than full).
        """
        if kind not in KINDS:
            raise OutboxError(self.path, f"unknown record kind {kind!r} (known: {KINDS})")
        size = len(payload) + ROW_OVERHEAD_BYTES
        ids_text = json.dumps(list(ids)) if ids else None
        dropped: list[Entry] = []
        try:
            with self._lock:
                conn = self._connection()
                if not self._make_room(size, kind, dropped):
                    self._drop_new(kind, "it is larger than the outbox's free budget")
                    return None
                for _ in range(_FULL_RETRIES):
                    try:
                        cur = conn.execute(
                            "INSERT INTO outbox (kind, topic, payload, ids, created, nbytes) "
                            "VALUES (?, ?, ?, ?, ?, ?)",
                            (kind, topic, payload, ids_text, time.time(), len(payload)),
                        )
                    except sqlite3.OperationalError as exc:
                        if not _is_full(exc):
                            raise
                        self.full_errors += 1
                        if not self._free_disk(kind, dropped):
                            break
                        continue
                    self._bytes += size
                    self._pending[kind] += 1
                    self.put_count[kind] += 1
                    return int(cur.lastrowid or 0)
                self._drop_new(kind, "the disk is full")
                return None
        except sqlite3.Error as exc:
            raise OutboxError(self.path, f"can't store a {kind} record: {exc}") from exc
        finally:
            self._after_drops(dropped)

    def delete(self, seqs: Iterable[int]) -> int:
        """Remove delivered records; how many were there.

        Raises:
            OutboxError: the file can't be written.
        """
        wanted = sorted(set(seqs))
        if not wanted:
            return 0
        removed = 0
        try:
            with self._lock:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for i in range(0, len(wanted), 500):
                        chunk = wanted[i : i + 500]
                        marks = ", ".join("?" for _ in chunk)
                        for kind, nbytes in conn.execute(
                            f"DELETE FROM outbox WHERE seq IN ({marks}) RETURNING kind, nbytes",  # noqa: S608
                            chunk,
                        ).fetchall():
                            self._pending[str(kind)] -= 1
                            self._bytes -= int(nbytes) + ROW_OVERHEAD_BYTES
                            removed += 1
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                self.deleted += removed
                self._maybe_clear_alarm()
                if removed and self._bytes == 0:
                    conn.execute("PRAGMA incremental_vacuum")
        except sqlite3.Error as exc:
            raise OutboxError(self.path, f"can't delete delivered records: {exc}") from exc
        return removed

    # -- reading -----------------------------------------------------------------------

    def oldest(self, after: int = 0, limit: int = 100) -> list[Entry]:
        """Up to ``limit`` records with ``seq > after``, oldest first.

        Raises:
            OutboxError: the file can't be read.
        """
        return self._select("seq > ? ORDER BY seq LIMIT ?", (after, limit))

    def get(self, seqs: Iterable[int]) -> list[Entry]:
        """These records (those still there), oldest first.

        Raises:
            OutboxError: the file can't be read.
        """
        wanted = sorted(set(seqs))[:500]
        if not wanted:
            return []
        marks = ", ".join("?" for _ in wanted)
        return self._select(f"seq IN ({marks}) ORDER BY seq", wanted)

    def decision_ids(self) -> set[str]:
        """Every decision id held in a queued decision batch.

        Raises:
            OutboxError: the file can't be read.
        """
        return self.ids_of(KIND_DECISIONS)

    def ids_of(self, kind: str) -> set[str]:
        """Every id held in a queued record of ``kind``.

        Raises:
            OutboxError: the file can't be read.
        """
        out: set[str] = set()
        for entry in self._select("kind = ? ORDER BY seq", (kind,)):
            out.update(entry.ids)
        return out

    def pending(self, kind: str | None = None) -> int:
        """Records waiting (of one kind, or all)."""
        with self._lock:
            return self._pending[kind] if kind else sum(self._pending.values())

    @property
    def bytes(self) -> int:
        """What the waiting records count against the budget."""
        return self._bytes

    def stats(self) -> dict[str, object]:
        """pending, bytes, max_bytes, pending and dropped and put by kind, deleted,
        full_errors, dropping, alarms."""
        with self._lock:
            return {
                "pending": sum(self._pending.values()),
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "pending_by_kind": {k: self._pending[k] for k in KINDS},
                "dropped": {k: self.dropped[k] for k in KINDS},
                "put": {k: self.put_count[k] for k in KINDS},
                "deleted": self.deleted,
                "full_errors": self.full_errors,
                "dropping": self.dropping,
                "alarms": self.alarms,
                "drop_order": list(self.drop_order),
            }

    # -- internals ---------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise OutboxError(self.path, "not open")
        return self._conn

    def _select(self, where: str, params: Sequence[object]) -> list[Entry]:
        sql = f"SELECT seq, kind, topic, payload, ids, created FROM outbox WHERE {where}"  # noqa: S608
        try:
            with self._lock:
                rows = self._connection().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise OutboxError(self.path, f"can't read: {exc}") from exc
        return [
            Entry(
                int(seq),
                str(kind),
                str(topic),
                bytes(payload),
                tuple(json.loads(ids)) if ids else (),
                float(created),
            )
            for seq, kind, topic, payload, ids, created in rows
        ]

    def _make_room(self, size: int, kind: str, dropped: list[Entry]) -> bool:
        """Drop by policy until ``size`` more bytes fit the budget, and the disk (or the
        file's free pages, when the disk is down to its reserve); False when they can't."""
        if size > self.max_bytes:
            return False
        while self._bytes + size > self.max_bytes:
            if not self._drop_one(kind, dropped, why="the outbox is over its budget"):
                return False
        for _ in range(_FULL_RETRIES):
            if not self._disk_low(size):
                break
            if not self._drop_one(kind, dropped, why="the disk is full"):
                return False
        return True

    def _disk_low(self, size: int) -> bool:
        """The file system is down to its reserve and the file has no free pages for
        ``size`` more bytes (a deleted record's pages are reused in place)."""
        try:
            st = os.statvfs(self.path.parent)
        except OSError:
            return False
        if st.f_bavail * st.f_frsize >= size + self.disk_reserve_bytes:
            return False
        conn = self._connection()
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        return int(free) * int(page) < 2 * size

    def _free_disk(self, kind: str, dropped: list[Entry]) -> bool:
        """The disk is full: drop a record by policy (its pages are reused); whether
        there is something more to try."""
        try:
            return self._drop_one(kind, dropped, why="the disk is full")
        except sqlite3.OperationalError as exc:
            if not _is_full(exc):
                raise
            return False

    def _drop_one(self, incoming: str, dropped: list[Entry], *, why: str) -> bool:
        """Drop the oldest record of the first kind in the drop order that has one and
        does not come after ``incoming`` (a health report never evicts a decision)."""
        conn = self._connection()
        allowed = self.drop_order[: self.drop_order.index(incoming) + 1]
        for kind in allowed:
            if self._pending[kind] <= 0:
                continue
            row = conn.execute(
                "DELETE FROM outbox WHERE seq = (SELECT min(seq) FROM outbox WHERE kind = ?) "
                "RETURNING seq, kind, topic, payload, ids, created",
                (kind,),
            ).fetchone()
            if row is None:
                self._pending[kind] = 0
                continue
            seq, k, topic, payload, ids, created = row
            entry = Entry(
                int(seq), str(k), str(topic), bytes(payload),
                tuple(json.loads(ids)) if ids else (), float(created),
            )  # fmt: skip
            self._pending[kind] -= 1
            self._bytes -= entry.size
            self._count_drop(kind, why)
            dropped.append(entry)
            return True
        return False

    def _drop_new(self, kind: str, why: str) -> None:
        self._count_drop(kind, why)

    def _count_drop(self, kind: str, why: str) -> None:
        self.dropped[kind] += 1
        if not self.dropping:
            self.dropping = True
            self.alarms += 1
            message = (
                f"dropping {kind} records: {why} ({self._bytes} of {self.max_bytes} bytes "
                f"used; drop order {', '.join(self.drop_order)})"
            )
            log.error("outbox alarm %s: %s", ALARM_DROPPING, message)
            # on_alarm is called after the lock is released (the alarm may be queued here).
            self._alarm_due = message

    def _after_drops(self, dropped: list[Entry]) -> None:
        message = self._alarm_due
        if message is not None:
            self._alarm_due = None
            if self.on_alarm is not None:
                try:
                    self.on_alarm(ALARM_DROPPING, message)
                except Exception:
                    log.exception("outbox: on_alarm failed")
        if self.on_dropped is not None:
            for entry in dropped:
                try:
                    self.on_dropped(entry)
                except Exception:
                    log.exception("outbox: on_dropped failed for record %d", entry.seq)

    def _maybe_clear_alarm(self) -> None:
        if self.dropping and self._bytes <= self.max_bytes // 2:
            self.dropping = False
            log.warning("outbox: back under half its budget; the dropping alarm is cleared")


def _is_full(exc: sqlite3.OperationalError) -> bool:
    name = str(getattr(exc, "sqlite_errorname", ""))
    return name.startswith("SQLITE_FULL") or "full" in str(exc).lower()
