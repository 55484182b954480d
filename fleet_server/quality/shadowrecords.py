"""A shadowing device's figures for the shadow gate, from what the fleet stored, and the
check of what the device claims against them (docs/adr/0018-shadow-gate-from-stored-records.md).

A comparison counts (:func:`stored_shadow`) when its ``shadow_results`` row names the
target (model and version), was received since the device's shadow directive, and is
backed by the device's stored decision of the same id, received since then too, whose
model, version and outcome are the record's live side. So a device counts at most one
comparison per decision it uploaded in the window, and never one for a decision the
fleet does not hold.

Bounded by what the device could have decided: at most ``MAX_DECISION_RATE_HZ``
decisions a second since the directive (:func:`rate_bound`). Records beyond the bound
are cut to it (agreement scaled, ratio kept) and the device is named as contradicting
itself.

A device's health claim (``Health.shadow``: ``n``, ``agree``) is only shown; it
contradicts the records (:func:`contradiction`) when it claims more frames than the
bound allows, or when claim and records both hold ``CHECK_MIN`` frames and their
``CHECK_CONFIDENCE`` Wilson intervals do not overlap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import sqlalchemy as sa

from fleet_server.db._tx import Bind, reading
from fleet_server.db.tables import decisions, shadow_results
from fleet_server.quality.stats import wilson_interval

MAX_DECISION_RATE_HZ = 120.0
"""The most decisions a second one device is taken to be able to make (4 cameras at
30 fps); a shadow comparison is one of its decisions."""
CHECK_MIN = 30
"""Frames a claim and the records both hold before their agreement is compared."""
CHECK_CONFIDENCE = 0.999
"""Confidence of the intervals a claim and the records are compared with."""
LATENCY_ROWS = 10_000
"""The most (newest) records the target's p99 latency is taken over."""


@dataclass(frozen=True)
class StoredShadow:
    """A device's comparisons of the target, as the fleet stored them.

    Attributes:
        stored: comparisons backed by a stored decision in the window (before the bound).
        n: of those, what counts (at most ``bound``).
        agree: of ``n``, how many gave the live model's outcome (scaled with ``n``).
        p99_ms: the target's p99 latency in the newest records (None: none recorded).
        bound: the most decisions the device could have made since its directive.
    """

    stored: int
    n: int
    agree: int
    p99_ms: float | None
    bound: int

    @property
    def over_bound(self) -> bool:
        return self.stored > self.bound


def rate_bound(since: float, now: float, rate_hz: float = MAX_DECISION_RATE_HZ) -> int:
    """The most decisions a device could have made from ``since`` to ``now``."""
    return max(0, math.ceil(max(0.0, now - since) * rate_hz))


def _backed(device_id: str, model: str, version: str, since: float) -> sa.ColumnElement[bool]:
    s, d = shadow_results, decisions
    return sa.and_(
        s.c.device_id == device_id,
        s.c.shadow_model == model,
        s.c.shadow_version == version,
        s.c.received_at >= since,
        d.c.received_at >= since,
    )


def _join() -> sa.FromClause:
    s, d = shadow_results, decisions
    return s.join(
        d,
        sa.and_(
            d.c.device_id == s.c.device_id,
            d.c.id == s.c.decision_id,
            d.c.model_name == s.c.live_model,
            d.c.model_version == s.c.live_version,
            d.c.outcome == s.c.live_outcome,
        ),
    )


def stored_shadow(
    bind: Bind, device_id: str, model: str, version: str, since: float, now: float
) -> StoredShadow:
    """``device_id``'s decision-backed comparisons of ``model`` ``version`` received
    since ``since`` (its shadow directive), bounded by :func:`rate_bound`."""
    s = shadow_results
    where = _backed(device_id, model, version, since)
    counts = (
        sa.select(
            sa.func.count(), sa.func.coalesce(sa.func.sum(sa.case((s.c.agree, 1), else_=0)), 0)
        )
        .select_from(_join())
        .where(where)
    )
    latest = (
        sa.select(s.c.payload)
        .select_from(_join())
        .where(where)
        .order_by(s.c.received_at.desc(), s.c.decision_id.desc())
        .limit(LATENCY_ROWS)
    )
    with reading(bind) as conn:
        stored, agree = (int(v) for v in conn.execute(counts).one())
        latencies = [x for (p,) in conn.execute(latest) if (x := _latency(p)) is not None]
    bound = rate_bound(since, now)
    n = stored
    if n > bound:
        agree, n = round(Fraction(agree * bound, n)), bound
    return StoredShadow(stored, n, agree, _p99(latencies), bound)


def _latency(payload: object) -> float | None:
    side = payload.get("shadow") if isinstance(payload, dict) else None
    value = side.get("latency_ms") if isinstance(side, dict) else None
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _p99(values: list[float]) -> float | None:
    """The nearest-rank 99th percentile (None: no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def contradiction(claim_n: int, claim_agree: int, stored: StoredShadow) -> str | None:
    """Why a device's claim (``claim_n`` frames, ``claim_agree`` agreeing) contradicts
    what the fleet stored of it (None: it does not)."""
    if stored.over_bound:
        return (
            f"{stored.stored} stored comparisons since its shadow directive, more than the "
            f"{stored.bound} decisions it could have made"
        )
    if claim_n > stored.bound:
        return (
            f"claims {claim_n} sampled frames since its shadow directive, more than the "
            f"{stored.bound} decisions it could have made"
        )
    if claim_n >= CHECK_MIN and stored.n >= CHECK_MIN:
        c_lo, c_hi = wilson_interval(min(claim_agree, claim_n), claim_n, CHECK_CONFIDENCE)
        s_lo, s_hi = wilson_interval(stored.agree, stored.n, CHECK_CONFIDENCE)
        if c_hi < s_lo or s_hi < c_lo:
            return (
                f"claims agreement {claim_agree} of {claim_n} while its {stored.n} stored "
                f"comparisons show {stored.agree} of {stored.n}"
            )
    return None
