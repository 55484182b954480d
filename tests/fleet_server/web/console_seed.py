"""Seeded fleet data for the console tests: devices on two sites and several lines,
health reports over the last hours, events and decisions, written through the fleet
database's own store functions (what ingest would have written).

Device ``a1-01`` (plant-a, line 1) is the featured one: six hours of health reports
once a minute with a 20-minute outage, install, crash and alarm events, two bundle
slots and a few hundred decisions. ``a2-03`` runs hot (a problem), ``a3-02`` has little
disk left (a warning), ``b1-04`` is offline.

Every decision that is not a ``pass`` has the JPEG thumbnail its device would have
uploaded (``[decision_log] thumbnails = "non-pass"``, the default): a 320 x 240 picture
of the 640 x 480 frame with a scratch in each box (hil.bench.seed_images).
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from agent.wire.jpeg import jpeg_size
from fleet_server.db import store
from fleet_server.db.store import DecisionRecord, EventRecord, ImageRecord, Record
from hil.bench.seed_images import thumbnail

LINES = {"plant-a": ("1", "2", "3"), "plant-b": ("1", "2")}
PER_LINE = 5
FEATURED = "a1-01"
HOT, LOW_DISK, OFFLINE = "a2-03", "a3-02", "b1-04"
BUNDLE = "detector"
ACTIVE_RELEASE = 2
"""detector 1.4.0: what the seeded devices run (1.3.2 is release 1, 1.5.0 release 3)."""
HISTORY_S = 6 * 3600
OUTAGE = (2.5 * 3600, 2.5 * 3600 + 1200)
"""Seconds before now with no health report from the featured device."""
FRAME = (640, 480)
"""The featured device's camera frame (width, height); the boxes lie in it."""


@dataclass(frozen=True)
class Seeded:
    """What was seeded: device ids by (site, line)."""

    devices: dict[tuple[str, str], list[str]]

    @property
    def all(self) -> list[str]:
        return [d for ids in self.devices.values() for d in ids]


def health(now: float, seq: int, *, temp: float = 52.0, free_mb: float = 21_000.0,
           phase: float = 0.0) -> dict[str, object]:  # fmt: skip
    """A health report as the agent sends it (fields of agent.wire.messages.Health)."""
    wave = math.sin(phase)
    p50 = 6.0 + 1.5 * wave
    return {
        "schema_version": 1, "device_id": "", "kind": "health", "seq": seq, "ts": now,
        "fps": {"cam0": round(14.6 + 0.4 * wave, 2), "cam1": round(9.8 - 0.3 * wave, 2)},
        "latency_ms": {
            BUNDLE: {"p50": round(p50, 2), "p95": round(p50 * 1.8, 2),
                     "p99": round(p50 * 2.4 + (9 if seq % 97 == 0 else 0), 2), "count": 880},
            "ocr": {"p50": round(p50 * 1.6, 2), "p95": round(p50 * 2.5, 2),
                    "p99": round(p50 * 3.1, 2), "count": 420},
        },
        "queue_depth": {BUNDLE: max(0, int(2 + 2 * wave)), "ocr": max(0, int(1 + wave))},
        "drops": {"cam0": seq // 40, "cam1": seq // 90},
        "cpu_percent": round(48 + 14 * wave, 1),
        "memory_mb": round(412 + seq * 0.05, 1),
        "temperature_c": {"soc": round(temp + 4 * wave, 1), "board": round(temp - 9 + 2 * wave, 1)},
        "disk_free_mb": free_mb - seq * 2, "disk_used_mb": 8_000.0 + seq * 2,
    }  # fmt: skip


def decision_payload(
    device_id: str, ts: float, n: int, outcome: str, rng: random.Random
) -> dict[str, object]:
    """A decision row as the agent uploads it (agent.wire.messages.DecisionRow): a
    detector's boxes in a :data:`FRAME`, thresholds and per-stage latencies."""
    score = 0.55 + rng.random() * 0.44
    boxes = [
        {"box": [40.0 + 150 * j + rng.random() * 40, 90.0 + rng.random() * 120,
                 170.0 + 150 * j + rng.random() * 60, 260.0 + rng.random() * 150],
         "score": round(score - 0.1 * j, 3), "label": "dent" if j else "scratch"}
        for j in range(1 + n % 3)
    ]  # fmt: skip
    return {
        "id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "capture_time": ts - 0.031, "decision_time": ts, "device_id": device_id,
        "source": "cam0", "line": "1", "model_name": BUNDLE, "model_version": "1.4.0",
        "bundle_digest": "sha256:" + "ab12" * 16, "backend": "onnxruntime",
        "config_hash": "3f1c0ffee0ddba11", "input_digest": f"{rng.getrandbits(64):016x}",
        "outputs": {"count": len(boxes), "boxes": boxes,
                    "frame": {"width": FRAME[0], "height": FRAME[1]}},
        "outcome": outcome,
        "thresholds": {"reject_above": 0.8, "review_above": 0.6},
        "latencies_ms": {"queue": 0.4, "inference": 11.8, "postprocess": 0.7, "e2e": 31.0},
        "e2e_ms": 31.0, "thumbnail": f"thumbs/{n:06d}.jpg",
    }  # fmt: skip


def seed_fleet(engine: Engine, now: float) -> Seeded:
    """Devices, health, events and decisions as the module docstring says."""
    rng = random.Random(7)
    devices: dict[tuple[str, str], list[str]] = {}
    for site, lines in LINES.items():
        for line in lines:
            for n in range(1, PER_LINE + 1):
                device_id = f"{site[-1]}{line}-{n:02d}"
                devices.setdefault((site, line), []).append(device_id)
                profile = "jetson-orin" if n % 2 else "x86-gateway"
                temp = 88.0 if device_id == HOT else 48.0 + rng.random() * 8
                free = 2_000.0 if device_id == LOW_DISK else 21_000.0
                report = health(now - 20, 500, temp=temp, free_mb=free, phase=n)
                report["device_id"] = device_id
                store.upsert_device(
                    engine, device_id, now=now - 30 * 86400, labels={"site": site, "line": line},
                    profile=profile, agent_version="0.1.0" if n != 5 else "0.0.9",
                    active_bundle=BUNDLE, active_release=ACTIVE_RELEASE, health=report,
                )  # fmt: skip
                online = device_id != OFFLINE
                seen = now - (2 if online else 3 * 3600)
                store.mark_seen(engine, device_id, seen, online)
    _featured(engine, now, rng)
    return Seeded(devices)


def _featured(engine: Engine, now: float, rng: random.Random) -> None:
    d = FEATURED
    store.upsert_device(engine, d, previous_bundle=BUNDLE, previous_release=ACTIVE_RELEASE - 1)
    rows = []
    for seq in range(HISTORY_S // 60):
        ts = now - HISTORY_S + seq * 60
        if OUTAGE[0] < now - ts < OUTAGE[1]:
            continue
        report = health(ts, seq, phase=seq / 30)
        report["device_id"] = d
        rows.append(Record(d, f"health:{seq}:{ts!r}", ts, report))
    store.insert_telemetry(engine, rows)
    slot = {"name": BUNDLE, "version": "1.4.0", "release": 2, "digest": "sha256:" + "ab12" * 16}
    old = {"name": BUNDLE, "version": "1.3.2", "release": 1, "digest": "sha256:" + "9f3c" * 16}
    events = [
        EventRecord(d, "state:seed", now - 5 * 3600, "state",
                    {"device_id": d, "online": True, "active": slot, "previous": old}),
        EventRecord(d, "install:2:1", now - 5 * 3600 - 60, "install",
                    {"outcome": "committed", "step": "commit", "bundle": BUNDLE, "release": 2,
                     "version": "1.4.0", "slot": "b", "reason": "", "at": now - 5 * 3600 - 90}),
        EventRecord(d, "crash:1", now - 3 * 3600, "crash",
                    {"reason": "worker 2 exited with signal 11; restarted"}),
        EventRecord(d, "alarm:1", now - 2 * 3600, "alarm",
                    {"message": "soc temperature 79 °C over 75 °C for 5 min"}),
    ]  # fmt: skip
    store.insert_events(engine, events)
    decisions = []
    images = []
    for n in range(720):
        ts = now - rng.random() * HISTORY_S
        roll = rng.random()
        outcome = "pass" if roll < 0.82 else "reject" if roll < 0.95 else "review"
        payload = decision_payload(d, ts, n, outcome, rng)
        decision_id = str(payload["id"])
        decisions.append(
            DecisionRecord(decision_id, d, ts, "cam0", outcome, BUNDLE, "1.4.0", payload)
        )
        if outcome != "pass":
            images.append(image_record(decision_id, d, ts, payload, seed=n))
    store.insert_decisions(engine, decisions)
    store.insert_images(engine, images)


def image_record(
    decision_id: str, device_id: str, ts: float, payload: dict[str, object], *, seed: int
) -> ImageRecord:
    """The thumbnail a device would upload of this decision: its boxes scratched into a
    part on a belt."""
    outputs = payload["outputs"]
    assert isinstance(outputs, dict)
    boxes = [b["box"] for b in outputs["boxes"]]
    data = thumbnail(boxes, FRAME, seed)
    return ImageRecord(decision_id, device_id, ts, "image/jpeg", *jpeg_size(data), data)
