"""Synthetic decisions for the review bench: a fleet of devices on sites and lines, and
many decisions with the payload a real agent uploads, bulk-loaded fast (COPY on
PostgreSQL, one ``executemany`` per batch on SQLite), some of them reviewed.

The data is deterministic for a seed. What it holds, for the bench's filters to hit
common and rare values alike: devices on :data:`SITES` sites and :data:`LINES` lines
(labels), two cameras each; one device in five writes rows without a line (the label
counts); outcomes ``pass`` 90 %, ``reject`` 8 %, ``review`` 2 %; three model versions
over time; one decision in a hundred reviewed; and runs of decisions sharing a
timestamp, so that keyset pages meet ties.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from fleet_server.db.tables import decision_review_log, decision_reviews, decisions, devices
from fleet_server.review.errors import ReviewError

SITES = 5
LINES = 50
SPAN_S = 30 * 86_400.0
"""The decisions spread over this many seconds, ending at the seed's ``end``."""
BATCH = 20_000
VERSIONS = ("1.0.0", "1.1.0", "1.2.0")
REVIEWED_EVERY = 100
TIE_EVERY = 50
"""Every this many decisions, a run of a few shares one timestamp."""


@dataclass(frozen=True)
class Seeded:
    """What was loaded, and how long it took."""

    devices: int
    decisions: int
    reviews: int
    seconds: float
    end: float


def device_id(i: int) -> str:
    """The bench's name of device ``i``."""
    return f"bench-dev-{i:05d}"


def device_labels(i: int) -> dict[str, str]:
    """Device ``i``'s labels: its site and line."""
    return {"site": f"site-{i % SITES}", "line": f"line-{i % LINES:02d}"}


def uuid7(ts: float, rng: random.Random) -> str:
    """A UUIDv7 (RFC 9562) for time ``ts``, as the agent makes them."""
    ms = int(ts * 1000) & (2**48 - 1)
    value = (ms << 80) | (0x7 << 76) | (rng.getrandbits(12) << 64)
    value |= (0b10 << 62) | rng.getrandbits(62)
    return str(uuid.UUID(int=value))


def _outputs(rng: random.Random, kind: int, score: float) -> dict[str, Any]:
    if kind == 0:
        return {
            "top_k": [
                {"label": "ok", "score": round(score, 4)},
                {"label": "scratch", "score": round(1 - score, 4)},
            ]
        }
    boxes = [
        {
            "box": [float(rng.randrange(600)), float(rng.randrange(400)), 700.0, 460.0],
            "score": round(score - 0.05 * j, 4),
            "label": "dent",
        }
        for j in range(rng.randrange(1, 4))
    ]
    return {"count": len(boxes), "boxes": boxes}


def _decision(rng: random.Random, n: int, total: int, devices_n: int, end: float) -> dict[str, Any]:
    dev = rng.randrange(devices_n)
    ts = round(end - SPAN_S + SPAN_S * n / total, 3)
    if n % TIE_EVERY < 3:  # a run of three decisions share the run's first timestamp
        ts = round(end - SPAN_S + SPAN_S * (n - n % TIE_EVERY) / total, 3)
    roll = rng.random()
    outcome = "pass" if roll < 0.90 else "reject" if roll < 0.98 else "review"
    version = VERSIONS[min(2, int(3 * n / total + (dev % 7) / 10))]
    labels = device_labels(dev)
    line = "" if dev % 5 == 4 else labels["line"]
    score = 0.5 + rng.random() / 2
    decision_id = uuid7(ts, rng)
    row = {
        "id": decision_id,
        "capture_time": ts - 0.04,
        "decision_time": ts,
        "device_id": device_id(dev),
        "source": f"cam{n % 2}",
        "line": line,
        "model_name": "surface-check",
        "model_version": version,
        "bundle_digest": f"sha256:{version.replace('.', '') * 8}",
        "backend": "onnxruntime",
        "config_hash": "3f1c0ffee0ddba11",
        "input_digest": f"{rng.getrandbits(128):032x}",
        "outputs": _outputs(rng, dev % 2, score),
        "outcome": outcome,
        "thresholds": {"reject_below": 0.6, "review_below": 0.7},
        "latencies_ms": {"queue": 0.4, "inference": 11.2, "postprocess": 0.6, "e2e": 14.1},
        "e2e_ms": 14.1,
        "thumbnail": None,
    }
    return {
        "id": decision_id,
        "device_id": row["device_id"],
        "ts": ts,
        "source": row["source"],
        "outcome": outcome,
        "model_name": row["model_name"],
        "model_version": version,
        "payload": row,
    }


def generate(total: int, devices_n: int, end: float, seed: int) -> Iterator[dict[str, Any]]:
    """The ``total`` decisions, oldest first."""
    rng = random.Random(seed)  # noqa: S311 (bench data, not secrets)
    for n in range(total):
        yield _decision(rng, n, total, devices_n, end)


def _review_rows(rows: list[dict[str, Any]], first_seq: int, at: float) -> list[dict[str, Any]]:
    out = []
    for k, row in enumerate(rows):
        payload = row["payload"]
        confirm = k % 10 != 0
        label = row["outcome"] if confirm else ("reject" if row["outcome"] == "pass" else "pass")
        out.append(
            {
                "decision_id": row["id"],
                "seq": first_seq + k,
                "decision_ts": row["ts"],
                "device_id": row["device_id"],
                "line": payload["line"] or device_labels(int(row["device_id"][-5:]))["line"],
                "model_name": row["model_name"],
                "model_version": row["model_version"],
                "decided": row["outcome"],
                "verdict": "confirm" if confirm else "override",
                "outcome": label,
                "note": "" if confirm else "seeded override",
                "reviewer": "bench",
                "reviewed_at": at,
            }
        )
    return out


def _copy(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """COPY the decisions in (PostgreSQL)."""
    raw: Any = conn.connection.driver_connection
    columns = ("id", "device_id", "ts", "source", "outcome", "model_name", "model_version")
    with (
        raw.cursor() as cur,
        cur.copy(
            "COPY decisions (id, device_id, ts, source, outcome, model_name, model_version, "
            "payload) FROM STDIN"
        ) as copy,
    ):
        for row in rows:
            copy.write_row([*(row[c] for c in columns), json.dumps(row["payload"])])


def _insert(conn: Connection, rows: list[dict[str, Any]]) -> None:
    if conn.dialect.name == "postgresql":
        _copy(conn, rows)
    else:
        conn.execute(decisions.insert(), rows)


def seed(
    engine: Engine,
    total: int,
    devices_n: int,
    *,
    seed_value: int = 1,
    progress: Callable[[str], None] = lambda _m: None,
) -> Seeded:
    """Register ``devices_n`` devices and load ``total`` decisions (1 % reviewed) into an
    empty, migrated database.

    Raises:
        ReviewError: the arguments are out of range or the database holds decisions.
    """
    if total < 1 or devices_n < 1:
        raise ReviewError("seed", f"decisions={total} and devices={devices_n} must be >= 1")
    with engine.connect() as conn:
        if conn.execute(sa.select(sa.func.count()).select_from(decisions)).scalar_one():
            raise ReviewError("seed", "the database holds decisions already: give an empty one")
    started = time.perf_counter()
    end = time.time()
    with engine.begin() as conn:
        conn.execute(
            devices.insert(),
            [
                {
                    "device_id": device_id(i),
                    "labels": device_labels(i),
                    "profile": "x86-gateway",
                    "enrolled_at": end - SPAN_S,
                    "online": True,
                    "revoked": False,
                }
                for i in range(devices_n)
            ],
        )
    reviews = loaded = 0
    batch: list[dict[str, Any]] = []
    for row in generate(total, devices_n, end, seed_value):
        batch.append(row)
        if len(batch) == BATCH:
            reviews += _load(engine, batch, reviews, end)
            loaded += len(batch)
            batch = []
            if loaded % (10 * BATCH) == 0:
                progress(f"{loaded} decisions loaded ({time.perf_counter() - started:.0f} s)")
    if batch:
        reviews += _load(engine, batch, reviews, end)
    return Seeded(devices_n, total, reviews, time.perf_counter() - started, end)


def _load(engine: Engine, batch: list[dict[str, Any]], reviews_so_far: int, end: float) -> int:
    reviewed = batch[::REVIEWED_EVERY]
    current = _review_rows(reviewed, reviews_so_far + 1, end)
    log_rows = [{k: v for k, v in r.items() if k in decision_review_log.c} for r in current]
    with engine.begin() as conn:
        _insert(conn, batch)
        conn.execute(decision_review_log.insert(), log_rows)
        conn.execute(decision_reviews.insert(), current)
        if conn.dialect.name == "postgresql":  # explicit seqs: move the serial past them
            conn.exec_driver_sql(
                "SELECT setval(pg_get_serial_sequence('decision_review_log', 'seq'), "
                "(SELECT max(seq) FROM decision_review_log))"
            )
    return len(current)
