"""The outbox's sender: publishes waiting records oldest first with QoS 1, a bounded
window of them in flight, at most ``rate_per_s`` a second, and deletes each record only
after a PUBACK with a success reason code (:class:`Drain`).

- A PUBACK with a failure reason code (NOT_AUTHORIZED, QUOTA_EXCEEDED ...) is not a
  delivery: the record stays and is tried again after a back-off (doubling to a minute).
- No answer within ``ack_timeout_s``, or the connection lost: the record is sent again.
  The fleet stores each record once by its device-made id, so a second delivery is
  harmless; a lost one is not.
- The rate bound leaves the link to live traffic (heartbeats, the retained state, the
  directives coming down) while a long outage drains.
- Paced by the line (``drain_pacing = "headroom"``): given the hot path's live latency
  (``load``), the rate follows :class:`agent.uplink.pacing.Pacer` (AIMD on the live p99
  against the idle p99), re-read every ``pace_interval_s``, ``rate_per_s`` its cap.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from agent.kernel.errors import EdgefleetError
from agent.livelatency import LiveLoad, LoadSource
from agent.uplink.acks import Pending, Publisher
from agent.uplink.outbox import Entry, Outbox
from agent.uplink.pacing import Pacer, PacingSettings

log = logging.getLogger(__name__)

RETRY_MIN_S = 1.0
RETRY_MAX_S = 60.0
_IDLE_WAIT_S = 0.5

Delivered = Callable[[Sequence[Entry]], None]
"""Called with records the broker acknowledged, before they are deleted; raising keeps
them (they are sent again)."""


@dataclass
class _InFlight:
    entry: Entry
    pending: Pending
    deadline: float


class _Bucket:
    """Token bucket: ``rate`` a second, at most ``burst`` at once."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self.tokens = self.burst
        self.stamp = time.monotonic()

    def set_rate(self, rate: float, burst: float) -> None:
        """A new rate from now on (what was earned at the old one is kept)."""
        self._refill()
        self.rate = rate
        self.burst = max(1.0, burst)
        self.tokens = min(self.tokens, self.burst)

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self) -> bool:
        self._refill()
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def wait_s(self) -> float:
        return max(0.0, (1.0 - self.tokens) / self.rate)


class Drain:
    """Sends the outbox (see the module docstring). :meth:`run` is the thread's body.

    Args:
        outbox: the records.
        publisher: the uplink's publisher (its acks are matched there).
        connected: set while the uplink is connected.
        window: records in flight at most.
        rate_per_s: records published a second at most.
        ack_timeout_s: how long a record waits for its PUBACK before it is sent again.
        on_delivered: see :data:`Delivered`.
        stop: ends :meth:`run`.
        pacing: how the rate follows the line (default: fixed at ``rate_per_s``); its
            ``cap_per_s`` is ``rate_per_s``.
        load: the hot path's live latency (:meth:`agent.livelatency.LatencyWindow.snapshot`
            or its copy from another process); None, or a source that returns None: the
            fixed rate.
        pace_interval_s: seconds between two pacing updates.
    """

    def __init__(
        self,
        outbox: Outbox,
        publisher: Publisher,
        *,
        connected: threading.Event,
        window: int,
        rate_per_s: float,
        ack_timeout_s: float,
        on_delivered: Delivered | None = None,
        stop: threading.Event,
        pacing: PacingSettings | None = None,
        load: LoadSource | None = None,
        pace_interval_s: float = 0.5,
    ) -> None:
        self.outbox = outbox
        self.publisher = publisher
        self.connected = connected
        self.window = window
        self.ack_timeout_s = ack_timeout_s
        self.on_delivered = on_delivered
        self.stop = stop
        self.wake = threading.Event()
        settings = pacing or PacingSettings(mode="fixed")
        settings = replace(  # the cap is the operator's rate, the floor under it
            settings, cap_per_s=rate_per_s, min_per_s=min(settings.min_per_s, rate_per_s)
        )
        self.pacer = Pacer(settings)
        self.load = load
        """Read every ``pace_interval_s`` (see Args); may be set after construction."""
        self.pace_interval_s = pace_interval_s
        self._pace_due = 0.0
        self._busy_at = -1.0e9  # monotonic time of the last publish, or of one held back
        self._limited = False
        first = settings.cap_per_s if load is None else self.pacer.rate_per_s
        self._bucket = _Bucket(first, self._burst(first))
        self._in_flight: dict[int, _InFlight] = {}
        self._retry: dict[int, float] = {}
        self._refusals: dict[int, int] = {}
        self._cursor = 0
        self._was_connected = False
        self.delivered = 0
        self.resent = 0
        self.last_drained = 0.0
        """monotonic time when the outbox last became empty."""

    def notify(self) -> None:
        """Wake the sender (an answer came, a record was queued, the link came up)."""
        self.wake.set()

    def run(self) -> None:
        """Send until ``stop`` is set."""
        while not self.stop.is_set():
            try:
                wait = self.step()
            except EdgefleetError as exc:  # the outbox file: log, back off, go on
                log.error("uplink outbox: %s", exc)  # noqa: TRY400 - expected, no traceback
                self.publisher.count("outbox_errors")
                wait = RETRY_MIN_S
            except Exception:
                log.exception("uplink outbox: sender failed")
                self.publisher.count("outbox_errors")
                wait = RETRY_MIN_S
            self.wake.wait(wait)
            self.wake.clear()

    def step(self) -> float:
        """One round: collect answers, send what fits; how long to wait before the next.

        Raises:
            OutboxError: the outbox can't be read or written.
        """
        self._pace()
        wait = self._send_round()
        return min(wait, max(0.0, self._pace_due - time.monotonic()))

    def _send_round(self) -> float:
        if not self.connected.is_set():
            if self._was_connected:
                self._reset("the connection was lost")
            self._was_connected = False
            return _IDLE_WAIT_S
        self._was_connected = True
        self._collect()
        return self._fill()

    def in_flight(self) -> int:
        """Records sent and not yet answered."""
        return len(self._in_flight)

    def ahead(self) -> int:
        """How many records the batcher may queue ahead of the sender: about a second at
        the rate in force (at least 2, at most two windows), so that a paced drain does
        not make a backlog's batches in one burst of work."""
        return max(2, min(2 * self.window, math.ceil(self._bucket.rate)))

    def rate_per_s(self) -> float:
        """The rate in force now (the paced one, or the fixed cap)."""
        return self._bucket.rate

    # -- pacing ------------------------------------------------------------------------

    def _burst(self, rate: float) -> float:
        return min(float(self.window), rate)

    def _pace(self) -> None:
        """Every ``pace_interval_s``: the live load into the pacer, its rate into the bucket."""
        now = time.monotonic()
        if now < self._pace_due:
            return
        self._pace_due = now + self.pace_interval_s
        load = self._read_load()
        window_s = load.window_s if load is not None else self.pace_interval_s
        quiet = now - self._busy_at > window_s and not self._in_flight  # nothing to send
        rate = self.pacer.update(load, quiet=quiet, limited=self._limited)
        self._limited = False
        if rate != self._bucket.rate:
            self._bucket.set_rate(rate, self._burst(rate))

    def _read_load(self) -> LiveLoad | None:
        if self.load is None:
            return None
        try:
            return self.load()
        except Exception:  # the source's bug must not stop the drain: fixed rate, counted
            log.exception("uplink outbox: the live load source failed; fixed rate")
            self.publisher.count("pacing_errors")
            return None

    # -- internals ---------------------------------------------------------------------

    def _reset(self, why: str) -> None:
        """Forget what is in flight; it is sent again from the outbox."""
        if self._in_flight:
            log.info(
                "uplink outbox: %d records in flight sent again (%s)", len(self._in_flight), why
            )
        for item in self._in_flight.values():
            self.publisher.acks.forget(item.pending)
        self._in_flight.clear()
        self._retry.clear()
        self._cursor = 0

    def _collect(self) -> None:
        now = time.monotonic()
        ok: list[Entry] = []
        for seq, item in list(self._in_flight.items()):
            pending = item.pending
            if pending.done.is_set():
                del self._in_flight[seq]
                if pending.ok:
                    ok.append(item.entry)
                else:
                    self._refused(item.entry, str(pending.reason))
            elif now >= item.deadline:
                del self._in_flight[seq]
                self.publisher.acks.forget(pending)
                self.publisher.count(f"outbox_timeouts_{item.entry.kind}")
                self._retry[seq] = now
        if ok:
            self._deliver(ok)

    def _deliver(self, entries: list[Entry]) -> None:
        if self.on_delivered is not None:
            try:
                self.on_delivered(entries)
            except Exception:  # the log's error or a bug: keep the records, send again
                log.exception("uplink outbox: recording %d deliveries failed", len(entries))
                self.publisher.count("outbox_errors")
                due = time.monotonic() + RETRY_MIN_S
                self._retry.update({e.seq: due for e in entries})
                return
        self.outbox.delete(e.seq for e in entries)
        for entry in entries:
            self._refusals.pop(entry.seq, None)
        self.delivered += len(entries)
        for entry in entries:
            self.publisher.count(f"delivered_{entry.kind}")
        if self.outbox.pending() == 0:
            self.last_drained = time.monotonic()

    def _refused(self, entry: Entry, reason: str) -> None:
        if len(self._refusals) > 10 * self.window:  # records dropped meanwhile
            self._refusals.clear()
        count = self._refusals[entry.seq] = self._refusals.get(entry.seq, 0) + 1
        backoff = min(RETRY_MAX_S, RETRY_MIN_S * 2 ** min(count - 1, 6))
        self._retry[entry.seq] = time.monotonic() + backoff
        self.publisher.count(f"outbox_refused_{entry.kind}")
        self.publisher.last_error = f"the broker refused a {entry.kind} record: {reason}"

    def _fill(self) -> float:
        room = self.window - len(self._in_flight)
        if room <= 0:
            return self._next_deadline()
        now = time.monotonic()
        due = sorted(s for s, t in self._retry.items() if t <= now)[:room]
        entries = self.outbox.get(due) if due else []
        for seq in due:
            del self._retry[seq]
        if len(entries) < room:
            fresh = self.outbox.oldest(self._cursor, room - len(entries))
            skip = self._retry.keys() | self._in_flight.keys()
            entries += [e for e in fresh if e.seq not in skip]
            if fresh:
                self._cursor = max(self._cursor, fresh[-1].seq)
        for index, entry in enumerate(entries):
            if not self._bucket.take():
                for rest in entries[index:]:  # not sent: first in line next time
                    self._retry[rest.seq] = now
                self._limited = True
                self._busy_at = now
                return self._bucket.wait_s()
            if not self._send(entry):
                for rest in entries[index:]:
                    self._retry[rest.seq] = now + RETRY_MIN_S
                return RETRY_MIN_S
        if len(self._in_flight) >= self.window or not entries:
            return self._next_deadline()
        return 0.0

    def _send(self, entry: Entry) -> bool:
        pending = self.publisher.send(entry.kind, entry.topic, entry.payload)
        if pending is None:
            return False
        self._busy_at = time.monotonic()
        self._in_flight[entry.seq] = _InFlight(entry, pending, self._busy_at + self.ack_timeout_s)
        return True

    def _next_deadline(self) -> float:
        now = time.monotonic()
        times = [i.deadline for i in self._in_flight.values()] + list(self._retry.values())
        if not times:
            return _IDLE_WAIT_S
        return min(_IDLE_WAIT_S, max(0.0, min(times) - now))
