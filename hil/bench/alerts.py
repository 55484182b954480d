"""The alerts bench (``hil bench alerts``): what one evaluation of the alert rules costs
the fleet server, on SQLite and on a throw-away PostgreSQL (:mod:`hil.pgcluster`), with
``--devices`` devices (each with a health report; 5 % offline, a tenth with a station
whose counts rose, a few over their disk budget), ``--decisions`` decisions of the last
day (a tenth sent for review), two rollouts, drift flags, and a certificate from a real
fleet CA for every device.

Measured per backend and fleet size: the wall time and the fleet server's own CPU
(``time.process_time`` of this process: on SQLite that is all of it, on PostgreSQL the
database's share runs in its own process, reported apart from the backends' CPU as
PostgreSQL counts it is not attempted) of

- a normal evaluation (every ``[alerts] interval_s``): everything but certificates and
  repository metadata; the median of ``--rounds``;
- the slow one (every ``slow_interval_s``): with every device's certificate read, the
  first time from the CA's files, then from the cache by serial.

Example::

    python -m hil.bench.alerts --devices 1000 10000 --json .cache/bench-alerts.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy.engine import Engine

from agent.wire.reports import Health, ReportedState
from fleet_server.alerts.config import AlertsSection
from fleet_server.alerts.facts import Sources
from fleet_server.alerts.runner import Evaluator
from fleet_server.ca import FleetCA
from fleet_server.cluster import SingleReplica
from fleet_server.db import open_database, sqlite_url, store
from fleet_server.db.store import DecisionRecord
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.repository import Passphrases
from hil.pgcluster import start_cluster, stop_cluster

BATCH = 500
PASSPHRASE = "alerts bench passphrase, made here"  # noqa: S105 (a throw-away CA)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _csr(device_id: str, key: ec.EllipticCurvePrivateKey) -> bytes:
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, device_id)])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


def seed(engine: Engine, ca: FleetCA, devices: int, decisions: int, now: float) -> None:
    """The fleet the rules judge (see the module docstring)."""
    clock = Clock(now - 3600)
    sink = SqlSink(engine, clock=clock)
    key = ec.generate_private_key(ec.SECP256R1())  # one key: the CA signs a CSR per device
    ids = [f"dev-{i:05d}" for i in range(devices)]
    for i, device in enumerate(ids):
        issued = ca.sign_device_csr(
            _csr(device, key), device, valid_days=20 if i % 50 == 0 else 300
        )
        store.upsert_device(
            engine, device, labels={"site": f"plant-{i % 4}", "line": str(i % 20)},
            profile="x86-gateway", cert_serial=issued.serial_hex,
        )  # fmt: skip
    for start in range(0, devices, BATCH):
        part = ids[start : start + BATCH]
        clock.now = now - 20 * 60
        sink.store_health(
            [_health(d, clock.now, 1, i + start, rose=False) for i, d in enumerate(part)]
        )
        clock.now = now - 30
        sink.store_health(
            [_health(d, clock.now, 2, i + start, rose=True) for i, d in enumerate(part)]
        )
        for i, device in enumerate(part):
            if (start + i) % 20 == 0:  # 5 %: their session ended an hour ago
                clock.now = now - 3600
                sink.store_state(device, ReportedState(device_id=device, ts=clock.now))
                sink.store_state(device, ReportedState.offline(device))
    for start in range(0, decisions, BATCH):
        rows = [
            DecisionRecord(f"d-{k}", ids[k % devices], now - 86_000 * k / decisions, "cam0",
                           "review" if k % 10 == 0 else "pass", "detector", "1.0.0",
                           {"line": str(k % 20)})
            for k in range(start, min(decisions, start + BATCH))
        ]  # fmt: skip
        store.insert_decisions(engine, rows)


def _health(device: str, ts: float, seq: int, i: int, *, rose: bool) -> Health:
    fields: dict[str, Any] = {"disk_free_mb": 20_000.0, "state_dir_mb": 300.0,
                              "disk_budget_mb": 1024.0}  # fmt: skip
    if i % 200 == 0:
        fields["state_dir_mb"] = 1100.0  # over its budget
    if i % 10 == 0:
        n = 40 if rose else 10
        fields["stations"] = {"gate": {"triggers": 1000 * seq, "deadline_missed": n, "overruns": n}}
    return Health.model_validate({"device_id": device, "seq": seq, "ts": ts, **fields})


def measure(engine: Engine, ca: FleetCA, rounds: int, now: float) -> dict[str, Any]:
    """Normal and slow evaluations of a seeded database (see the module docstring)."""
    clock = Clock(now)
    sources = Sources(issued=lambda serial: ca.issued(serial).not_after)
    section = AlertsSection.model_validate({"slow_interval_s": 86_400})
    evaluator = Evaluator(engine, section, SingleReplica("bench"), sources, clock=clock)

    def once() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        evaluator.run_once()
        return time.perf_counter() - wall, time.process_time() - cpu

    first_wall, first_cpu = once()  # the slow one, certificates read from the CA's files
    fired = evaluator.stats.fired
    evaluator.next_slow = 0.0
    cached_wall, cached_cpu = once()  # slow again: certificates from the cache
    normal = [once() for _ in range(rounds)]
    return {
        "alerts_fired": fired,
        "slow_first_wall_s": round(first_wall, 4),
        "slow_first_cpu_s": round(first_cpu, 4),
        "slow_cached_wall_s": round(cached_wall, 4),
        "slow_cached_cpu_s": round(cached_cpu, 4),
        "normal_wall_s": round(statistics.median(w for w, _ in normal), 4),
        "normal_cpu_s": round(statistics.median(c for _, c in normal), 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hil bench alerts", description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--decisions", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", choices=["sqlite", "postgresql"], nargs="+",
                    default=["sqlite", "postgresql"])  # fmt: skip
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    logging.getLogger("fleet_server.alerts").setLevel(logging.ERROR)  # each alert that fires
    now = time.time()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-alerts-") as tmp:
        root = Path(tmp)
        pg = start_cluster() if "postgresql" in args.backend else None
        try:
            for n in args.devices:
                ca = FleetCA.create(root / f"ca-{n}", passphrases=Passphrases(
                    environ={"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE}))  # fmt: skip
                for backend in args.backend:
                    if backend == "sqlite":
                        url = sqlite_url(root / f"fleet-{n}.db")
                    else:
                        assert pg is not None
                        url = pg.create_database()
                    engine = open_database(url)
                    began = time.monotonic()
                    seed(engine, ca, n, args.decisions, now)
                    seeded = time.monotonic() - began
                    figures = measure(engine, ca, args.rounds, now)
                    row = {"backend": backend, "devices": n, "decisions": args.decisions,
                           "seed_s": round(seeded, 1), **figures}  # fmt: skip
                    engine.dispose()
                    results.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            if pg is not None:
                stop_cluster(pg)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
