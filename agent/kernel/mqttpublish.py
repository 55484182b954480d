"""Which publish got which answer, for :class:`agent.kernel.mqtt.MqttSession`.

paho reports a PUBACK (QoS 1), a PUBCOMP (QoS 2) or the write of a QoS 0 message by
message id on its network thread, possibly before the publishing thread has learnt the
id (paho calls ``on_publish`` holding a lock that ``publish`` also takes, so the two
can't be ordered by a lock of ours without a deadlock). :class:`Deliveries` matches the
two: an answer with no :class:`Delivery` yet is kept briefly and claimed when the
delivery is registered. A failure reason code (MQTT 5 NOT_AUTHORIZED 0x87, QUOTA_EXCEEDED
...) is a refusal, never a delivery.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

log = logging.getLogger(__name__)

EARLY_TTL_S = 60.0
"""An answer nobody has claimed is forgotten after this long (message ids are reused)."""
MAX_TRACKED = 65536
"""MQTT message ids are 16 bit: at most this many deliveries are waited for at once."""

DoneCallback = Callable[["Delivery"], None]


class Delivery:
    """One publish: paho's result code at the call (``rc``), then the broker's answer.

    ``queued`` says whether paho took the message (sent, or a QoS > 0 message held while
    offline and sent on reconnect); a message paho did not take never gets an answer.
    """

    def __init__(self, mid: int, rc: MQTTErrorCode, qos: int) -> None:
        self.mid = mid
        self.rc = rc
        self.qos = qos
        self.reason: ReasonCode | None = None
        self.done = threading.Event()
        self._callbacks: list[DoneCallback] = []
        self._lock = threading.Lock()

    @property
    def queued(self) -> bool:
        """Whether paho took the message (an answer will come, now or after reconnect)."""
        return self.rc == MQTTErrorCode.MQTT_ERR_SUCCESS or (
            self.rc == MQTTErrorCode.MQTT_ERR_NO_CONN and self.qos > 0
        )

    @property
    def ok(self) -> bool:
        """Answered with a success reason code."""
        return self.done.is_set() and self.reason is not None and not self.reason.is_failure

    @property
    def refused(self) -> bool:
        """Answered with a failure reason code (NOT_AUTHORIZED ...)."""
        return self.done.is_set() and self.reason is not None and self.reason.is_failure

    def wait(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the answer; whether it came."""
        return self.done.wait(max(timeout_s, 0.0))

    def add_done_callback(self, fn: DoneCallback) -> None:
        """Call ``fn(self)`` when the answer comes (at once, on this thread, if it has);
        otherwise on paho's network thread, where an exception is logged, not raised."""
        with self._lock:
            if not self.done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def _resolve(self, reason: ReasonCode) -> None:
        with self._lock:
            self.reason = reason
            self.done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("a publish callback failed (message %d)", self.mid)


class Deliveries:
    """Waiting deliveries by message id, and answers that came before their delivery."""

    def __init__(self, bound: int = MAX_TRACKED) -> None:
        self.bound = bound
        self.refused = 0
        self.unmatched = 0
        self._lock = threading.Lock()
        self._waiting: OrderedDict[int, Delivery] = OrderedDict()
        self._early: OrderedDict[int, tuple[float, ReasonCode]] = OrderedDict()

    def track(self, delivery: Delivery) -> None:
        """Wait for ``delivery``'s answer (call right after publishing)."""
        if not delivery.queued:
            return
        with self._lock:
            early = self._early.pop(delivery.mid, None)
            if early is None or time.monotonic() - early[0] > EARLY_TTL_S:
                self._waiting[delivery.mid] = delivery
                self._waiting.move_to_end(delivery.mid)
                while len(self._waiting) > self.bound:
                    self._waiting.popitem(last=False)
                return
        self._answer(delivery, early[1])

    def on_answer(self, mid: int, reason: ReasonCode) -> None:
        """paho's ``on_publish`` (network thread)."""
        with self._lock:
            delivery = self._waiting.pop(mid, None)
            if delivery is None:
                now = time.monotonic()
                self._early[mid] = (now, reason)
                self._early.move_to_end(mid)
                while self._early and (
                    len(self._early) > self.bound
                    or now - next(iter(self._early.values()))[0] > EARLY_TTL_S
                ):
                    self._early.popitem(last=False)
                    self.unmatched += 1
                return
        self._answer(delivery, reason)

    def _answer(self, delivery: Delivery, reason: ReasonCode) -> None:
        if reason.is_failure:
            with self._lock:
                self.refused += 1
            log.error("the broker refused message %d: %s", delivery.mid, reason)
        delivery._resolve(reason)

    def outstanding(self) -> int:
        """Deliveries still waiting for an answer."""
        with self._lock:
            return len(self._waiting)


__all__ = ["Deliveries", "Delivery"]
