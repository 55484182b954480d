"""One PLC connection: a thread that owns its driver.

The thread connects (exponential backoff from 0.1 s to ``reconnect_max_s``), then loops:
it makes the writes stations queued (results first: they are urgent), reads each input
group when it is due (every ``period_s``, or at once when the driver's subscription
reported a change of the group's first point), and hands the values to the group's
callback. Every call to the PLC is bounded by the connection's ``timeout_ms``; a call that
fails with ``refused``, ``timeout`` or ``disconnected`` drops the connection and the
thread reconnects. Nothing else ever waits on the PLC: :meth:`PlcLink.submit` only puts
the writes in a bounded queue (full: refused at once with ``queue_full``, counted).

Every failure is counted by its reason word (:data:`agent.line.errors.REASONS`); the
counts, the connection state and the last error are in :meth:`PlcLink.stats`.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.line.drivers import driver_class
from agent.line.drivers.base import Driver, LinkConfig, Point
from agent.line.errors import LineError

log = logging.getLogger(__name__)

RECONNECT_MIN_S = 0.1
WATCH_RESYNC_S = 1.0
"""A watched group is also read this often, in case a notification was lost."""
DROPS_LINK = frozenset({"refused", "timeout", "disconnected"})
"""Failures after which the connection is closed and made again."""

WriteDone = Callable[[LineError | None], None]
GroupCallback = Callable[[list[Any], int], None]
"""Called on the link's thread with a group's values and ``time.perf_counter_ns()`` of
when they were seen (the read's start, or the subscription's notification)."""


@dataclass
class _Group:
    points: list[Point]
    period_s: float
    on_values: GroupCallback
    on_lost: Callable[[], None]
    due: float = 0.0
    watched: bool = False
    changed_ns: int = 0


@dataclass
class LinkStats:
    """A link's counters."""

    connected: bool = False
    """True once the PLC answered over the connection now open (its calls made, or
    refused with a reason that keeps the connection), False from the failure that drops
    it: a PLC that accepts the connection but never answers (a stalled scan) is not
    connected, so its ``plc_down`` alarm is not cleared by each reconnect."""
    connects: int = 0
    reads: int = 0
    writes: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    last_error: str = ""
    queued: int = 0


class PlcLink:
    """One ``[[plc]]`` connection, its thread, its write queue.

    Args:
        config: the connection's settings.
        driver_kw: extra keywords for the driver's constructor (the MQTT driver's broker).
        on_failure: told of each failure's reason (for metrics), on the link's thread.
        make_driver: builds the driver (default: the registry's class for the key).
    """

    def __init__(
        self,
        config: LinkConfig,
        *,
        driver_kw: dict[str, Any] | None = None,
        on_failure: Callable[[str, str], None] | None = None,
        make_driver: Callable[[LinkConfig], Driver] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.driver_key = str(getattr(config, "driver", ""))
        self._driver_kw = driver_kw or {}
        self._make_driver = make_driver
        self._on_failure = on_failure
        self._writes: queue.Queue[tuple[list[tuple[Point, Any]], WriteDone | None]] = queue.Queue(
            maxsize=config.queue_bound
        )
        self._groups: list[_Group] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._driver: Driver | None = None
        self._lock = threading.Lock()
        self.stats_ = LinkStats()

    # -- set-up ----------------------------------------------------------------------
    def add_group(
        self,
        points: Sequence[Point],
        period_s: float,
        on_values: GroupCallback,
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        """Read ``points`` every ``period_s`` (or when the first one changes, where the
        driver watches) and call ``on_values``; ``on_lost`` when the connection drops
        (the next values after a reconnect are a new baseline). Before :meth:`start`."""
        if self._thread is not None:
            raise RuntimeError("add_group after start")
        self._groups.append(_Group(list(points), period_s, on_values, on_lost))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"plc-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (bounded) and close the driver; queued writes are failed with
        ``disconnected``."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._fail_queued(LineError(self.name, "disconnected", "the link stopped"))

    # -- what stations call --------------------------------------------------------------
    def submit(self, writes: list[tuple[Point, Any]], on_done: WriteDone | None = None) -> bool:
        """Queue ``writes`` (made in order, in one driver call); never waits. False when
        the queue is full (counted as ``queue_full``; ``on_done`` is not called)."""
        try:
            self._writes.put_nowait((writes, on_done))
        except queue.Full:
            self._count("queue_full", f"{self._writes.maxsize} writes already queued")
            return False
        self._wake.set()
        return True

    @property
    def connected(self) -> bool:
        return self.stats_.connected

    def stats(self) -> dict[str, Any]:
        s = self.stats_
        with self._lock:
            failures = dict(s.failures)
        return {
            "driver": self.driver_key,
            "connected": s.connected,
            "connects": s.connects,
            "reads": s.reads,
            "writes": s.writes,
            "failures": failures,
            "last_error": s.last_error,
            "queued": self._writes.qsize(),
        }

    # -- the thread ------------------------------------------------------------------
    def _count(self, reason: str, detail: str) -> None:
        with self._lock:
            self.stats_.failures[reason] = self.stats_.failures.get(reason, 0) + 1
            self.stats_.last_error = f"{reason}: {detail}"[:300]
        if self._on_failure is not None:
            try:
                self._on_failure(reason, detail)
            except Exception:
                log.exception("plc %s: the failure callback failed", self.name)

    def _run(self) -> None:
        backoff = RECONNECT_MIN_S
        while not self._stop.is_set():
            if self._driver is None:
                if self._connect():
                    backoff = RECONNECT_MIN_S
                else:
                    self._fail_queued(LineError(self.name, "disconnected", "not connected"))
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, self.config.reconnect_max_s)
                    continue
            try:
                self._step()
            except LineError as exc:
                drops = exc.reason in DROPS_LINK
                # not connected before the failure is told (the plc_down alarm); still
                # connected when the PLC answered, with an error that keeps the connection
                self.stats_.connected = not drops
                self._count(exc.reason, exc.detail)
                if drops:
                    self._disconnect()
            except Exception as exc:  # a bug must not kill the link: log, count, reconnect
                self.stats_.connected = False
                log.exception("plc %s: unexpected error", self.name)
                self._count("protocol", f"{type(exc).__name__}: {exc}")
                self._disconnect()
            else:
                self.stats_.connected = True
        self._disconnect()

    def _connect(self) -> bool:
        try:
            if self._make_driver is not None:
                driver = self._make_driver(self.config)
            else:
                cls = driver_class(self.driver_key, self.name)
                driver = cls(self.config, **self._driver_kw)
            driver.open()
        except LineError as exc:
            self._count(exc.reason, exc.detail)
            return False
        except Exception as exc:
            log.exception("plc %s: unexpected error while connecting", self.name)
            self._count("protocol", f"{type(exc).__name__}: {exc}")
            return False
        self._driver = driver
        self.stats_.connects += 1  # connected once the PLC answers (see LinkStats)
        now = time.monotonic()
        for group in self._groups:
            group.due = now
            group.watched = False
            try:
                group.watched = driver.watch(
                    group.points[:1],
                    functools.partial(self._changed, group),
                    period_s=group.period_s,
                )
            except LineError as exc:
                self._count(exc.reason, f"watch: {exc.detail}")
        log.info("plc %s: connected (%s)", self.name, self.driver_key)
        return True

    def _changed(self, group: _Group, _index: int, _value: object) -> None:
        """A subscription saw the group's first point change (on the driver's thread)."""
        group.changed_ns = time.perf_counter_ns()
        group.due = 0.0
        self._wake.set()

    def _disconnect(self) -> None:
        driver, self._driver = self._driver, None
        if driver is None:
            return
        self.stats_.connected = False
        try:
            driver.close()
        except Exception:
            log.exception("plc %s: close failed", self.name)
        for group in self._groups:
            try:
                group.on_lost()
            except Exception:
                log.exception("plc %s: a group's on_lost failed", self.name)

    def _fail_queued(self, error: LineError) -> None:
        while True:
            try:
                _, on_done = self._writes.get_nowait()
            except queue.Empty:
                return
            self._count(error.reason, error.detail)
            self._done(on_done, error)

    def _done(self, on_done: WriteDone | None, error: LineError | None) -> None:
        if on_done is None:
            return
        try:
            on_done(error)
        except Exception:
            log.exception("plc %s: a write's callback failed", self.name)

    def _step(self) -> None:
        driver = self._driver
        assert driver is not None  # noqa: S101 - _run connects first
        # writes first: results are urgent
        while True:
            try:
                writes, on_done = self._writes.get_nowait()
            except queue.Empty:
                break
            try:
                driver.write(writes)
            except LineError as exc:
                self._done(on_done, exc)
                raise
            self.stats_.writes += 1
            self._done(on_done, None)
        now = time.monotonic()
        for group in self._groups:
            if now < group.due:
                continue
            seen_ns = group.changed_ns or time.perf_counter_ns()
            group.changed_ns = 0
            # due again first: a read that fails is retried at the group's pace, and the
            # other groups are read meanwhile (a failing group must not starve them)
            group.due = time.monotonic() + group.period_s
            values = driver.read(group.points)
            self.stats_.reads += 1
            if group.watched:
                group.due = time.monotonic() + WATCH_RESYNC_S
            try:
                group.on_values(values, seen_ns)
            except Exception:
                log.exception("plc %s: a group's callback failed", self.name)
        next_due = min((g.due for g in self._groups), default=now + WATCH_RESYNC_S)
        wait = max(0.0, next_due - time.monotonic())
        if wait > 0 and self._writes.empty():
            self._wake.wait(wait)
        self._wake.clear()
