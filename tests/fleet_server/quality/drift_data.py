"""Synthetic drift buckets for the drift tests: ``n`` decisions per bucket on frames of
about a given brightness (a darker line has a lower mean luma), scores and outcomes
drawn from a seeded generator."""

from __future__ import annotations

import numpy as np
from sqlalchemy.engine import Engine

from agent.wire.quality import DRIFT_BINS, DriftHour, bin_index
from fleet_server.quality.store import upsert_drift_hours

PERIOD = 60


def bucket(
    start: int,
    n: int,
    *,
    line: str = "1",
    brightness: float = 120.0,
    seed: int = 0,
    model: str = "cls",
    version: str = "1.0.0",
) -> DriftHour:
    """A bucket starting at ``start`` of ``n`` decisions on frames of about
    ``brightness`` mean luma."""
    rng = np.random.default_rng(seed * 100_003 + start)
    names = ("brightness", "contrast", "sharpness", "score")
    hist = {name: [0] * (len(DRIFT_BINS[name]) - 1) for name in names}
    outcomes = {"pass": 0, "reject": 0}
    for _ in range(n):
        hist["brightness"][bin_index("brightness", rng.normal(brightness, 12))] += 1
        hist["contrast"][bin_index("contrast", rng.normal(40, 5))] += 1
        hist["sharpness"][bin_index("sharpness", rng.normal(2.5, 0.3))] += 1
        score = float(rng.uniform(0.5, 1.0))
        hist["score"][bin_index("score", score)] += 1
        outcomes["reject" if score < 0.6 else "pass"] += 1
    return DriftHour(
        model_name=model,
        model_version=version,
        line=line,
        source="cam0",
        hour=start,
        period_s=PERIOD,
        n=n,
        outcomes=outcomes,
        top_class={"ok": n},
        hist=hist,
    )


def fill(
    db: Engine,
    device: str,
    line: str,
    t0: int,
    minutes: range,
    n: int,
    brightness: float = 120.0,
) -> None:
    """Store ``device``'s buckets of ``minutes`` after ``t0`` (a multiple of PERIOD)."""
    seed = sum(map(ord, device))
    hours = [
        bucket(t0 + m * PERIOD, n, line=line, brightness=brightness, seed=seed) for m in minutes
    ]
    upsert_drift_hours(db, device, hours)
