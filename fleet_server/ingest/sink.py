"""Where ingest puts what devices report: the :class:`Sink` protocol and :class:`MemorySink`.

A sink is idempotent: every ``store_*`` call inserts only the records whose identity
(``key()`` of the record: see :mod:`agent.wire.messages`) it does not hold yet, the
duplicates within one call included, and returns how many it inserted. Ingest calls a
sink from one thread at a time per worker; several workers may share one sink.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agent.wire.messages import (
    DecisionRow,
    Event,
    Health,
    Heartbeat,
    ReportedState,
    Telemetry,
    ThumbnailUpload,
)
from fleet_server.ingest.quality import DriftItem, ModelRef, ShadowItem

QUARANTINE_KEEP = 10_000
"""How many quarantined payloads a MemorySink keeps (the count goes on)."""


class Sink(Protocol):
    """Storage for ingest. Every method may raise; ingest then retries the batch."""

    def store_heartbeats(self, rows: Sequence[Heartbeat]) -> int:
        """Insert the heartbeats not stored yet; how many were inserted."""
        ...

    def store_health(self, rows: Sequence[Health]) -> int:
        """Insert the health reports not stored yet; how many were inserted."""
        ...

    def store_telemetry(self, rows: Sequence[Telemetry]) -> int:
        """Insert the telemetry samples not stored yet; how many were inserted."""
        ...

    def store_decisions(self, rows: Sequence[DecisionRow]) -> int:
        """Insert the decision rows not stored yet; how many were inserted."""
        ...

    def store_thumbnails(self, rows: Sequence[ThumbnailUpload]) -> int:
        """Insert the decision thumbnails not stored yet; how many were inserted."""
        ...

    def store_events(self, rows: Sequence[Event]) -> int:
        """Insert the events not stored yet; how many were inserted."""
        ...

    def store_shadow(self, rows: Sequence[ShadowItem]) -> int:
        """Insert the shadow records not stored yet; how many were inserted."""
        ...

    def store_drift(self, rows: Sequence[DriftItem]) -> int:
        """Insert the drift buckets not stored yet and replace those whose copy counts
        more decisions (totals grow while a bucket is open); how many were written."""
        ...

    def known_models(self, wanted: Collection[ModelRef]) -> set[ModelRef]:
        """Of ``wanted`` (device_id, model_name, model_version), those the fleet knows
        for that device (the rest are quarantined, not stored)."""
        ...

    def store_state(self, device_id: str, state: ReportedState) -> None:
        """Record the device's reported state, unless the one held is newer (by ``ts``).

        A state without ``ts`` (the last will) changes only ``online``.
        """
        ...

    def quarantine(self, topic: str, reason: str, payload: bytes) -> None:
        """Set aside a payload that is not a valid message, with why."""
        ...


@dataclass(frozen=True)
class Quarantined:
    """One payload set aside."""

    topic: str
    reason: str
    payload: bytes


class _Keyed(Protocol):
    def key(self) -> Hashable: ...


R = TypeVar("R", bound=_Keyed)


def merge_state(held: ReportedState | None, new: ReportedState) -> ReportedState | None:
    """The state to keep when ``new`` arrives (``None``: keep ``held``).

    A newer or equal ``ts`` replaces; an older one is ignored; no ``ts`` (the last will)
    changes only ``online``.
    """
    if held is None:
        return new
    if new.ts is None:
        return held.model_copy(update={"online": new.online})
    if held.ts is not None and new.ts < held.ts:
        return None
    return new


class MemorySink:
    """A thread-safe, idempotent sink in memory, for tests and the scale bench.

    Unbounded except for the quarantine list (the last :data:`QUARANTINE_KEEP`). A
    model version is known for a device when the device's newest reported state held
    names it as its active, previous or shadow bundle, or it is in ``assigned``
    (device id, bundle name, version): what the fleet gave the device. A decision row
    never makes it known.
    """

    def __init__(
        self,
        quarantine_keep: int = QUARANTINE_KEEP,
        assigned: Collection[tuple[str, str, str]] = (),
    ) -> None:
        self._lock = threading.Lock()
        self.heartbeats: dict[tuple[str, str], Heartbeat] = {}
        self.health: dict[tuple[str, str], Health] = {}
        self.telemetry: dict[tuple[str, str], Telemetry] = {}
        self.decisions: dict[tuple[str, str], DecisionRow] = {}
        self.thumbnails: dict[tuple[str, str], ThumbnailUpload] = {}
        self.events: dict[tuple[str, str], Event] = {}
        self.shadow: dict[Hashable, ShadowItem] = {}
        self.drift: dict[Hashable, DriftItem] = {}
        self.assigned = set(assigned)
        self.states: dict[str, ReportedState] = {}
        self.quarantined: deque[Quarantined] = deque(maxlen=quarantine_keep)
        self.quarantine_count = 0
        self.calls = 0

    def _insert(self, table: dict[Any, R], rows: Sequence[R]) -> int:
        inserted = 0
        with self._lock:
            self.calls += 1
            for row in rows:
                key = row.key()
                if key not in table:
                    table[key] = row
                    inserted += 1
        return inserted

    def store_heartbeats(self, rows: Sequence[Heartbeat]) -> int:
        """Insert the heartbeats not stored yet; how many were inserted."""
        return self._insert(self.heartbeats, rows)

    def store_health(self, rows: Sequence[Health]) -> int:
        """Insert the health reports not stored yet; how many were inserted."""
        return self._insert(self.health, rows)

    def store_telemetry(self, rows: Sequence[Telemetry]) -> int:
        """Insert the telemetry samples not stored yet; how many were inserted."""
        return self._insert(self.telemetry, rows)

    def store_decisions(self, rows: Sequence[DecisionRow]) -> int:
        """Insert the decision rows not stored yet; how many were inserted."""
        return self._insert(self.decisions, rows)

    def store_thumbnails(self, rows: Sequence[ThumbnailUpload]) -> int:
        """Insert the decision thumbnails not stored yet; how many were inserted."""
        return self._insert(self.thumbnails, rows)

    def store_events(self, rows: Sequence[Event]) -> int:
        """Insert the events not stored yet; how many were inserted."""
        return self._insert(self.events, rows)

    def store_shadow(self, rows: Sequence[ShadowItem]) -> int:
        """Insert the shadow records not stored yet; how many were inserted."""
        return self._insert(self.shadow, rows)

    def store_drift(self, rows: Sequence[DriftItem]) -> int:
        """Insert new drift buckets, replace those whose copy counts more; how many."""
        written = 0
        with self._lock:
            self.calls += 1
            for row in rows:
                held = self.drift.get(row.key())
                if held is None or held.hour.n < row.hour.n:
                    self.drift[row.key()] = row
                    written += 1
        return written

    def known_models(self, wanted: Collection[ModelRef]) -> set[ModelRef]:
        """Of ``wanted``, those the device's state names or the fleet assigned it."""
        with self._lock:
            seen = {
                (device_id, b.name, b.version)
                for device_id, state in self.states.items()
                for b in (state.active, state.previous, state.shadow)
                if b is not None
            }
        return {w for w in wanted if w in seen or w in self.assigned}

    def store_state(self, device_id: str, state: ReportedState) -> None:
        """Keep the newest state of the device (see :func:`merge_state`)."""
        with self._lock:
            self.calls += 1
            kept = merge_state(self.states.get(device_id), state)
            if kept is not None:
                self.states[device_id] = kept

    def quarantine(self, topic: str, reason: str, payload: bytes) -> None:
        """Keep the payload and why it was set aside (the last ``quarantine_keep``)."""
        with self._lock:
            self.quarantine_count += 1
            self.quarantined.append(Quarantined(topic, reason, bytes(payload)))

    def total(self) -> int:
        """How many records of every kind are stored (states not counted)."""
        with self._lock:
            return (
                len(self.heartbeats)
                + len(self.health)
                + len(self.telemetry)
                + len(self.decisions)
                + len(self.thumbnails)
                + len(self.events)
                + len(self.shadow)
                + len(self.drift)
            )
