"""The ingest benches (``hil bench ingest``).

- :func:`bench_inserts`: the storage layer alone, heartbeats per second in batches as one
  ingest worker writes them (the issue's target: >= 5,000 per worker), then the same
  rows again (all duplicates).
- :func:`bench_ingest`: ingest workers on one shared subscription of a broker against a
  burst from a :class:`~hil.bench.simfleet.SimFleet`, into memory: messages per second
  per worker, and what was lost or doubled.
- :func:`hil.bench.ingest_sql.bench_sql_ingest`: the same into a fleet database.

Example::

    hil bench ingest --rows 100000 --json .cache/bench-inserts.json
    hil bench ingest --mqtt 127.0.0.1:1883 --workers 2 --devices 1000 --rounds 10
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from fleet_server.db import open_database, sqlite_url
from fleet_server.db.errors import StorageError
from fleet_server.db.records import Record, insert_heartbeats
from fleet_server.errors import FleetError
from fleet_server.ingest.sink import MemorySink
from fleet_server.ingest.worker import IngestWorker
from hil.bench.ingest_sql import bench_sql_ingest
from hil.bench.simfleet import SimError, SimFleet


@dataclass(frozen=True)
class InsertBench:
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


def bench_inserts(
    engine: Engine, n: int, *, batch_size: int = 500, devices: int = 1000
) -> InsertBench:
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
    return InsertBench(
        backend=engine.dialect.name,
        rows=n,
        batch_size=batch_size,
        inserted=inserted,
        seconds=seconds,
        rows_per_s=n / seconds,
        redelivered_per_s=n / redelivery_s,
    )


@dataclass(frozen=True)
class BenchResult:
    """Figures of one ingest bench run."""

    workers: int
    sent: int
    stored: int
    duplicates: int
    lost: int
    elapsed_s: float
    per_worker: tuple[int, ...]

    @property
    def msgs_per_s(self) -> float:
        """Records stored per second, all workers together."""
        return self.stored / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def msgs_per_s_per_worker(self) -> float:
        """:attr:`msgs_per_s` divided by the number of workers."""
        return self.msgs_per_s / self.workers


def bench_ingest(
    host: str,
    port: int,
    *,
    workers: int = 1,
    devices: int = 1000,
    rounds: int = 10,
    window: int = 800,
    group: str | None = None,
    timeout_s: float = 60.0,
) -> BenchResult:
    """Ingest ``rounds`` heartbeats of ``devices`` devices as fast as they go, through
    ``workers`` workers of one shared group, into one :class:`MemorySink`.

    The fleet stays at most ``window`` messages ahead of what is stored, so the broker's
    per-client queue never overflows (Mosquitto's default holds 1,000 beyond a worker's
    Receive Maximum of 64, and what is stored is acknowledged a moment later).

    Raises:
        SimError: a client can't connect, or the records are not stored in ``timeout_s``.
    """
    sink = MemorySink()
    group = group or f"bench-{uuid.uuid4().hex[:8]}"
    pool = [IngestWorker(host, port, sink=sink, group=group) for _ in range(workers)]
    for worker in pool:
        worker.start()
    try:
        with SimFleet(host, port, devices=devices, prefix=f"b{uuid.uuid4().hex[:6]}") as fleet:
            start = time.monotonic()
            deadline = start + timeout_s
            published = 0
            for _ in range(rounds):
                while published + devices - sink.total() > window:
                    if time.monotonic() > deadline:
                        raise SimError(f"records not stored within {timeout_s:g} s")
                    time.sleep(0.002)
                published += fleet.heartbeats()
            fleet.wait_acked(published, max(0.0, deadline - time.monotonic()))
            while sink.total() < fleet.sent()[0] and time.monotonic() < deadline:
                time.sleep(0.002)
            elapsed = time.monotonic() - start
            sent = fleet.sent()[0]
    finally:
        for worker in pool:
            worker.stop()
    stats = [w.stats() for w in pool]
    stored = sink.total()
    return BenchResult(
        workers=workers,
        sent=sent,
        stored=stored,
        duplicates=sum(s.duplicates for s in stats),
        lost=sent - stored,
        elapsed_s=elapsed,
        per_worker=tuple(s.stored for s in stats),
    )


def _broker(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    return host, int(port)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    if args.mqtt is None:
        with tempfile.TemporaryDirectory(prefix="edgefleet-ingest-bench-") as tmp:
            engine = open_database(args.db_url or sqlite_url(Path(tmp) / "fleet.db"))
            try:
                inserts = bench_inserts(
                    engine, args.rows, batch_size=args.batch_size, devices=args.devices
                )
            finally:
                engine.dispose()
        return {"bench": "inserts", **asdict(inserts)}
    host, port = args.mqtt
    if args.db_url is None:
        mem = bench_ingest(
            host, port, workers=args.workers, devices=args.devices, rounds=args.rounds
        )
        return {
            "bench": "ingest", **asdict(mem), "msgs_per_s": round(mem.msgs_per_s, 1),
            "msgs_per_s_per_worker": round(mem.msgs_per_s_per_worker, 1),
        }  # fmt: skip
    engine = open_database(args.db_url)
    try:
        sql = bench_sql_ingest(
            host, port, engine, workers=args.workers, devices=args.devices,
            rounds=args.rounds, batch_size=args.batch_size,
        )  # fmt: skip
    finally:
        engine.dispose()
    return {
        "bench": "sql-ingest", **asdict(sql),
        "msgs_per_s_per_worker": round(sql.msgs_per_s_per_worker, 1),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``hil bench ingest``: see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="hil bench ingest",
        description="Ingest throughput: storage inserts alone (default), or ingest workers "
        "on a broker's shared subscription (--mqtt) into memory or a database (--db-url).",
        epilog="example: hil bench ingest --rows 100000 --json .cache/bench-inserts.json",
    )
    parser.add_argument("--mqtt", type=_broker, metavar="HOST:PORT",
                        help="a broker: run ingest workers against a simulated fleet")  # fmt: skip
    parser.add_argument("--db-url", help="a database (default: a temporary SQLite file; "
                        "with --mqtt: into memory)")  # fmt: skip
    parser.add_argument("--rows", type=int, default=100_000, help="heartbeats inserted")
    parser.add_argument("--batch-size", type=int, default=500, help="rows per transaction")
    parser.add_argument("--devices", type=int, default=1000, help="simulated devices")
    parser.add_argument("--workers", type=int, default=1, help="ingest workers (--mqtt)")
    parser.add_argument("--rounds", type=int, default=10, help="heartbeats per device (--mqtt)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = _run(args)
    except FleetError as exc:
        print(f"bench-ingest: error: {exc}", file=sys.stderr)
        return 2
    for key, value in result.items():
        print(f"{key:24} {value}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
