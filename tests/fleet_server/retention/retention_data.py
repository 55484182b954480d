"""Rows for the retention tests, stored through the store's own insert functions, at
times relative to a fixed ``NOW``."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from fleet_server.db import store
from fleet_server.db import tables as t
from fleet_server.db.store import DecisionRecord, EventRecord, ImageRecord, Record
from fleet_server.retention.config import RetentionSection
from fleet_server.review.reviews import save_review

NOW = 1_800_000_000.0
DAY = 86_400.0


def heartbeats(engine: Engine, ages_days: list[float], device: str = "cam-1") -> None:
    rows = [Record(device, f"hb-{i}", NOW - a * DAY, {"i": i}) for i, a in enumerate(ages_days)]
    store.insert_heartbeats(engine, rows)


def telemetry(engine: Engine, ages_days: list[float], device: str = "cam-1") -> None:
    rows = [Record(device, f"t-{i}", NOW - a * DAY, {"i": i}) for i, a in enumerate(ages_days)]
    store.insert_telemetry(engine, rows)


def decision(
    engine: Engine,
    decision_id: str,
    age_days: float,
    *,
    device: str = "cam-1",
    model: str = "detector",
    version: str = "1.0.0",
    image: bool = True,
) -> None:
    ts = NOW - age_days * DAY
    row = DecisionRecord(decision_id, device, ts, "cam0", "pass", model, version, {"line": "3"})
    store.insert_decisions(engine, [row])
    if image:
        store.insert_images(
            engine, [ImageRecord(decision_id, device, ts, "image/jpeg", 4, 4, b"\xff\xd8jpeg")]
        )


def review(engine: Engine, decision_id: str, device: str = "cam-1") -> None:
    save_review(
        engine, decision_id, device_id=device, verdict="confirm", outcome=None, note="",
        reviewer="alice", now=NOW,
    )  # fmt: skip


def event(engine: Engine, event_id: str, age_days: float, kind: str = "alarm") -> None:
    row = EventRecord("cam-1", event_id, NOW - age_days * DAY, kind, {"outcome": "committed"})
    store.insert_events(engine, [row])


def rollout(engine: Engine, rollout_id: str, bundle: str, state: str, created_days: float) -> None:
    record = store.RolloutRecord(
        rollout_id=rollout_id, bundle=bundle, release=2, version="2.0.0", selector={},
        waves=[1], soak_s=60.0, policy={}, state=state, controller_state={},
    )  # fmt: skip
    store.save_rollout(engine, record, now=NOW - created_days * DAY)


def keys(engine: Engine, table: str) -> set[Any]:
    """The primary keys of ``table``'s rows (one value, or a tuple)."""
    tab = t.metadata.tables[table]
    cols = list(tab.primary_key.columns)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(*cols)).all()
    return {r[0] if len(cols) == 1 else tuple(r) for r in rows}


def section(**budgets: Any) -> RetentionSection:
    """Budgets for a test: nothing is pruned but what it names (and the defaults of the
    tables it does not fill)."""
    return RetentionSection.model_validate(budgets)
