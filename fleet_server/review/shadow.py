"""A decision's shadow comparison: what the candidate in the device's shadow slot said
about the same frame (the ``shadow_results`` row of the same device and decision id, a
:class:`agent.wire.quality.ShadowRecord` as the device uploaded it), and which model a
reviewer's label agrees with.

A line manager's label on a disagreement is the ground truth: nothing new is recorded,
the label simply agrees with the live model, the candidate, both (they disagreed on
something the outcome does not show, e.g. boxes) or neither (:func:`right_model`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from fleet_server.db._tx import Bind, reading
from fleet_server.db.tables import shadow_results

RightModel = Literal["live", "candidate", "both", "neither"]
"""Which model a label agrees with."""


@dataclass(frozen=True)
class ShadowSideView:
    """One model's side of a comparison.

    Attributes:
        model_name: bundle (model) name.
        model_version: its version.
        release: its release, when known.
        outcome: its outcome under the live pipeline's policy.
        latency_ms: its inference latency (queue + infer), ms; None if not a number.
        outputs: its post-processed outputs (label/score, or boxes in frame pixels).
    """

    model_name: str
    model_version: str
    release: int | None
    outcome: str
    latency_ms: float | None
    outputs: dict[str, Any]


@dataclass(frozen=True)
class ShadowComparison:
    """The shadow record of a decision.

    Attributes:
        ts: when the device compared (Unix seconds).
        received_at: when the fleet stored it.
        line: the line the device named.
        live: the live model's side (the one that decided).
        candidate: the candidate's side (it never acted).
        agree: both gave the same outcome.
        iou_threshold: IoU a box match needed.
        matched: detections matched (same label, IoU at or above the threshold).
        unmatched_live: live detections with no candidate match.
        unmatched_candidate: candidate detections with no live match.
        thumbnail_on_device: the frame's thumbnail on the device (kept on disagreement).
    """

    ts: float
    received_at: float
    line: str
    live: ShadowSideView
    candidate: ShadowSideView
    agree: bool
    iou_threshold: float | None
    matched: int
    unmatched_live: int
    unmatched_candidate: int
    thumbnail_on_device: str | None

    def right_model(self, label: str | None) -> RightModel | None:
        """Which model the label ``label`` agrees with (None: not labelled)."""
        return right_model(label, self.live.outcome, self.candidate.outcome)


def right_model(label: str | None, live: str, candidate: str) -> RightModel | None:
    """``live``, ``candidate``, ``both`` or ``neither``: whose outcome the label is;
    None when there is no label."""
    if label is None:
        return None
    if label == live:
        return "both" if label == candidate else "live"
    return "candidate" if label == candidate else "neither"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _side(
    payload: Mapping[str, Any], name: str, model: str, version: str, release: Any, outcome: str
) -> ShadowSideView:
    side = payload.get(name)
    data: Mapping[str, Any] = side if isinstance(side, Mapping) else {}
    outputs = data.get("outputs")
    return ShadowSideView(
        model_name=model,
        model_version=version,
        release=release if isinstance(release, int) else None,
        outcome=outcome,
        latency_ms=_number(data.get("latency_ms")),
        outputs=dict(outputs) if isinstance(outputs, Mapping) else {},
    )


def comparison_of(row: Mapping[Any, Any]) -> ShadowComparison:
    """The comparison of a ``shadow_results`` row (its columns; the payload for the
    outputs, latencies and box counts)."""
    payload: Mapping[str, Any] = row["payload"] if isinstance(row["payload"], Mapping) else {}
    thumb = payload.get("thumbnail")
    return ShadowComparison(
        ts=float(row["ts"]),
        received_at=float(row["received_at"]),
        line=str(row["line"]),
        live=_side(payload, "live", row["live_model"], row["live_version"], None,
                   row["live_outcome"]),
        candidate=_side(payload, "shadow", row["shadow_model"], row["shadow_version"],
                        row["shadow_release"], row["shadow_outcome"]),
        agree=bool(row["agree"]),
        iou_threshold=_number(payload.get("iou_threshold")),
        matched=_count(payload.get("matched")),
        unmatched_live=_count(payload.get("unmatched_live")),
        unmatched_candidate=_count(payload.get("unmatched_shadow")),
        thumbnail_on_device=thumb if isinstance(thumb, str) and thumb else None,
    )  # fmt: skip


def shadow_comparison(
    conn: Connection, device_id: str, decision_id: str
) -> ShadowComparison | None:
    """The shadow record of the decision ``decision_id`` of ``device_id``, or None."""
    t = shadow_results
    row = conn.execute(
        sa.select(t).where(t.c.device_id == device_id, t.c.decision_id == decision_id)
    ).first()
    return None if row is None else comparison_of(row._mapping)


def shadow_outcomes(
    bind: Bind, keys: Collection[tuple[str, str]]
) -> dict[tuple[str, str], ShadowComparison]:
    """The shadow records of these (device id, decision id) decisions that have one (one
    query on the ids, the pairs kept): a list page's rows."""
    if not keys:
        return {}
    t = shadow_results
    wanted = set(keys)
    query = sa.select(t).where(t.c.decision_id.in_(sorted({i for _, i in wanted})))
    with reading(bind) as conn:
        rows = [r._mapping for r in conn.execute(query)]
    found = {(str(m["device_id"]), str(m["decision_id"])): m for m in rows}
    return {k: comparison_of(m) for k, m in found.items() if k in wanted}
