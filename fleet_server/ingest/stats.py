"""The counters of one ingest worker, shared by the worker and the batch it stores
(:mod:`fleet_server.ingest.batch`), which counts into them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IngestStats:
    """Counters of one worker. ``received`` counts messages; ``stored`` and
    ``duplicates`` count records (a decision upload holds many)."""

    received: int = 0
    stored: int = 0
    duplicates: int = 0
    quarantined: int = 0
    """Payloads set aside in the sink's quarantine (invalid, clock out of bounds,
    not storable)."""
    poison_isolated: int = 0
    """Of ``quarantined``: records the sink refused, found by splitting their batch."""
    transient_retries: int = 0
    """Sink calls tried again after a transient failure (the database, not a record)."""
    gave_up: int = 0
    """Records left unacknowledged after the bounded retries (the broker resends them)."""
    states: int = 0
    batches: int = 0
    sink_errors: int = 0
    internal_errors: int = 0
    not_queued: int = 0
    """Received while stopping: left to the broker to resend after the disconnect."""
    overflow: int = 0
    """Messages that found the queue full and waited for room (none is dropped)."""
    unacked: int = 0
    """Handled but not acknowledged (connection lost, or storing abandoned at stop)."""
    first_received: float = 0.0
    last_flushed: float = 0.0
    last_lag_s: float = 0.0
    """Receive to stored, of the oldest message of the last batch."""
    max_lag_s: float = 0.0
    """The largest ``last_lag_s`` seen."""


__all__ = ["IngestStats"]
