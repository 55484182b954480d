"""Ingest throughput into the fleet database: :func:`bench_sql_ingest`.

Ingest workers on one shared subscription store heartbeats through a :class:`SqlSink`
(SQLite or PostgreSQL, whatever the engine is) while a simulated fleet publishes them as
fast as the workers keep up. The fleet runs in a child process so that its MQTT clients
do not share the interpreter lock with the workers; the figure is messages stored per
second per worker, from the first message received to the last batch stored.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from typing import Any

from sqlalchemy.engine import Engine

from fleet_server.db import store
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.ingest.worker import IngestWorker
from hil.bench.simfleet import SimError, SimFleet

POLL_S = 0.005
JOIN_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SqlIngestBench:
    """Figures of one run. ``lost``: acknowledged by the broker but not in the database;
    ``duplicates``: records stored twice (counted by the database, so always 0 unless
    the keys are broken)."""

    backend: str
    workers: int
    sent: int
    stored: int
    in_database: int
    duplicates: int
    lost: int
    elapsed_s: float
    per_worker: tuple[int, ...]

    @property
    def msgs_per_s_per_worker(self) -> float:
        """Records stored per second, divided by the number of workers."""
        if self.elapsed_s <= 0:
            return 0.0
        return self.stored / self.elapsed_s / self.workers


def _fleet(
    host: str,
    port: int,
    prefix: str,
    devices: int,
    rounds: int,
    allowed: Synchronized[int],
    sent: Synchronized[int],
    timeout_s: float,
) -> None:
    """The child process: ``rounds`` heartbeats per device, never more than ``allowed``
    published; writes how many the broker acknowledged to ``sent`` (-1: gave up)."""
    deadline = time.monotonic() + timeout_s
    with SimFleet(host, port, devices=devices, clients=4, prefix=prefix) as fleet:
        published = 0
        for _ in range(rounds):
            while published + devices > allowed.value:
                if time.monotonic() > deadline:
                    sent.value = -1
                    return
                time.sleep(POLL_S)
            published += fleet.heartbeats()
        fleet.wait_acked(published, max(0.0, deadline - time.monotonic()))
        sent.value = fleet.sent()[0]


def bench_sql_ingest(
    host: str,
    port: int,
    engine: Engine,
    *,
    workers: int = 1,
    devices: int = 1000,
    rounds: int = 20,
    window: int = 800,
    batch_size: int = 500,
    timeout_s: float = 120.0,
) -> SqlIngestBench:
    """Ingest ``rounds`` heartbeats of ``devices`` registered devices through ``workers``
    workers of one shared group into the database of ``engine``.

    The fleet stays at most ``window`` messages ahead of what is stored, so the broker's
    per-client queue never overflows (Mosquitto's default holds 1,000 beyond a worker's
    Receive Maximum of 64, and what is stored is acknowledged a moment later).

    Raises:
        SimError: the fleet can't connect, or the records are not stored in ``timeout_s``.
    """
    prefix = f"q{uuid.uuid4().hex[:6]}"
    ids = [f"{prefix}-{i:05d}" for i in range(devices)]  # SimFleet's naming
    with store.write_transaction(engine) as conn:
        for device_id in ids:
            store.upsert_device(conn, device_id, labels={"bench": prefix}, profile="bench")
    before = store.count_records(engine, "heartbeats")
    sink = SqlSink(engine)
    group = f"sqlbench-{prefix}"
    pool = [
        IngestWorker(host, port, sink=sink, group=group, batch_size=batch_size)
        for _ in range(workers)
    ]
    ctx = multiprocessing.get_context("spawn")
    allowed: Synchronized[int] = ctx.Value("q", window)
    sent: Synchronized[int] = ctx.Value("q", 0)
    child: Any = None
    try:
        for worker in pool:
            worker.start()
        proc = ctx.Process(
            target=_fleet,
            args=(host, port, prefix, devices, rounds, allowed, sent, timeout_s),
            daemon=True,
        )
        proc.start()
        child = proc
        deadline = time.monotonic() + timeout_s
        total = devices * rounds
        while True:
            handled = sum(s.stored + s.duplicates for s in (w.stats() for w in pool))
            allowed.value = handled + window
            done = sent.value != 0 and handled >= sent.value
            if done or time.monotonic() > deadline or sent.value < 0:
                break
            time.sleep(POLL_S)
        if not done:
            raise SimError(
                f"{handled} of {total} heartbeats stored within {timeout_s:g} s "
                f"(broker acknowledged {sent.value})"
            )
    finally:
        for worker in pool:
            worker.stop()
        if child is not None:
            child.join(JOIN_TIMEOUT_S)
            if child.is_alive():
                child.kill()
                child.join(JOIN_TIMEOUT_S)
    stats = [w.stats() for w in pool]
    started = min(s.first_received for s in stats if s.first_received)
    ended = max(s.last_flushed for s in stats)
    stored = sum(s.stored for s in stats)
    in_db = store.count_records(engine, "heartbeats") - before
    return SqlIngestBench(
        backend=engine.dialect.name,
        workers=workers,
        sent=sent.value,
        stored=stored,
        in_database=in_db,
        duplicates=stored - in_db,
        lost=sent.value - in_db,
        elapsed_s=ended - started,
        per_worker=tuple(s.stored for s in stats),
    )
