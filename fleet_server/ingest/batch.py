"""One batch: payloads validated by topic into records (or set aside), then stored into a
sink, where no record can hold up another.

Validating: a payload that is not a valid message of its topic, or a record with a
device time out of bounds (:mod:`fleet_server.ingest.clock`), is set aside for
quarantine; the other rows of the same decision upload are kept.

Storing, one sink call per kind of record: a call that fails is told permanent or
transient by :func:`fleet_server.ingest.failures.classify`. A permanent failure splits
the call's records in halves, and each half is stored on its own, until the record at
fault is alone; it is quarantined (topic, reason, the message's payload) and the rest
are stored (``poison_isolated`` counts those records). A transient failure is retried
with a growing pause, at most ``RetryPolicy.attempts`` calls in all
(``transient_retries`` counts each retry); then the call's records are given up
(``gave_up``): the messages they came from are left unacknowledged for the broker to
deliver again, and the batch goes on with the next kind. A quarantine insert that fails
permanently is tried once more with the topic and reason made storable and the payload
stored as hex (cut to a cap), so that no payload blocks the quarantine either.

Quality records (shadow comparisons, drift buckets: :mod:`fleet_server.ingest.quality`)
are screened before they are stored: one sink call (:meth:`Sink.known_models`) says
which of their model versions the fleet knows for their devices, and each record of an
unknown one is quarantined alone, its reason naming the model version and the device.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from agent.wire import topics
from agent.wire.messages import (
    DecisionRow,
    DecisionUpload,
    Event,
    Health,
    Heartbeat,
    Message,
    MessageError,
    ReportedState,
    Telemetry,
    ThumbnailUpload,
    install_state_event,
    parse,
    parse_object,
    parse_telemetry,
)
from fleet_server.db.quarantine import storable
from fleet_server.ingest.clock import ClockBounds, ClockSkew, Timed, check_record
from fleet_server.ingest.failures import RetryPolicy, classify, describe
from fleet_server.ingest.quality import (
    DriftItem,
    ModelRef,
    QualityItem,
    ShadowItem,
    add_quality,
    unknown_reason,
)

if TYPE_CHECKING:
    from fleet_server.ingest.sink import Sink
    from fleet_server.ingest.stats import IngestStats

log = logging.getLogger(__name__)

RETRY_FIRST_S = RetryPolicy.first_s
RETRY_MAX_S = RetryPolicy.max_s
QUARANTINE_FALLBACK_CAP = 16 * 1024
"""Bytes of a payload kept (as hex) when the quarantine can't store it as it came."""

T = TypeVar("T")
Outcome = Literal["ok", "permanent", "gave_up", "aborted"]


@dataclass
class _Entry:
    """A record and the message (index into :attr:`Batch.sources`) it came from."""

    record: Any
    source: int


@dataclass
class Batch:
    """Records of one flush, by kind, and the payloads set aside.

    Attributes:
        bounds: the device-time bounds (``None``: not checked).
        clock: the server's clock (Unix seconds).
        sources: (topic, payload) of every message added, in order.
        failed: indexes of :attr:`sources` whose records were not all stored (given
            up after transient failures): left unacknowledged.
        complete: False when storing was abandoned (the worker stopped while the sink
            failed): nothing of the batch is acknowledged.
    """

    bounds: ClockBounds | None = None
    clock: Callable[[], float] = time.time
    heartbeats: list[Heartbeat] = field(default_factory=list)
    health: list[Health] = field(default_factory=list)
    telemetry: list[Telemetry] = field(default_factory=list)
    decisions: list[DecisionRow] = field(default_factory=list)
    thumbnails: list[ThumbnailUpload] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    shadow: list[ShadowItem] = field(default_factory=list)
    drift: list[DriftItem] = field(default_factory=list)
    states: list[tuple[str, ReportedState]] = field(default_factory=list)
    rejected: list[tuple[str, str, bytes]] = field(default_factory=list)
    sources: list[tuple[str, bytes]] = field(default_factory=list)
    failed: set[int] = field(default_factory=set)
    complete: bool = True
    _entries: dict[str, list[_Entry]] = field(default_factory=dict)
    _rejected_from: list[int] = field(default_factory=list)

    def add(self, topic: str, payload: bytes, max_bytes: int) -> None:
        """Validate the payload of a device topic and add its records.

        A record with a device time out of :attr:`bounds` is set aside (rejected) with
        the field named; the message's other records are kept.

        Raises:
            MessageError: oversized, not JSON, not a valid message of the topic, or of
                another device than the topic's.
            ValueError: not a device topic.
        """
        add = _routes().get(topics.filter_of(topic))
        if add is None:
            raise MessageError("unknown", f"no ingest for topic {topic!r}")
        self.sources.append((topic, payload))
        try:
            add(self, topics.device_of(topic), payload, max_bytes)
        except BaseException:
            self.sources.pop()
            raise

    def reject(self, topic: str, reason: str, payload: bytes) -> None:
        """Set a payload aside for :meth:`Sink.quarantine` (a message of its own, in
        :attr:`sources`, as every call of :meth:`add` or this one is)."""
        log.warning("ingest: quarantined %s: %s", topic, reason)
        self.sources.append((topic, payload))
        self.rejected.append((topic, reason, payload))
        self._rejected_from.append(len(self.sources) - 1)

    def add_parsed(self, topic: str, payload: bytes, records: Sequence[Timed]) -> None:
        """Add records already parsed from ``payload`` (one message of ``topic``), as
        :meth:`add` would: device times checked, each record remembered with its
        message. For a caller that validated the message itself (a replay, a test)."""
        self.sources.append((topic, payload))
        for record in records:
            if isinstance(record, ReportedState):
                self.states.append((record.device_id, record))
                self._entries.setdefault("states", []).append(
                    _Entry((record.device_id, record), len(self.sources) - 1)
                )
                continue
            kind = _KINDS[type(record)]
            if self._put(
                kind, record, f"row {record.id}" if isinstance(record, DecisionRow) else ""
            ):
                getattr(self, kind).append(record)

    def _put(self, kind: str, record: Timed, key: str = "") -> bool:
        """Add a record of the message being added (False: set aside, times out of
        bounds)."""
        source = len(self.sources) - 1
        if self.bounds is not None:
            try:
                check_record(self.bounds, record, self.clock())
            except ClockSkew as exc:
                topic, payload = self.sources[source]
                what = f"{kind} {key}: " if key else ""
                log.warning("ingest: quarantined %s: %s%s", topic, what, exc)
                self.rejected.append((topic, f"{what}{exc}", payload))
                self._rejected_from.append(source)
                return False
        self._entries.setdefault(kind, []).append(_Entry(record, source))
        return True

    def put_item(
        self, kind: str, record: Any, times: Sequence[tuple[str, float]], name: str
    ) -> bool:
        """Add a record of the message being added whose device times are ``times``
        (field, value); False: set aside, a time out of bounds."""
        source = len(self.sources) - 1
        if self.bounds is not None:
            now = self.clock()
            try:
                for time_field, value in times:
                    self.bounds.check(time_field, value, now)
            except ClockSkew as exc:
                topic, payload = self.sources[source]
                log.warning("ingest: quarantined %s: %s: %s", topic, name, exc)
                self.rejected.append((topic, f"{name}: {exc}", payload))
                self._rejected_from.append(source)
                return False
        self._entries.setdefault(kind, []).append(_Entry(record, source))
        return True

    def store(
        self,
        sink: Sink,
        stats: IngestStats,
        abort: threading.Event,
        policy: RetryPolicy | None = None,
    ) -> None:
        """Store everything (see the module docstring); stop when ``abort`` is set."""
        run = _Storing(self, sink, stats, abort, policy or RetryPolicy())
        calls: list[tuple[str, Callable[[list[Any]], int]]] = [
            ("heartbeats", sink.store_heartbeats),
            ("health", sink.store_health),
            ("telemetry", sink.store_telemetry),
            ("decisions", sink.store_decisions),
            ("thumbnails", sink.store_thumbnails),
            ("events", sink.store_events),
        ]
        for kind, call in calls:
            if not run.records(kind, self._entries.get(kind, []), call):
                self.complete = False
                return
        quality: list[tuple[str, Callable[[list[Any]], int]]] = [
            ("shadow", sink.store_shadow),
            ("drift", sink.store_drift),
        ]
        for kind, call in quality:
            known = run.screen(self._entries.get(kind, []))
            if known is None or not run.records(kind, known, call):
                self.complete = False
                return
        for entry in self._entries.get("states", []):
            device_id, state = entry.record

            def store_state(_rows: list[Any], d: str = device_id, s: ReportedState = state) -> int:
                sink.store_state(d, s)
                return 1

            if not run.records("state", [entry], store_state, states=True):
                self.complete = False
                return
        for (topic, reason, payload), source in zip(
            self.rejected, self._rejected_from, strict=True
        ):
            if not run.quarantine(topic, reason, payload, source):
                self.complete = False
                return


@dataclass
class _Storing:
    batch: Batch
    sink: Sink
    stats: IngestStats
    abort: threading.Event
    policy: RetryPolicy

    def attempt(self, what: str, call: Callable[[], T]) -> tuple[Outcome, T | None, str]:
        """``call()``, retried while it fails transiently (at most the policy's
        attempts); the outcome, its result and the reason of the last failure."""
        delay = self.policy.first_s
        attempt = 0
        while not self.abort.is_set():
            attempt += 1
            try:
                return "ok", call(), ""
            except Exception as exc:  # noqa: BLE001 (classified: permanent or transient)
                self.stats.sink_errors += 1
                reason = describe(exc)
                if classify(exc) == "permanent":
                    log.warning("ingest: storing %s failed for good: %s", what, reason)
                    return "permanent", None, reason
                if attempt >= self.policy.attempts:
                    log.error("ingest: storing %s failed %d times: %s", what, attempt, reason)  # noqa: TRY400
                    return "gave_up", None, reason
                self.stats.transient_retries += 1
                log.warning("ingest: storing %s failed (%s); retrying in %g s", what, reason, delay)
            self.abort.wait(delay)
            delay = min(delay * 2, self.policy.max_s)
        return "aborted", None, ""

    def screen(self, entries: Sequence[_Entry]) -> list[_Entry] | None:
        """The quality entries whose model version the sink knows for their device;
        each other one is quarantined alone (its record's JSON, the reason). When the
        sink can't answer, the entries' messages are left unacknowledged. None when
        aborted."""
        if not entries:
            return []
        wanted: set[ModelRef] = {e.record.model() for e in entries}
        outcome, known, reason = self.attempt(
            "model versions", functools.partial(self.sink.known_models, wanted)
        )
        if outcome == "aborted":
            return None
        if outcome != "ok" or known is None:
            log.error("ingest: can't check model versions (%s); left to the broker", reason)
            self.stats.gave_up += len(entries)
            self.batch.failed.update(e.source for e in entries)
            return []
        kept = []
        for entry in entries:
            item: QualityItem = entry.record
            if item.model() in known:
                kept.append(entry)
                continue
            topic = self.batch.sources[entry.source][0]
            why = unknown_reason(item)
            log.warning("ingest: quarantined %s: %s", topic, why)
            if not self.quarantine(topic, why, item.payload(), entry.source):
                return None
        return kept

    def records(
        self,
        kind: str,
        entries: Sequence[_Entry],
        call: Callable[[list[Any]], int],
        *,
        states: bool = False,
    ) -> bool:
        """Store ``entries`` by ``call``, bisecting around permanent failures; False
        when aborted."""
        stats = self.stats
        parts = [list(entries)] if entries else []
        while parts:
            part = parts.pop()
            rows = [e.record for e in part]
            outcome, inserted, reason = self.attempt(kind, functools.partial(call, rows))
            if outcome == "aborted":
                return False
            if outcome == "ok":
                if states:
                    stats.states += len(part)
                else:
                    stats.stored += inserted or 0
                    stats.duplicates += len(part) - (inserted or 0)
            elif outcome == "gave_up":
                stats.gave_up += len(part)
                self.batch.failed.update(e.source for e in part)
            elif len(part) > 1:
                half = len(part) // 2
                parts += [part[half:], part[:half]]  # the first half is stored first
            else:
                stats.poison_isolated += 1
                topic, payload = self.batch.sources[part[0].source]
                why = f"can't store {kind} {_name(part[0].record)}: {reason}"
                if not self.quarantine(topic, why, payload, part[0].source):
                    return False
        return True

    def quarantine(self, topic: str, reason: str, payload: bytes, source: int) -> bool:
        """Quarantine a payload, the fallback form if the plain one can't be stored;
        False when aborted."""
        sink = self.sink

        def plain() -> None:
            sink.quarantine(topic, reason, payload)

        outcome, _, why = self.attempt("quarantine", plain)
        if outcome == "permanent":
            shown = payload[:QUARANTINE_FALLBACK_CAP].hex().encode()

            def fallback() -> None:
                sink.quarantine(
                    storable(topic),
                    storable(f"{reason} [payload as hex, {len(payload)} bytes: {why}]"),
                    shown,
                )

            outcome, _, why = self.attempt("quarantine", fallback)
        if outcome == "aborted":
            return False
        if outcome == "ok":
            self.stats.quarantined += 1
        else:
            log.error("ingest: can't quarantine a payload of %s: %s", topic, why)
            self.stats.gave_up += 1
            if source >= 0:
                self.batch.failed.add(source)
        return True


def _name(record: Any) -> str:
    if isinstance(record, tuple):
        return f"state of {record[0]}"
    key = getattr(record, "key", None)
    if callable(key):
        return storable(repr(key()))
    return type(record).__name__


def _check(device_id: str, message: Message) -> None:
    if message.device_id != device_id:
        raise MessageError(
            getattr(message, "kind", type(message).__name__),
            f"device_id {message.device_id!r} differs from the topic's {device_id!r}",
        )


def _add_state(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    state = parse(ReportedState, payload, max_bytes)
    _check(device_id, state)
    if batch.bounds is not None and state.ts is not None:
        try:
            check_record(batch.bounds, state, batch.clock())
        except ClockSkew as exc:
            raise MessageError("state", str(exc)) from None
    batch.states.append((device_id, state))
    batch._entries.setdefault("states", []).append(
        _Entry((device_id, state), len(batch.sources) - 1)
    )


def _add_heartbeat(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    beat = parse(Heartbeat, payload, max_bytes)
    _check(device_id, beat)
    if batch._put("heartbeats", beat):
        batch.heartbeats.append(beat)


def _add_telemetry(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    sample = parse_telemetry(payload, max_bytes)
    _check(device_id, sample)
    if isinstance(sample, Health):
        if batch._put("health", sample):
            batch.health.append(sample)
    elif batch._put("telemetry", sample):
        batch.telemetry.append(sample)


def _add_decisions(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    upload = parse(DecisionUpload, payload, max_bytes)
    _check(device_id, upload)
    for row in upload.rows:
        if batch._put("decisions", row, f"row {row.id}"):
            batch.decisions.append(row)


def _add_thumbnail(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    thumbnail = parse(ThumbnailUpload, payload, max_bytes)
    _check(device_id, thumbnail)
    if batch._put("thumbnails", thumbnail):
        batch.thumbnails.append(thumbnail)


def _add_event(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    event = parse(Event, payload, max_bytes)
    _check(device_id, event)
    if batch._put("events", event):
        batch.events.append(event)


def _add_install_state(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    report = parse_object("install-state", payload, max_bytes)
    event = install_state_event(device_id, report)
    if batch._put("events", event):
        batch.events.append(event)


_KINDS: dict[type, str] = {
    Heartbeat: "heartbeats",
    Health: "health",
    Telemetry: "telemetry",
    DecisionRow: "decisions",
    ThumbnailUpload: "thumbnails",
    Event: "events",
}

_Add = Callable[[Batch, str, bytes, int], None]
_HANDLERS: tuple[tuple[Callable[[str], str], _Add], ...] = (
    (topics.state, _add_state),
    (topics.heartbeat, _add_heartbeat),
    (topics.telemetry, _add_telemetry),
    (topics.decisions, _add_decisions),
    (topics.thumbnails, _add_thumbnail),
    (topics.events, _add_event),
    (topics.install_state, _add_install_state),
    (topics.quality, add_quality),
)
INGEST_TOPICS: tuple[Callable[[str], str], ...] = tuple(t for t, _ in _HANDLERS)
"""The device topics ingest subscribes to."""


@functools.cache
def _routes() -> dict[str, _Add]:
    return {topics.device_filter(t): add for t, add in _HANDLERS}
