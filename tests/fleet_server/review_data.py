"""Decisions for the review tests, stored the way ingest stores them (wire
``DecisionRow`` -> :class:`fleet_server.ingest.sqlsink.SqlSink`), and the filter rules
restated in plain Python as the oracle the tests compare the database's answers with."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from agent.wire.messages import DecisionRow
from fleet_server.db import store
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.review import DecisionFilter

T0 = 1_750_000_000.0


@dataclass
class Fleet:
    """Devices (id -> labels) and the decision rows stored for them."""

    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    rows: list[DecisionRow] = field(default_factory=list)
    reviewed: dict[str, str] = field(default_factory=dict)
    """decision id -> the outcome its current review set."""

    def add_device(self, engine: Engine, device_id: str, **labels: str) -> None:
        store.upsert_device(engine, device_id, labels=labels, profile="x86-gateway")
        self.labels[device_id] = labels

    def line(self, row: DecisionRow) -> str:
        return row.line or self.labels.get(row.device_id, {}).get("line", "")

    def matches(self, row: DecisionRow, f: DecisionFilter) -> bool:
        """The filter rules of docs/decision-review.md, in plain Python."""
        labels = self.labels.get(row.device_id, {})
        checks = [
            f.site is None or labels.get("site") == f.site,
            f.line is None or self.line(row) == f.line,
            f.device is None or row.device_id == f.device,
            f.source is None or row.source == f.source,
            f.outcome is None or row.outcome == f.outcome,
            f.model_version is None or row.model_version == f.model_version,
            f.station is None or row.station == f.station,
            f.part_id is None or row.part_id == f.part_id,
            f.since is None or row.decision_time >= f.since,
            f.until is None or row.decision_time < f.until,
            f.reviewed is None or (row.id in self.reviewed) == f.reviewed,
        ]
        return all(checks)

    def expected(self, f: DecisionFilter) -> list[str]:
        """Ids of the matching decisions, newest first (ts, then id, descending)."""
        hits = [r for r in self.rows if self.matches(r, f)]
        hits.sort(key=lambda r: (r.decision_time, r.id), reverse=True)
        return [r.id for r in hits]


_counter = itertools.count()


def decision(
    device_id: str,
    ts: float,
    *,
    line: str = "",
    source: str = "cam0",
    outcome: str = "pass",
    model_version: str = "1.0.0",
    outputs: dict[str, Any] | None = None,
    thumbnail: str | None = None,
    station: str = "",
    part_id: str = "",
    deadline_missed: bool = False,
) -> DecisionRow:
    """A decision row as an agent uploads it (a free-running pipeline's unless a
    station is given)."""
    n = next(_counter)
    return DecisionRow(
        id=str(uuid.UUID(int=(int(ts * 1000) << 80) | (0x7 << 76) | (0b10 << 62) | n)),
        capture_time=ts - 0.05,
        decision_time=ts,
        device_id=device_id,
        source=source,
        line=line,
        model_name="surface-check",
        model_version=model_version,
        bundle_digest=f"sha256:{model_version}",
        backend="onnxruntime",
        config_hash="c0ffee",
        input_digest=f"{n:032x}",
        outputs=outputs if outputs is not None else {"top_k": [{"label": "ok", "score": 0.9}]},
        outcome=outcome,
        thresholds={"reject_below": 0.6},
        latencies_ms={"inference": 10.0, "e2e": 12.5},
        e2e_ms=12.5,
        thumbnail=thumbnail,
        station=station,
        part_id=part_id,
        deadline_missed=deadline_missed,
    )


def store_rows(engine: Engine, fleet: Fleet, rows: list[DecisionRow]) -> None:
    """Store ``rows`` through the ingest sink and remember them."""
    assert SqlSink(engine).store_decisions(rows) == len(rows)
    fleet.rows.extend(rows)


def _station_fields(n: int) -> dict[str, Any]:
    """The station fields of mixed_fleet's n-th decision (see there)."""
    if n % 6 >= 4:
        return {}
    return {
        "station": "st-a" if n % 6 < 2 else "st-b",
        "part_id": f"P-{n // 6:04d}",
        "deadline_missed": n % 7 == 1,
    }


def mixed_fleet(engine: Engine, *, big_site: int = 0) -> Fleet:
    """Six devices on two sites and two lines (one of them writes no line into its
    rows), 120 decisions with runs of equal timestamps, every value of every filter
    hit; with ``big_site``, that many more devices on site ``big`` (one decision each).
    The first four devices answer station triggers (d-a1 and d-a2 station st-a, d-b1 and
    d-b2 st-b): each part P-0000, P-0001, ... passes all four (``n // 6``), every
    seventh decision missed its deadline; the other two run free."""
    fleet = Fleet()
    layout = [
        ("d-a1", "north", "1", "1"),
        ("d-a2", "north", "1", "1"),
        ("d-b1", "north", "2", "2"),
        ("d-b2", "south", "2", ""),  # cameras without a line: the label counts
        ("d-c1", "south", "2", "1"),  # labelled line 2, but its camera says line 1
        ("d-x9", "", "", ""),  # no labels at all
    ]
    for device_id, site, line, _ in layout:
        labels = {k: v for k, v in (("site", site), ("line", line)) if v}
        fleet.add_device(engine, device_id, **labels)
    rows = []
    for n in range(120):
        device_id, _, _, row_line = layout[n % len(layout)]
        ts = T0 + (n // 4) * 10.0  # four decisions share each timestamp
        rows.append(
            decision(
                device_id,
                ts,
                line=row_line,
                source=f"cam{n % 2}",
                outcome=("pass", "reject", "pass", "review", "pass")[n % 5],
                model_version="1.0.0" if n < 60 else "1.1.0",
                **_station_fields(n),
            )
        )
    store_rows(engine, fleet, rows)
    big = []
    for i in range(big_site):
        device_id = f"d-big{i:03d}"
        fleet.add_device(engine, device_id, site="big", line="9")
        big.append(decision(device_id, T0 + 5.0 + i, line="9" if i % 2 else ""))
    if big:
        store_rows(engine, fleet, big)
    return fleet
