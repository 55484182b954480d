"""One batch: payloads validated by topic into records (or set aside), then stored into a
sink with retries."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

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

if TYPE_CHECKING:
    from fleet_server.ingest.sink import Sink
    from fleet_server.ingest.worker import IngestStats

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.1
RETRY_MAX_S = 10.0

T = TypeVar("T")


@dataclass
class Batch:
    """Records of one flush, by kind, and the payloads set aside."""

    heartbeats: list[Heartbeat] = field(default_factory=list)
    health: list[Health] = field(default_factory=list)
    telemetry: list[Telemetry] = field(default_factory=list)
    decisions: list[DecisionRow] = field(default_factory=list)
    thumbnails: list[ThumbnailUpload] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    states: list[tuple[str, ReportedState]] = field(default_factory=list)
    rejected: list[tuple[str, str, bytes]] = field(default_factory=list)
    complete: bool = True
    """False when storing was abandoned (the worker stopped while the sink failed)."""

    def add(self, topic: str, payload: bytes, max_bytes: int) -> None:
        """Validate the payload of a device topic and add its records.

        Raises:
            MessageError: oversized, not JSON, not a valid message of the topic, or of
                another device than the topic's.
            ValueError: not a device topic.
        """
        add = _routes().get(topics.filter_of(topic))
        if add is None:
            raise MessageError("unknown", f"no ingest for topic {topic!r}")
        add(self, topics.device_of(topic), payload, max_bytes)

    def reject(self, topic: str, reason: str, payload: bytes) -> None:
        """Set a payload aside for :meth:`Sink.quarantine`."""
        log.warning("ingest: quarantined %s: %s", topic, reason)
        self.rejected.append((topic, reason, payload))

    def store(self, sink: Sink, stats: IngestStats, abort: threading.Event) -> None:
        """Store everything, retrying each sink call until it works or ``abort`` is set."""
        tables: list[tuple[str, Sized, Callable[[], int]]] = [
            ("heartbeats", self.heartbeats, lambda: sink.store_heartbeats(self.heartbeats)),
            ("health", self.health, lambda: sink.store_health(self.health)),
            ("telemetry", self.telemetry, lambda: sink.store_telemetry(self.telemetry)),
            ("decisions", self.decisions, lambda: sink.store_decisions(self.decisions)),
            ("thumbnails", self.thumbnails, lambda: sink.store_thumbnails(self.thumbnails)),
            ("events", self.events, lambda: sink.store_events(self.events)),
        ]
        for what, rows, call in tables:
            if not len(rows):
                continue
            inserted = _retry(what, call, stats, abort)
            if inserted is None:
                self.complete = False
                return
            stats.stored += inserted
            stats.duplicates += len(rows) - inserted
        for device_id, state in self.states:

            def store_state(device_id: str = device_id, state: ReportedState = state) -> bool:
                sink.store_state(device_id, state)
                return True

            if _retry("state", store_state, stats, abort) is None:
                self.complete = False
                return
            stats.states += 1
        for topic, reason, payload in self.rejected:

            def quarantine(topic: str = topic, reason: str = reason, data: bytes = payload) -> bool:
                sink.quarantine(topic, reason, data)
                return True

            if _retry("quarantine", quarantine, stats, abort) is None:
                self.complete = False
                return
            stats.quarantined += 1


def _check(device_id: str, message: Message) -> None:
    if message.device_id != device_id:
        raise MessageError(
            getattr(message, "kind", type(message).__name__),
            f"device_id {message.device_id!r} differs from the topic's {device_id!r}",
        )


def _add_state(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    state = parse(ReportedState, payload, max_bytes)
    _check(device_id, state)
    batch.states.append((device_id, state))


def _add_heartbeat(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    beat = parse(Heartbeat, payload, max_bytes)
    _check(device_id, beat)
    batch.heartbeats.append(beat)


def _add_telemetry(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    sample = parse_telemetry(payload, max_bytes)
    _check(device_id, sample)
    if isinstance(sample, Health):
        batch.health.append(sample)
    else:
        batch.telemetry.append(sample)


def _add_decisions(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    upload = parse(DecisionUpload, payload, max_bytes)
    _check(device_id, upload)
    batch.decisions.extend(upload.rows)


def _add_thumbnail(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    thumbnail = parse(ThumbnailUpload, payload, max_bytes)
    _check(device_id, thumbnail)
    batch.thumbnails.append(thumbnail)


def _add_event(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    event = parse(Event, payload, max_bytes)
    _check(device_id, event)
    batch.events.append(event)


def _add_install_state(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    report = parse_object("install-state", payload, max_bytes)
    batch.events.append(install_state_event(device_id, report))


_Add = Callable[[Batch, str, bytes, int], None]
_HANDLERS: tuple[tuple[Callable[[str], str], _Add], ...] = (
    (topics.state, _add_state),
    (topics.heartbeat, _add_heartbeat),
    (topics.telemetry, _add_telemetry),
    (topics.decisions, _add_decisions),
    (topics.thumbnails, _add_thumbnail),
    (topics.events, _add_event),
    (topics.install_state, _add_install_state),
)
INGEST_TOPICS: tuple[Callable[[str], str], ...] = tuple(t for t, _ in _HANDLERS)
"""The device topics ingest subscribes to."""


@functools.cache
def _routes() -> dict[str, _Add]:
    return {topics.device_filter(t): add for t, add in _HANDLERS}


def _retry(
    what: str, call: Callable[[], T], stats: IngestStats, abort: threading.Event
) -> T | None:
    """``call()``; on an exception log, count and call again after a growing pause.

    ``None`` when ``abort`` was set before a call worked.
    """
    delay = RETRY_FIRST_S
    while not abort.is_set():
        try:
            return call()
        except Exception:  # any sink failure: log, count, retry; ingest goes on
            stats.sink_errors += 1
            log.exception("ingest: storing %s failed; retrying in %g s", what, delay)
        abort.wait(delay)
        delay = min(delay * 2, RETRY_MAX_S)
    return None
