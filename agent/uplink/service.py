"""The device's uplink to the fleet: on the device's one MQTT 5 session with the fleet
broker (:mod:`agent.uplink.session`: TLS with the device's identity, shared with the
directives service and the bundle fetcher), carrying its reported state (retained),
heartbeats, health, events and decision uploads (:mod:`agent.wire.topics`,
:mod:`agent.wire.messages`).

Store and forward: health reports, events and decision batches go into the durable
outbox first (:mod:`agent.uplink.outbox`), online or not, and are deleted only after a
success PUBACK (:mod:`agent.uplink.drain`); a refused one (NOT_AUTHORIZED ...) is counted
and sent again later. The reported state (retained, refreshed on every connect) and
heartbeats (liveness, not records) are live only.

The last will is :meth:`ReportedState.offline` on the state topic, retained: the fleet
sees the device offline when its connection dies, and :meth:`Uplink.stop` ends with a
DISCONNECT that asks the broker to publish it too.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.decisionlog import DecisionLog
from agent.enrollment.identity import Identity
from agent.errors import AgentError
from agent.kernel.errors import EdgefleetError
from agent.kernel.mqtt import MqttSession
from agent.livelatency import LiveLoad
from agent.uplink import decisions
from agent.uplink.acks import Pending, Publisher
from agent.uplink.config import UplinkConfig
from agent.uplink.drain import Drain
from agent.uplink.outbox import (
    KIND_DECISIONS,
    KIND_EVENT,
    KIND_HEALTH,
    KIND_QUALITY,
    KIND_THUMBNAIL,
    Entry,
    Outbox,
)
from agent.uplink.quality import QualitySender
from agent.uplink.session import fleet_session
from agent.uplink.sysinfo import SysInfo
from agent.wire import topics
from agent.wire.messages import (
    Event,
    Health,
    Heartbeat,
    Message,
    MessageError,
    ReportedState,
    encode,
    error_text,
)

log = logging.getLogger(__name__)

StateSource = Callable[[], Mapping[str, Any]]
HealthSource = Callable[[], Mapping[str, Any]]
AlarmSink = Callable[[str, str], None]
_MAX_BACKOFF_S = 60.0
_JOIN_S = 5.0


@dataclass
class _Timer:
    due: float
    step: Callable[[], None]
    interval: float


class UplinkError(AgentError):
    """The uplink can't send: not started, or paho refused the message (queue full).

    Attributes:
        reason: what failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"uplink: {reason}")


class Uplink:
    """Reports this device to the fleet (see the module docstring).

    Args:
        device_id: this device; the client id and the topics' device level. The broker
            lets it publish only on the topics of its certificate's CN.
        identity: the key, certificate and broker from enrollment.
        state: what :class:`ReportedState` holds besides device id, time and online
            (agent_version, profile, labels, active, previous); called on every (re)connect
            and by :meth:`publish_state`.
        health: the agent's part of :class:`Health` (fps, latency_ms, queue_depth, drops);
            the machine's part (CPU, memory, temperature, disk) comes from ``sysinfo``.
        decision_log: the log whose rows are uploaded; None uploads none.
        sysinfo: the machine sampler (default: disk of the identity's state directory).
        state_dir: where the outbox lives when its path is relative (default: the
            identity directory's parent).
        on_alarm: also told of the outbox's alarms (which are sent as ``alarm`` events).
        session: the device's one session with the fleet broker
            (:func:`agent.uplink.session.fleet_session`), shared with the directives
            service and the bundle fetcher; whoever made it starts and stops it. None:
            the uplink makes its own and starts and stops it.
        load: the hot path's live latency, which paces the outbox's drain
            (``[uplink] drain_pacing``): in one process the decision sink's
            ``live.snapshot`` (:class:`agent.livelatency.LatencyWindow`), across processes
            its copy from the control channel. None, or a source that returns None: the
            fixed ``drain_rate_per_s``.

    Raises:
        IdentityError: the identity's TLS files can't be loaded.
        OutboxError: the outbox can't be opened.
    """

    def __init__(
        self,
        device_id: str,
        identity: Identity,
        config: UplinkConfig,
        *,
        state: StateSource,
        health: HealthSource,
        decision_log: DecisionLog | None = None,
        sysinfo: SysInfo | None = None,
        state_dir: Path | None = None,
        on_alarm: AlarmSink | None = None,
        session: MqttSession | None = None,
        load: Callable[[], LiveLoad | None] | None = None,
    ) -> None:
        self.device_id = device_id
        self.identity = identity
        self.config = config
        self._state_source = state
        self._health_source = health
        state_dir = state_dir or identity.directory.parent
        self._sysinfo = sysinfo or SysInfo(state_dir)
        self._on_alarm = on_alarm
        self._seq: Counter[str] = Counter()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._decisions_wake = threading.Event()
        self._quality_wake = threading.Event()
        self._state_due = threading.Event()
        self._connected = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._state_topic = topics.state(device_id)
        self._owns_session = session is None
        self.session = session or fleet_session(identity, config, will=True)
        self.host, self.port = self.session.options.host, self.session.options.port
        self.guard = self.session.guard
        self._listener = self.session.add_listener(on_up=self._on_up, on_down=self._on_down)
        self._pub = Publisher(self.session, config.max_queued_messages)
        self._pub.on_answer = self._on_answer
        self._batcher: decisions.Batcher | None = None
        self._quality: QualitySender | None = None
        self.outbox = Outbox(
            config.outbox_path(state_dir),
            int(config.outbox_max_mb * 1024 * 1024),
            drop_order=config.drop_order,
            on_alarm=self._outbox_alarm,
            on_dropped=self._outbox_dropped,
        ).open()
        self._drain = Drain(
            self.outbox,
            self._pub,
            connected=self._connected,
            window=config.drain_window,
            rate_per_s=config.drain_rate_per_s,
            ack_timeout_s=config.ack_timeout_s,
            on_delivered=self._delivered,
            stop=self._stop,
            pacing=config.pacing(),
            load=load,
            pace_interval_s=config.drain_pace_interval_s,
        )
        if decision_log is not None:
            self._batcher = decisions.Batcher(
                decision_log,
                device_id,
                self.outbox,
                self._pub,
                batch=config.decisions_batch,
                thumbnails_dir=decision_log.state_dir if config.upload_thumbnails else None,
            )
            self._quality = QualitySender(
                decision_log.path,
                device_id,
                self.outbox,
                self._pub,
                batch=config.quality_batch,
                thumbnails_dir=decision_log.state_dir if config.upload_thumbnails else None,
            )

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background (and keep reconnecting); start the report threads.

        Raises:
            UplinkError: started before.
        """
        if self._started:
            raise UplinkError("already started (an Uplink starts once)")
        self._started = True
        for part in (self._batcher, self._quality):
            if part is None:
                continue
            try:
                part.reconcile()
            except EdgefleetError as exc:
                log.error("uplink: %s", exc)  # noqa: TRY400 - expected, no traceback
        if self._owns_session:
            self.session.start()
        elif self.session.connected:
            self._on_up()  # the shared session was up before the uplink joined it
        self._spawn("uplink-reports", self._reports_loop)
        self._spawn("uplink-outbox", self._drain.run)
        if self._batcher is not None:
            self._spawn("uplink-decisions", self._decisions_loop)
        if self._quality is not None:
            self._spawn("uplink-quality", self._quality_loop)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def wait_connected(self, timeout_s: float) -> bool:
        """Whether the broker accepted the connection within ``timeout_s``."""
        return self._connected.wait(timeout_s)

    @property
    def connected(self) -> bool:
        """Whether the connection is up."""
        return self._connected.is_set()

    def stop(self, timeout_s: float = _JOIN_S) -> None:
        """Stop the threads and disconnect, asking the broker to publish the offline will.
        Idempotent; waits at most about ``timeout_s`` for the threads."""
        if not self._started or self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        self._drain.notify()
        self._decisions_wake.set()
        self._quality_wake.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.error("uplink: thread %s did not stop within %.1f s", thread.name, timeout_s)
        self.session.remove_listener(self._listener)
        if self._owns_session:
            self.session.stop(max(deadline - time.monotonic(), 1.0), publish_will=True)
        self._connected.clear()
        if self._quality is not None:
            self._quality.close()
        self.outbox.close()

    # -- what is sent ------------------------------------------------------------------

    def publish_state(self) -> Pending | None:
        """Publish the reported state now (retained, QoS 1); None when not connected."""
        if not self.connected:
            self._state_due.set()  # sent on connect
            return None
        try:
            extra = dict(self._state_source())
        except Exception:
            log.exception("uplink: the state source failed; reporting online only")
            self._pub.count("state_errors")
            extra = {}
        extra.setdefault("labels", self.identity.labels)
        if self.identity.profile:
            extra.setdefault("profile", self.identity.profile)
        base = {"device_id": self.device_id, "ts": time.time(), "online": True}
        try:
            message = ReportedState.model_validate({**extra, **base})
        except ValidationError as exc:
            why = error_text(exc)
            log.error("uplink: reported state not valid (%s); reporting online only", why)  # noqa: TRY400
            self._pub.count("state_errors")
            message = ReportedState.model_validate(base)
        return self._send("state", self._state_topic, message, retain=True)

    def event(
        self,
        kind: str,
        payload: Mapping[str, Any],
        *,
        event_id: str | None = None,
        ts: float | None = None,
    ) -> str:
        """Queue an event in the outbox (sent when connected, in order). Returns its id:
        give the same id when sending the same event again (the fleet stores it once).

        Raises:
            MessageError: not a valid event (bad kind or id, payload too large).
            UplinkError: stopped, or the outbox dropped it (over budget; counted).
            OutboxError: the outbox can't be written.
        """
        if self._stop.is_set():
            raise UplinkError(f"event {kind!r} not queued: the uplink is not running (stopped)")
        eid = event_id or f"{kind}-{uuid.uuid4().hex}"
        try:
            message = Event(
                device_id=self.device_id,
                kind=kind,
                event_id=eid,
                ts=ts or time.time(),
                payload=dict(payload),
            )
        except ValidationError as exc:
            raise MessageError("event", error_text(exc)) from exc
        if self._queue(KIND_EVENT, topics.events(self.device_id), message) is None:
            raise UplinkError(f"event {eid} dropped: the outbox is over its budget")
        return eid

    def _queue(self, kind: str, topic: str, message: Message) -> int | None:
        seq = self.outbox.put(kind, topic, encode(message))
        if seq is not None:
            self._drain.notify()
        return seq

    def _send(
        self, kind: str, topic: str, message: Message, *, qos: int = 1, retain: bool = False
    ) -> Pending | None:
        return self._pub.send(kind, topic, encode(message), qos=qos, retain=retain)

    def _heartbeat(self) -> None:
        message = Heartbeat(device_id=self.device_id, seq=self._next("heartbeat"), ts=time.time())
        self._send(
            "heartbeat", topics.heartbeat(self.device_id), message, qos=self.config.heartbeat_qos
        )

    def _health(self) -> None:
        data: dict[str, Any] = self._sysinfo.sample()
        try:
            data.update(self._health_source())
        except Exception:
            log.exception("uplink: the health source failed; sending the machine's part")
            self._pub.count("health_errors")
        base = {"device_id": self.device_id, "seq": self._next("health"), "ts": time.time()}
        try:
            message = Health.model_validate({**data, **base})
        except ValidationError as exc:
            log.error("uplink: health report not valid, not sent: %s", error_text(exc))  # noqa: TRY400
            self._pub.count("health_errors")
            return
        self._queue(KIND_HEALTH, topics.telemetry(self.device_id), message)

    def _next(self, kind: str) -> int:
        seq = self._seq[kind]
        self._seq[kind] += 1
        return seq

    # -- threads -----------------------------------------------------------------------

    def _reports_loop(self) -> None:
        cfg = self.config
        start = time.monotonic()
        timers = [
            _Timer(start, self._heartbeat, cfg.heartbeat_interval_s),
            _Timer(start, self._health, cfg.health_interval_s),
        ]
        live = {id(timers[0])}  # heartbeats are liveness, not records: live only
        while not self._stop.is_set():
            now = time.monotonic()
            for timer in timers:
                if now < timer.due:
                    continue
                timer.due = max(timer.due + timer.interval, now)
                if self.connected or id(timer) not in live:
                    self._guarded(timer.step)
                else:
                    self._pub.count("skipped_offline")
            if self._state_due.is_set() and self.connected:
                self._state_due.clear()
                self._guarded(self.publish_state)
            wait = min(t.due for t in timers) - time.monotonic()
            self._wake.wait(min(max(wait, 0.0), 1.0))
            self._wake.clear()

    def _guarded(self, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception:  # a report thread outlives a bad report: log and count
            log.exception("uplink: %s failed", getattr(step, "__name__", step))
            self._pub.count("report_errors")

    def _decisions_loop(self) -> None:
        """Batch decisions into the outbox while connected (offline, the decision log
        holds them), keeping at most :meth:`Drain.ahead` batches (and thumbnails) ahead of
        the sender."""
        batcher = self._batcher
        if batcher is None:
            return
        interval = self.config.decisions_interval_s
        failures = 0
        wait = interval
        while not self._stop.is_set():
            self._decisions_wake.wait(wait)
            self._decisions_wake.clear()
            if self._stop.is_set():
                break
            wait = interval
            if not self.connected:
                continue
            # Thumbnails count too: a backlog of rejects must not fill the outbox with
            # images queued ahead of the sender (they would be dropped for room).
            if (
                max(self.outbox.pending(KIND_DECISIONS), self.outbox.pending(KIND_THUMBNAIL))
                >= self._drain.ahead()  # paced: about a second's worth, no burst of work
            ):
                wait = min(interval, 0.05)
                continue
            try:
                rows = batcher.fill_once()
                failures = 0
            except EdgefleetError as exc:
                failures += 1
                log.error("uplink: %s", exc)  # noqa: TRY400 - expected, no traceback
                rows = 0
            except Exception:
                failures += 1
                log.exception("uplink: queueing decisions failed")
                rows = 0
            if rows:
                self._drain.notify()
            if rows and batcher.more_waiting:
                wait = 0.0  # a full batch: more are waiting
            elif failures:
                wait = min(interval * 2 ** min(failures, 6), max(_MAX_BACKOFF_S, interval))

    def _quality_loop(self) -> None:
        """Queue shadow comparisons and closed drift buckets while connected (offline, the
        decision log holds them), at most :meth:`Drain.ahead` quality records ahead of the
        sender; every ``quality_interval_s``, at once on connect and while more wait."""
        sender = self._quality
        if sender is None:
            return
        interval = self.config.quality_interval_s
        failures = 0
        wait = 0.0
        while not self._stop.is_set():
            self._quality_wake.wait(wait)
            self._quality_wake.clear()
            if self._stop.is_set():
                break
            wait = interval
            if not self.connected:
                continue
            if self.outbox.pending(KIND_QUALITY) >= self._drain.ahead():
                wait = min(interval, 0.1)
                continue
            try:
                queued = sender.fill_once()
                failures = 0
            except EdgefleetError as exc:
                failures += 1
                log.error("uplink: %s", exc)  # noqa: TRY400 - expected, no traceback
                queued = 0
            except Exception:
                failures += 1
                log.exception("uplink: queueing quality data failed")
                queued = 0
            if queued:
                self._drain.notify()
            if queued and sender.more_waiting:
                wait = 0.0
            elif failures:
                wait = min(interval * 2 ** min(failures, 6), max(_MAX_BACKOFF_S, interval))

    # -- outbox callbacks --------------------------------------------------------------

    def _delivered(self, entries: Sequence[Entry]) -> None:
        if self._batcher is not None:
            self._batcher.delivered(entries)
        if self._quality is not None:
            self._quality.delivered(entries)

    def _outbox_dropped(self, entry: Entry) -> None:
        if self._batcher is not None:
            self._batcher.dropped(entry)
        if self._quality is not None:
            self._quality.dropped(entry)

    def _outbox_alarm(self, kind: str, message: str) -> None:
        if self._on_alarm is not None:
            self._on_alarm(kind, message)
        try:
            self.event("alarm", {"alarm": kind, "message": message})
        except EdgefleetError as exc:
            log.error("uplink: the %s alarm could not be queued: %s", kind, exc)  # noqa: TRY400

    # -- paho callbacks (network thread) -----------------------------------------------

    def _on_answer(self) -> None:
        self._drain.notify()

    def _on_up(self) -> None:
        self._pub.count("connects")
        self._pub.last_error = ""
        self._connected.set()
        self._state_due.set()
        self._wake.set()
        self._drain.notify()
        self._decisions_wake.set()  # a backlog starts draining at once
        self._quality_wake.set()

    def _on_down(self, reason: str) -> None:
        was_up = self._connected.is_set()
        self._connected.clear()
        if "refused the connection" in reason:
            self._pub.count("connect_refused")
            self._pub.last_error = reason
            log.error("uplink: %s", reason)
            return
        if was_up:
            self._pub.count("disconnects")
            if not self._stop.is_set():
                log.warning("uplink: %s", reason)

    # -- figures -----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters: connected, connects, disconnects, sent_<kind>, acked and refused per
        kind, decisions_uploaded, decision_failures, decision_timeouts, decisions_invalid,
        shadow_queued/uploaded, drift_queued/uploaded, quality_batches, quality_invalid,
        skipped_offline, ...; ``session``: the fleet session's state (its network thread,
        restarts, callback errors, subscriptions)."""
        acks = self._pub.acks
        out: dict[str, Any] = self._pub.counts()
        out["connected"] = int(self.connected)
        out["outstanding"] = acks.outstanding()
        out["acked"] = dict(acks.acked)
        out["refused"] = dict(acks.refused)
        out["abandoned"] = dict(acks.abandoned)
        out["unmatched_acks"] = acks.unmatched
        out["last_error"] = self._pub.last_error
        out["outbox"] = self.outbox.stats()
        out["outbox_in_flight"] = self._drain.in_flight()
        out["drain_pacing"] = self._drain.pacer.stats()  # the paced rate, live and idle p99
        out["session"] = self.session.snapshot()  # thread, restarts, callback errors ...
        return out
