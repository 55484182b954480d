"""The ingest worker: device reports from the broker, validated, batched into a sink.

One MQTT 5 session (:class:`agent.kernel.mqtt.MqttSession`, manual acknowledgement)
subscribes to every device's state, heartbeat, telemetry (health too), decisions, events,
install state and quality (shadow comparisons, drift buckets), through
``$share/<group>/...`` when a group is given, so that workers of one group share the
load and each message reaches one of them.

Messages are acknowledged by hand, after the sink has stored them: a worker that dies
before storing leaves them unacknowledged and the broker delivers them again (to the
same persistent session, or by MQTT 5 rules to another member of the group). The
client's Receive Maximum bounds the unacknowledged messages, and so the queue between
the network thread and the worker's own thread, which validates and stores. Should the
queue be full all the same (a resumed persistent session can bring more), the network
thread waits for room, as long as it takes, rather than drop a message: a message left
unacknowledged on a connection that stays up is never delivered again. The wait holds
back the socket (the broker's flow control does the rest); a worker stopped meanwhile
leaves the message unacknowledged, for the broker to deliver after the disconnect.
A payload that is oversized, not JSON, not a valid message, or whose device id differs
from its topic's is quarantined in the sink and counted; so is a record with a device
time out of bounds (:mod:`fleet_server.ingest.clock`) and a record the sink can't store
(:mod:`fleet_server.ingest.batch` isolates it); nothing a device sends stops the worker.
Records the database could not take after bounded retries are left unacknowledged, and
the rest of the batch is acknowledged.

:meth:`IngestWorker.health` says whether the worker does its job (its thread alive,
connected, no message waiting longer than ``max_lag_s``);
:func:`fleet_server.ingest.health.register_health` puts it on ``/healthz``.
"""

from __future__ import annotations

import logging
import queue
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from agent.kernel.mqtt import MqttSession, SessionOptions
from agent.wire import topics
from agent.wire.messages import MAX_PAYLOAD_BYTES, MessageError
from fleet_server.errors import FleetError
from fleet_server.health import PartHealth
from fleet_server.ingest.batch import INGEST_TOPICS, RETRY_MAX_S, Batch
from fleet_server.ingest.clock import ClockBounds
from fleet_server.ingest.failures import RetryPolicy
from fleet_server.ingest.sink import Sink
from fleet_server.ingest.stats import IngestStats

log = logging.getLogger(__name__)

RECONNECT_MIN_S = 1
RECONNECT_MAX_S = 10
IDLE_GAP_S = 0.005
"""A batch is flushed early when no message came for this long."""
ENQUEUE_WAIT_S = 0.5
"""A full queue is waited on in slices this long, checking for stop between them."""
UNSUBSCRIBE_TIMEOUT_S = 2.0
DEFAULT_MAX_LAG_S = 30.0
DEFAULT_MAX_DISCONNECTED_S = 30.0
RECEIVE_MAXIMUM = 64
"""Unacknowledged messages the broker may send a worker (MQTT 5 Receive Maximum). Mosquitto
2.0 keeps a copy of each PUBLISH in flight until the worker's socket takes it, and a
stalled worker takes none: 64 x the broker's 1 MiB max_packet_size is 64 MiB per worker
(at 1,000 it grew the broker past 1.3 GB). It is the worker's batch too: 64 messages a
transaction. See :meth:`fleet_server.broker.config.MosquittoConfig.client_memory_bound`."""


class IngestError(FleetError):
    """An ingest worker can't be set up or started.

    Attributes:
        reason: what is wrong.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"ingest: {reason}")


@dataclass(frozen=True)
class _Item:
    topic: str
    payload: bytes
    mid: int
    qos: int
    generation: int
    received: float
    """``time.monotonic()`` when it arrived."""


def tls_context(ca: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The client TLS context for these files (``None`` when none is given).

    Raises:
        IngestError: only one of cert and key, or a file missing or not usable.
    """
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise IngestError("tls_cert and tls_key go together")
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
        if cert is not None:
            context.load_cert_chain(str(cert), str(key))
    except OSError as exc:  # ssl.SSLError is an OSError
        raise IngestError(f"TLS files (ca {ca}, cert {cert}, key {key}): {exc}") from exc
    return context


class IngestWorker:
    """Ingests device reports from the broker at ``host:port`` into ``sink``.

    Args:
        group: shared-subscription group; ``None`` subscribes plainly (one worker).
        client_id: a stable id gives a persistent session (``session_expiry_s``) that
            keeps unacknowledged messages across restarts; ``None``: a random id and a
            clean session.
        batch_size: most messages stored in one batch (one sink call per kind).
        flush_interval_s: longest wait for a batch to fill; a batch also goes when no
            message came for :data:`IDLE_GAP_S`.
        receive_maximum: most unacknowledged messages the broker may send (MQTT 5); it
            bounds what the broker holds in flight to a stalled worker
            (:data:`RECEIVE_MAXIMUM`).
        clock_bounds: how far device times may be from the server's clock (``None``:
            not checked).
        retry: how long a transient sink failure is retried before its records are
            left unacknowledged.
        max_lag_s: :meth:`health` fails when a message waits longer than this.
        max_disconnected_s: :meth:`health` fails when not connected for longer.
        clock: the server's clock, Unix seconds (for the device-time bounds).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        sink: Sink,
        group: str | None = None,
        client_id: str | None = None,
        session_expiry_s: int = 3600,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        username: str | None = None,
        password: str | None = None,
        batch_size: int = 500,
        flush_interval_s: float = 0.05,
        receive_maximum: int = RECEIVE_MAXIMUM,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
        keepalive_s: int = 30,
        clock_bounds: ClockBounds | None = ClockBounds(),  # noqa: B008 (frozen)
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 (frozen)
        max_lag_s: float = DEFAULT_MAX_LAG_S,
        max_disconnected_s: float = DEFAULT_MAX_DISCONNECTED_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if batch_size < 1 or not 1 <= receive_maximum <= 65535 or flush_interval_s < 0:
            raise IngestError(
                f"batch_size {batch_size} (>= 1), receive_maximum {receive_maximum} "
                f"(1-65535) or flush_interval_s {flush_interval_s} (>= 0) out of range"
            )
        self.host, self.port = host, port
        self.sink = sink
        self.batch_size = min(batch_size, receive_maximum)
        self.flush_interval_s = flush_interval_s
        self.max_payload_bytes = max_payload_bytes
        self.keepalive_s = keepalive_s
        self.clock_bounds = clock_bounds
        self.retry = retry
        self.max_lag_s = max_lag_s
        self.max_disconnected_s = max_disconnected_s
        self.clock = clock
        self._storing_since: float | None = None
        self.filters = [topics.device_filter(t) for t in INGEST_TOPICS]
        if group is not None:
            self.filters = [topics.shared(group, f) for f in self.filters]
        self._stats = IngestStats()
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=receive_maximum)
        self._stopping = threading.Event()
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None
        self._persistent = client_id is not None
        self.session = MqttSession(
            "ingest",
            SessionOptions(
                host=host,
                port=port,
                client_id=client_id or f"fleet-ingest-{uuid.uuid4().hex[:12]}",
                keepalive_s=keepalive_s,
                clean_start=not self._persistent,
                session_expiry_s=session_expiry_s if self._persistent else None,
                receive_maximum=receive_maximum,
                manual_ack=True,
                tls=tls_context(tls_ca, tls_cert, tls_key),
                username=username,
                password=password,
                reconnect_min_s=RECONNECT_MIN_S,
                reconnect_max_s=RECONNECT_MAX_S,
            ),
        )
        self._subs = [self.session.subscribe(f, self._on_message, qos=1) for f in self.filters]
        self.session.add_listener(on_down=self._on_down)

    @property
    def _client(self) -> mqtt.Client:
        return self.session.client

    @property
    def _generation(self) -> int:
        return self.session.generation

    @property
    def _disconnected_since(self) -> float | None:
        return None if self.ready else (self.session.down_since or time.monotonic())

    @property
    def _last_error(self) -> str:
        errors = [s.error for s in self._subs if s.error]
        return "; ".join(errors) or self.session.last_error

    @property
    def ready(self) -> bool:
        """Whether connected and subscribed."""
        return all(s.granted.is_set() for s in self._subs)

    def stats(self) -> IngestStats:
        """A copy of the counters."""
        return replace(self._stats)

    def start(self, timeout_s: float = 10.0) -> None:
        """Connect, subscribe and start the worker thread.

        Raises:
            IngestError: not subscribed within ``timeout_s`` (the worker is stopped), or
                the worker was stopped before.
        """
        if self._thread is not None:
            return
        if self._stopping.is_set():
            raise IngestError("a stopped worker does not start again; make a new one")
        self._thread = threading.Thread(target=self._run, name="fleet-ingest", daemon=True)
        self._thread.start()
        self.session.start()
        deadline = time.monotonic() + timeout_s
        for sub in self._subs:
            if not sub.granted.wait(max(deadline - time.monotonic(), 0.0)):
                error = self._last_error
                self.stop()
                raise IngestError(
                    f"not subscribed on {self.host}:{self.port} within {timeout_s:g} s "
                    f"{f'({error})' if error else ''}".strip()
                )

    def stop(self, timeout_s: float = 5.0) -> None:
        """Store what was received, acknowledge it, disconnect; idempotent.

        What arrives from here on is left unacknowledged, for the broker to deliver again.
        """
        thread, self._thread = self._thread, None
        if thread is None:
            return
        # A clean session loses what it holds unacknowledged: stop the flow first.
        wait_s = min(timeout_s, UNSUBSCRIBE_TIMEOUT_S)
        if (
            not self._persistent
            and self.ready
            and not self.session.unsubscribe(self.filters, timeout_s=wait_s)
        ):
            log.warning("ingest: not unsubscribed; messages in flight may be lost")
        self._stopping.set()
        thread.join(timeout_s)
        if thread.is_alive():
            log.error("ingest: records not stored within %g s; left to the broker", timeout_s)
            self._abort.set()
            thread.join(RETRY_MAX_S)  # at most one pause between sink retries
        self.session.stop()

    # -- session callbacks (network thread) ----------------------------------------

    def _on_message(self, msg: mqtt.MQTTMessage) -> None:
        stats = self._stats
        stats.received += 1
        if not stats.first_received:
            stats.first_received = time.monotonic()
        if self._stopping.is_set():
            stats.not_queued += 1  # delivered again by the broker, to us or another worker
            return
        item = _Item(
            msg.topic, bytes(msg.payload), msg.mid, msg.qos, self._generation, time.monotonic()
        )
        waited = False
        while True:
            try:
                self._queue.put(item, timeout=ENQUEUE_WAIT_S)
            except queue.Full:
                if not waited:
                    waited = True
                    stats.overflow += 1
                    log.warning("ingest: queue full; the network thread waits for room")
            else:
                return
            if self._stopping.is_set() or self._abort.is_set():
                stats.not_queued += 1  # delivered again by the broker after the disconnect
                return

    def _on_down(self, reason: str) -> None:
        if not self._stopping.is_set():
            log.warning("ingest: %s", reason)

    # -- the worker thread ------------------------------------------------------------

    def _run(self) -> None:
        while not (self._stopping.is_set() and self._queue.empty()) and not self._abort.is_set():
            items = self._collect()
            if not items:
                continue
            try:
                self._flush(items)
            except Exception:  # a bug must not end ingest: log, count, go on
                self._stats.internal_errors += 1
                log.exception("ingest: a batch of %d messages failed", len(items))

    def _collect(self) -> list[_Item]:
        try:
            items = [self._queue.get(timeout=0.2)]
        except queue.Empty:
            return []
        deadline = time.monotonic() + self.flush_interval_s
        while len(items) < self.batch_size:
            wait = min(deadline - time.monotonic(), IDLE_GAP_S)
            try:
                items.append(
                    self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                )
            except queue.Empty:
                break
        return items

    def _flush(self, items: list[_Item]) -> None:
        batch = Batch(bounds=self.clock_bounds, clock=self.clock)
        self._storing_since = min(i.received for i in items)
        try:
            for item in items:
                self._route(item, batch)
            batch.store(self.sink, self._stats, self._abort, self.retry)
        finally:
            oldest, self._storing_since = self._storing_since, None
        stats = self._stats
        stats.batches += 1
        stats.last_flushed = time.monotonic()
        stats.last_lag_s = stats.last_flushed - oldest
        stats.max_lag_s = max(stats.max_lag_s, stats.last_lag_s)
        if batch.complete:
            self._ack(items, batch.failed)
        else:
            stats.unacked += len(items)

    def _ack(self, items: list[_Item], failed: set[int]) -> None:
        generation = self._generation
        for index, item in enumerate(items):
            if item.qos == 0:
                continue
            if index in failed:
                self._stats.unacked += 1  # the broker resends it (reconnect, restart)
                continue
            if item.generation != generation:
                self._stats.unacked += 1  # the broker resends it after the reconnect
                continue
            if not self.session.ack(item.mid, item.qos):
                self._stats.unacked += 1

    # -- health -----------------------------------------------------------------------

    def oldest_wait_s(self) -> float:
        """How long the oldest message received and not yet stored has waited (0: none)."""
        now = time.monotonic()
        oldest = self._storing_since
        with self._queue.mutex:
            if self._queue.queue:
                head = self._queue.queue[0].received
                oldest = head if oldest is None else min(oldest, head)
        return 0.0 if oldest is None else max(0.0, now - oldest)

    def health(self) -> PartHealth:
        """Whether the worker does its job: its thread alive, connected (or not for
        longer than ``max_disconnected_s``), and no message waiting to be stored for
        longer than ``max_lag_s``; the detail gives the figures."""
        thread = self._thread
        alive = thread is not None and thread.is_alive()
        since = self._disconnected_since
        down_s = 0.0 if since is None else time.monotonic() - since
        wait_s = self.oldest_wait_s()
        s = self._stats
        problems = []
        if not alive:
            problems.append("worker thread not running")
        if not self.ready and down_s > self.max_disconnected_s:
            problems.append(f"not connected for {down_s:.0f} s (max {self.max_disconnected_s:g})")
        if wait_s > self.max_lag_s:
            problems.append(f"a message waits {wait_s:.1f} s (max_lag_s {self.max_lag_s:g})")
        detail: dict[str, Any] = {
            "thread_alive": alive,
            "connected": self.ready,
            "disconnected_s": round(down_s, 3),
            "queue": self._queue.qsize(),
            "oldest_wait_s": round(wait_s, 3),
            "last_lag_s": round(s.last_lag_s, 3),
            "received": s.received,
            "stored": s.stored,
            "duplicates": s.duplicates,
            "quarantined": s.quarantined,
            "poison_isolated": s.poison_isolated,
            "sink_errors": s.sink_errors,
            "transient_retries": s.transient_retries,
            "gave_up": s.gave_up,
            "unacked": s.unacked,
            "internal_errors": s.internal_errors,
        }
        if problems:
            detail["problems"] = problems
        return PartHealth(not problems, detail)

    def _route(self, item: _Item, batch: Batch) -> None:
        try:
            batch.add(item.topic, item.payload, self.max_payload_bytes)
        except (MessageError, ValueError) as exc:
            batch.reject(item.topic, str(exc), item.payload)
        except Exception as exc:  # a bug must not end ingest: quarantine, count, go on
            self._stats.internal_errors += 1
            log.exception("ingest: %s: unexpected failure", item.topic)
            batch.reject(item.topic, f"internal error: {exc!r}", item.payload)
