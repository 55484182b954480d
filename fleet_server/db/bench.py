"""Ingest throughput of the storage layer: heartbeats per second in batches, as one
ingest worker would write them (the issue's target: >= 5,000 per worker)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from fleet_server.db.errors import StorageError
from fleet_server.db.records import Record, insert_heartbeats


@dataclass(frozen=True)
class IngestBench:
    """Figures of one run: new rows, then the same rows again (all duplicates)."""

    backend: str
    rows: int
    batch_size: int
    inserted: int
    seconds: float
    rows_per_s: float
    redelivered_per_s: float


def _heartbeats(n: int, devices: int, run: str, t0: float) -> list[Record]:
    return [
        Record(
            device_id=f"bench-{i % devices:05d}",
            record_id=f"{run}-{i}",
            ts=t0 + i / devices,
            payload={"schema_version": 1, "seq": i, "uptime_s": i / devices, "online": True},
        )
        for i in range(n)
    ]


def bench_ingest(
    engine: Engine, n: int, *, batch_size: int = 500, devices: int = 1000
) -> IngestBench:
    """Insert ``n`` new heartbeats from ``devices`` devices in batches of
    ``batch_size`` (one transaction each), then insert them all again.

    Raises:
        StorageError: arguments out of range, or not every row was stored exactly once.
    """
    if n < 1 or batch_size < 1 or devices < 1:
        raise StorageError(
            "bench", f"n={n}, batch_size={batch_size}, devices={devices} must be >= 1"
        )
    rows = _heartbeats(n, devices, uuid.uuid4().hex[:12], time.time())
    batches = [rows[i : i + batch_size] for i in range(0, n, batch_size)]
    start = time.perf_counter()
    inserted = sum(insert_heartbeats(engine, batch) for batch in batches)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    again = sum(insert_heartbeats(engine, batch) for batch in batches)
    redelivery_s = time.perf_counter() - start
    if inserted != n or again != 0:
        raise StorageError("bench", f"{n} rows gave {inserted} inserts, then {again} on redelivery")
    return IngestBench(
        backend=engine.dialect.name,
        rows=n,
        batch_size=batch_size,
        inserted=inserted,
        seconds=seconds,
        rows_per_s=n / seconds,
        redelivered_per_s=n / redelivery_s,
    )
