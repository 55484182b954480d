"""Stored shadow comparisons for tests: a device's decisions and the candidate's record of
each (what ingest stores from its decision and quality uploads), at a given receive time.
"""

from __future__ import annotations

import itertools

from sqlalchemy.engine import Engine

from agent.wire.quality import ShadowRecord, ShadowSide
from fleet_server.db import store
from fleet_server.db.store import DecisionRecord
from fleet_server.quality.store import insert_shadow_records

_ids = itertools.count()


def shadow_record(
    decision_id: str,
    ts: float,
    *,
    agree: bool,
    model: str = "cls",
    live_version: str = "1.0.0",
    candidate: str = "2.0.0",
    release: int | None = 2,
    line: str = "3",
    latency_ms: float = 10.0,
) -> ShadowRecord:
    """The candidate's comparison with the live decision ``decision_id`` (outcome pass)."""
    return ShadowRecord(
        decision_id=decision_id,
        ts=ts,
        source="cam0",
        line=line,
        live=ShadowSide(model_name=model, model_version=live_version, outcome="pass",
                        latency_ms=2.0),
        shadow=ShadowSide(model_name=model, model_version=candidate, release=release,
                          outcome="pass" if agree else "reject", latency_ms=latency_ms),
        agree=agree,
    )  # fmt: skip


def compared(
    db: Engine,
    device_id: str,
    n: int,
    agree: int,
    received_at: float,
    *,
    decisions: bool = True,
    **kw: object,
) -> list[str]:
    """Store ``n`` decisions of ``device_id`` (live ``cls`` 1.0.0, outcome pass) and the
    candidate's comparison of each, ``agree`` of them agreeing; ``decisions=False``
    stores the comparisons alone. Returns the decision ids."""
    ids = [f"dec-{device_id}-{next(_ids)}" for _ in range(n)]
    if decisions:
        store.insert_decisions(
            db,
            [
                DecisionRecord(id=i, device_id=device_id, ts=received_at, source="cam0",
                               outcome="pass", model_name=str(kw.get("model", "cls")),
                               model_version=str(kw.get("live_version", "1.0.0")),
                               payload={"line": "3"}, received_at=received_at)
                for i in ids
            ],
        )  # fmt: skip
    records = [
        shadow_record(i, received_at, agree=k < agree, **kw)  # type: ignore[arg-type]
        for k, i in enumerate(ids)
    ]
    insert_shadow_records(db, device_id, records, now=received_at)
    return ids
