"""The retention bench (``python -m hil.bench.retention``): one retention pass over a
fleet database holding ``--rows`` heartbeats past their budget (and ``--decisions``
decisions with thumbnails, a tenth of them reviewed), on SQLite and on a throw-away
PostgreSQL (:mod:`hil.pgcluster`, fsync on), in batches of ``--batch`` rows.

Reported per backend and batch size: rows deleted, seconds, rows/s, the number of
transactions and the longest one (what an ingest writer may wait behind).

Example::

    python -m hil.bench.retention --rows 100000 --decisions 20000 --batch 1000 5000 \\
        --json .cache/bench-retention.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from fleet_server.db import open_database, sqlite_url, store
from fleet_server.db.store import DecisionRecord, ImageRecord, Record
from fleet_server.retention.config import RetentionSection
from fleet_server.retention.prune import prune
from fleet_server.review.reviews import save_review
from hil.pgcluster import start_cluster, stop_cluster

DAY = 86_400.0
DEVICES = 1000
INSERT_BATCH = 1000
KEPT_FRACTION = 0.1
"""Rows inside the budget, beside those past it (they must stay)."""
THUMB = b"\xff\xd8" + bytes(20_000)
"""A decision image of about 20 KB, as a device uploads."""


def seed(engine: Engine, rows: int, decisions: int, now: float) -> None:
    """``rows`` heartbeats 10-40 days old, a tenth as many 1 day old; ``decisions``
    decisions 100-130 days old with an image, every tenth reviewed."""
    old = [
        Record(f"dev-{i % DEVICES}", f"hb-{i}", now - (10 + 30 * i / rows) * DAY, {"seq": i})
        for i in range(rows)
    ]
    fresh = [
        Record(f"dev-{i % DEVICES}", f"new-{i}", now - DAY, {"seq": i})
        for i in range(int(rows * KEPT_FRACTION))
    ]
    batch = old + fresh
    for i in range(0, len(batch), INSERT_BATCH):
        store.insert_heartbeats(engine, batch[i : i + INSERT_BATCH])
    for i in range(0, decisions, INSERT_BATCH):
        part = range(i, min(decisions, i + INSERT_BATCH))
        ts = [now - (100 + 30 * k / max(1, decisions)) * DAY for k in part]
        store.insert_decisions(
            engine,
            [
                DecisionRecord(f"d-{k}", f"dev-{k % DEVICES}", t, "cam0", "pass", "detector",
                               "1.0.0", {"line": "3"})
                for k, t in zip(part, ts, strict=True)
            ],
        )  # fmt: skip
        store.insert_images(
            engine,
            [
                ImageRecord(f"d-{k}", f"dev-{k % DEVICES}", t, "image/jpeg", 96, 96, THUMB)
                for k, t in zip(part, ts, strict=True)
            ],
        )
    for k in range(0, decisions, 10):
        save_review(
            engine, f"d-{k}", device_id=f"dev-{k % DEVICES}", verdict="confirm", outcome=None,
            note="", reviewer="bench", now=now,
        )  # fmt: skip


def run_one(url: str, rows: int, decisions: int, batch: int) -> dict[str, Any]:
    """Seed a fresh database at ``url``, prune once; the figures."""
    now = time.time()
    engine = open_database(url)
    try:
        seed(engine, rows, decisions, now)
        budgets = RetentionSection.model_validate(
            {"batch_rows": batch, "heartbeats": {"max_age_days": 7},
             "decisions": {"max_age_days": 90, "labelled_days": 365}}
        )  # fmt: skip
        report = prune(engine, budgets, now=now)
    finally:
        engine.dispose()
    by_table = {r.table: r for r in report.tables}
    hb, dec = by_table["heartbeats"], by_table["decisions"]
    return {
        "batch_rows": batch,
        "heartbeats_deleted": hb.deleted,
        "heartbeats_s": round(hb.seconds, 3),
        "heartbeats_rows_per_s": round(hb.deleted / hb.seconds) if hb.seconds else None,
        "heartbeats_transactions": hb.batches,
        "heartbeats_longest_tx_s": round(hb.longest_batch_s, 4),
        "decisions_deleted": dec.deleted,
        "images_deleted": report.deleted.get("decision_images", 0),
        "decisions_s": round(dec.seconds, 3),
        "decisions_rows_per_s": round(dec.deleted / dec.seconds) if dec.seconds else None,
        "decisions_longest_tx_s": round(dec.longest_batch_s, 4),
        "pass_s": round(report.duration_s, 3),
        "longest_tx_s": round(report.longest_batch_s, 4),
        "errors": report.errors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hil bench retention",
        description="One retention pass on SQLite and PostgreSQL: rows/s and the longest "
        "transaction.",
        epilog="example: python -m hil.bench.retention --rows 100000 --batch 1000 5000",
    )
    parser.add_argument("--rows", type=int, default=100_000, help="heartbeats past the budget")
    parser.add_argument("--decisions", type=int, default=20_000, help="old decisions")
    parser.add_argument("--batch", type=int, nargs="+", default=[5000], help="batch_rows")
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    results: list[dict[str, Any]] = []
    backends = ("sqlite", "postgresql") if args.backend == "both" else (args.backend,)
    with tempfile.TemporaryDirectory(prefix="bench-retention-") as tmp:
        cluster = start_cluster(durable=True) if "postgresql" in backends else None
        try:
            for backend in backends:
                for n, batch in enumerate(args.batch):
                    if backend == "sqlite":
                        url = sqlite_url(Path(tmp) / f"fleet-{n}.db")
                    else:
                        assert cluster is not None
                        url = cluster.create_database("bench")
                    result = {"backend": backend, **run_one(url, args.rows, args.decisions, batch)}
                    print(json.dumps(result), flush=True)
                    results.append(result)
        finally:
            if cluster is not None:
                stop_cluster(cluster)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
