"""Which publish got which answer (:class:`AckTracker`), and the publisher that uses it
(:class:`Publisher`): paho reports a PUBACK by message id on its network
thread, possibly before the publishing thread has learnt the id; this matches the two.

A PUBACK with a failure reason code (MQTT 5: NOT_AUTHORIZED 0x87, QUOTA_EXCEEDED ...) is
counted as refused, per kind of message, and logged; it is never taken for a delivery.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode

from agent.kernel.mqtt import Delivery, MqttSession

log = logging.getLogger(__name__)

EARLY_TTL_S = 60.0
"""An answer nobody has claimed is forgotten after this long (message ids are reused)."""


@dataclass
class Pending:
    """One publish waiting for its answer; ``done`` is set when it came."""

    mid: int
    kind: str
    done: threading.Event = field(default_factory=threading.Event)
    reason: ReasonCode | None = None

    @property
    def ok(self) -> bool:
        """Answered with a success reason code."""
        return self.done.is_set() and self.reason is not None and not self.reason.is_failure

    def wait(self, timeout_s: float, stop: threading.Event | None = None) -> bool:
        """Wait for the answer at most ``timeout_s`` (less if ``stop`` is set); whether it came."""
        deadline = time.monotonic() + timeout_s
        while not self.done.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                break
            self.done.wait(min(left, 0.1))
        return self.done.is_set()


class AckTracker:
    """Matches publishes to their PUBACKs; at most ``bound`` of each kept."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.acked: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.abandoned: Counter[str] = Counter()
        self.unmatched = 0
        self._lock = threading.Lock()
        self._pending: OrderedDict[int, Pending] = OrderedDict()
        self._early: OrderedDict[int, tuple[float, ReasonCode]] = OrderedDict()

    def track(self, mid: int, kind: str) -> Pending:
        """Start waiting for the answer to message ``mid`` (call right after publishing)."""
        pending = Pending(mid, kind)
        with self._lock:
            early = self._early.pop(mid, None)
            if early is not None and time.monotonic() - early[0] <= EARLY_TTL_S:
                self._resolve(pending, early[1])
                return pending
            old = self._pending.pop(mid, None)
            if old is not None:
                self.abandoned[old.kind] += 1
            self._pending[mid] = pending
            while len(self._pending) > self.bound:
                _, dropped = self._pending.popitem(last=False)
                self.abandoned[dropped.kind] += 1
        return pending

    def forget(self, pending: Pending) -> None:
        """Stop waiting for ``pending`` (timed out); a late answer is counted unmatched."""
        with self._lock:
            if self._pending.get(pending.mid) is pending:
                del self._pending[pending.mid]
                self.abandoned[pending.kind] += 1

    def on_ack(self, mid: int, reason: ReasonCode) -> None:
        """paho's ``on_publish`` (network thread)."""
        with self._lock:
            pending = self._pending.pop(mid, None)
            if pending is not None:
                self._resolve(pending, reason)
                return
            now = time.monotonic()
            self._early[mid] = (now, reason)
            while self._early and (
                len(self._early) > self.bound
                or now - next(iter(self._early.values()))[0] > EARLY_TTL_S
            ):
                self._early.popitem(last=False)
                self.unmatched += 1

    def outstanding(self) -> int:
        """Publishes still waiting for an answer."""
        with self._lock:
            return len(self._pending)

    def _resolve(self, pending: Pending, reason: ReasonCode) -> None:
        pending.reason = reason
        if reason.is_failure:
            self.refused[pending.kind] += 1
            log.error("uplink: the broker refused a %s message: %s", pending.kind, reason)
        else:
            self.acked[pending.kind] += 1
        pending.done.set()


class Publisher:
    """Publishes through an MQTT session, tracks each answer and counts what happened.

    Counters (:meth:`count`, :meth:`counts`) are shared with whoever reports through it.
    """

    def __init__(self, session: MqttSession, bound: int) -> None:
        self.session = session
        self.acks = AckTracker(bound)
        self.last_error = ""
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.on_answer: Callable[[], None] | None = None
        """Called (network thread) after each answer, e.g. to wake a sender."""

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to counter ``key``."""
        with self._lock:
            self._counts[key] += n

    def counts(self) -> dict[str, int]:
        """A copy of the counters."""
        with self._lock:
            return dict(self._counts)

    def send(
        self, kind: str, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> Pending | None:
        """Publish; the answer to wait for, or None when paho refused it (counted as
        ``unsent_<kind>``, reason in :attr:`last_error`). A QoS 1 message published while
        offline is held and sent on reconnect."""
        delivery = self.session.publish(topic, payload, qos=qos, retain=retain)
        if delivery.queued:
            self.count(f"sent_{kind}")
            pending = self.acks.track(delivery.mid, kind)
            delivery.add_done_callback(self._answered)
            return pending
        self.count(f"unsent_{kind}")
        self.last_error = mqtt.error_string(delivery.rc)
        log.warning("uplink: %s not sent: %s", kind, self.last_error)
        return None

    def _answered(self, delivery: Delivery) -> None:
        if delivery.reason is not None:
            self.acks.on_ack(delivery.mid, delivery.reason)
        if self.on_answer is not None:
            self.on_answer()
