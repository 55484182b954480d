"""Synthetic decisions for the review bench: a fleet of devices on sites and lines, and
many decisions with the payload a real agent uploads, bulk-loaded fast (COPY on
PostgreSQL, one ``executemany`` per batch on SQLite), some of them reviewed.

The data is deterministic for a seed. What it holds, for the bench's filters to hit
common and rare values alike: devices on :data:`SITES` sites and :data:`LINES` lines
(labels), two cameras each; one device in five writes rows without a line (the label
counts); outcomes ``pass`` 90 %, ``reject`` 8 %, ``review`` 2 %; three model versions
over time; one decision in a hundred reviewed; and runs of decisions sharing a
timestamp, so that keyset pages meet ties. Half the devices run a classifier (top-k
scores), half a detector (1-3 boxes in a 640 x 480 frame, ``outputs["frame"]`` says so).

Images: the newest ``images`` decisions (every outcome, as a device configured with
``[decision_log] thumbnails = "all"``) get the JPEG thumbnail a device would upload
(:mod:`hil.bench.seed_images`, 320 x 240, a few KB), stored in
``decision_images`` under the decision's own device; older ones have none, as after a
device's thumbnail retention.
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

from agent.wire.jpeg import jpeg_size
from fleet_server.db.store import ImageRecord, insert_images
from fleet_server.db.tables import decision_review_log, decision_reviews, decisions, devices
from fleet_server.review.errors import ReviewError
from hil.bench.seed_images import thumbnail

SITES = 5
LINES = 50
SPAN_S = 30 * 86_400.0
"""The decisions spread over this many seconds, ending at the seed's ``end``."""
BATCH = 20_000
VERSIONS = ("1.0.0", "1.1.0", "1.2.0")
REVIEWED_EVERY = 100
TIE_EVERY = 50
"""Every this many decisions, a run of a few shares one timestamp."""
FRAME = (640, 480)
"""The cameras' frame size (width, height): the detector's boxes lie in it."""


@dataclass(frozen=True)
class Seeded:
    """What was loaded, and how long it took."""

    devices: int
    decisions: int
    reviews: int
    seconds: float
    end: float
    images: int = 0


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
    frame = {"width": FRAME[0], "height": FRAME[1]}
    if kind == 0:
        return {
            "top_k": [
                {"label": "ok", "score": round(score, 4)},
                {"label": "scratch", "score": round(1 - score, 4)},
            ],
            "frame": frame,
        }
    boxes = []
    for j in range(rng.randrange(1, 4)):
        x1, y1 = rng.randrange(20, FRAME[0] - 140), rng.randrange(20, FRAME[1] - 110)
        x2, y2 = x1 + rng.randrange(40, 120), y1 + rng.randrange(30, 90)
        box = [float(x1), float(y1), float(x2), float(y2)]
        boxes.append({"box": box, "score": round(score - 0.05 * j, 4), "label": "dent"})
    return {"count": len(boxes), "boxes": boxes, "frame": frame}


def _thumbnail_path(decision_id: str, ts: float) -> str:
    """Where the device's decision log keeps the thumbnail (its state dir's layout)."""
    return f"thumbnails/{time.strftime('%Y-%m-%d', time.gmtime(ts))}/{decision_id}.jpg"


def _decision(
    rng: random.Random, n: int, total: int, devices_n: int, end: float, *, image: bool
) -> dict[str, Any]:
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
        "thumbnail": _thumbnail_path(decision_id, ts) if image else None,
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


def generate(
    total: int, devices_n: int, end: float, seed: int, *, images: int = 0
) -> Iterator[dict[str, Any]]:
    """The ``total`` decisions, oldest first; the newest ``images`` of them name a
    thumbnail (``payload["thumbnail"]``)."""
    rng = random.Random(seed)  # noqa: S311 (bench data, not secrets)
    for n in range(total):
        yield _decision(rng, n, total, devices_n, end, image=n >= total - images)


def image_of(row: dict[str, Any]) -> ImageRecord:
    """The thumbnail of a generated decision: its boxes scratched into a part on a belt
    (deterministic: seeded by the decision's id)."""
    payload = row["payload"]
    outputs = payload["outputs"]
    boxes = [b["box"] for b in outputs.get("boxes", [])]
    size = outputs.get("frame", {"width": FRAME[0], "height": FRAME[1]})
    frame = (int(size["width"]), int(size["height"]))
    data = thumbnail(boxes, frame, int(row["id"].replace("-", "")[-12:], 16))
    w, h = jpeg_size(data)
    return ImageRecord(row["id"], row["device_id"], row["ts"], "image/jpeg", w, h, data)


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
    images: int = 0,
    progress: Callable[[str], None] = lambda _m: None,
) -> Seeded:
    """Register ``devices_n`` devices and load ``total`` decisions (1 % reviewed) into an
    empty, migrated database, the newest ``images`` of them with a thumbnail.

    Raises:
        ReviewError: the arguments are out of range or the database holds decisions.
    """
    if total < 1 or devices_n < 1 or images < 0:
        raise ReviewError(
            "seed", f"decisions={total} and devices={devices_n} must be >= 1, images={images} >= 0"
        )
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
    reviews = loaded = pictured = 0
    batch: list[dict[str, Any]] = []
    for row in generate(total, devices_n, end, seed_value, images=images):
        batch.append(row)
        if len(batch) == BATCH:
            r, i = _load(engine, batch, reviews, end)
            reviews, pictured, loaded = reviews + r, pictured + i, loaded + len(batch)
            batch = []
            if loaded % (10 * BATCH) == 0:
                progress(f"{loaded} decisions loaded ({time.perf_counter() - started:.0f} s)")
    if batch:
        r, i = _load(engine, batch, reviews, end)
        reviews, pictured = reviews + r, pictured + i
    return Seeded(devices_n, total, reviews, time.perf_counter() - started, end, pictured)


def _load(
    engine: Engine, batch: list[dict[str, Any]], reviews_so_far: int, end: float
) -> tuple[int, int]:
    """Store a batch of decisions with their reviews and images; (reviews, images)."""
    reviewed = batch[::REVIEWED_EVERY]
    current = _review_rows(reviewed, reviews_so_far + 1, end)
    log_rows = [{k: v for k, v in r.items() if k in decision_review_log.c} for r in current]
    pictures = [image_of(row) for row in batch if row["payload"]["thumbnail"]]
    with engine.begin() as conn:
        _insert(conn, batch)
        conn.execute(decision_review_log.insert(), log_rows)
        conn.execute(decision_reviews.insert(), current)
        if pictures:
            insert_images(conn, pictures, now=end)
        if conn.dialect.name == "postgresql":  # explicit seqs: move the serial past them
            conn.exec_driver_sql(
                "SELECT setval(pg_get_serial_sequence('decision_review_log', 'seq'), "
                "(SELECT max(seq) FROM decision_review_log))"
            )
    return len(current), len(pictures)
