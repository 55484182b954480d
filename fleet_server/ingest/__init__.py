"""Ingest: device reports from the broker into storage, idempotent, never stopped by a
bad payload. :class:`IngestWorker` subscribes (shared, for several workers) and stores
into a :class:`Sink`.
"""

from fleet_server.ingest.batch import INGEST_TOPICS
from fleet_server.ingest.sink import MemorySink, Quarantined, Sink
from fleet_server.ingest.stats import IngestStats
from fleet_server.ingest.worker import IngestError, IngestWorker

__all__ = [
    "INGEST_TOPICS",
    "IngestError",
    "IngestStats",
    "IngestWorker",
    "MemorySink",
    "Quarantined",
    "Sink",
]
