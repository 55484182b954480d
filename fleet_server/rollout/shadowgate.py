"""The shadow phase's verdict for one wave (pure): pooled agreement and shadow latency.

Each device of the wave that runs the target in its shadow slot reports, in its health,
how many sampled frames the target decided (``n``) and how many of those got the live
model's outcome (``agree``), totals since the target was installed there, and the
target's p99 latency. The wave pools them: ``n`` and ``agree`` summed, p99 the highest
device's (a pooled percentile can't be rebuilt from percentiles; the worst device is the
conservative reading).

Agreement is judged by its Wilson score interval at ``policy.gates.shadow_confidence``,
never by the bare ratio: 490 of 500 (0.98) has a lower bound of about 0.964.

- pass: ``n >= shadow_min``, lower bound ``>= min_agreement``, and (when the bundle has a
  latency budget) pooled p99 ``<= budget x latency_budget_factor``;
- fail early: ``n >= shadow_min`` and upper bound ``< min_agreement`` (no amount of further
  frames is likely to show it);
- fail at the deadline (``shadow_s``) without a pass, naming what was not shown;
- otherwise wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet_server.quality.stats import wilson_interval
from fleet_server.rollout.gates import GateFail, GatePass, GateResult, GateWait, Metrics
from fleet_server.rollout.spec import RolloutSpec


@dataclass(frozen=True)
class ShadowSample:
    """One shadowing device's totals for the target (see the module docstring)."""

    device_id: str
    n: int = 0
    agree: int = 0
    p99_ms: float | None = None


def evaluate_shadow(
    spec: RolloutSpec,
    samples: Sequence[ShadowSample],
    budget_ms: float | None,
    *,
    over: bool,
) -> GateResult:
    """The shadow verdict of a wave's shadowing devices; ``over``: the phase's deadline
    has passed. Metrics: ``shadow_devices``, ``shadow_n``, ``shadow_agree``,
    ``shadow_agreement``, ``shadow_lower``, ``shadow_upper``, ``shadow_p99_ms``,
    ``shadow_p99_limit_ms``."""
    gates = spec.policy.gates
    n = sum(max(0, s.n) for s in samples)
    agree = sum(max(0, min(s.agree, s.n)) for s in samples)
    lower, upper = wilson_interval(agree, n, gates.shadow_confidence)
    p99 = max((s.p99_ms for s in samples if s.p99_ms is not None), default=None)
    limit = None if budget_ms is None else budget_ms * gates.latency_budget_factor
    metrics: Metrics = {
        "shadow_devices": len(samples),
        "shadow_n": n,
        "shadow_agree": agree,
        "shadow_agreement": round(agree / n, 4) if n else None,
        "shadow_lower": round(lower, 4),
        "shadow_upper": round(upper, 4),
        "shadow_p99_ms": p99,
        "shadow_p99_limit_ms": limit,
    }
    want = spec.min_agreement
    said = _agreement(agree, n, lower, upper)
    if n >= spec.shadow_min and upper < want:
        return GateFail(f"shadow {said}: upper bound < min_agreement {want:g}", metrics, ())
    missing = []
    if n < spec.shadow_min:
        missing.append(f"{n} of {spec.shadow_min} sampled frames")
    elif lower < want:
        missing.append(f"{said}: lower bound < min_agreement {want:g}")
    if limit is not None and (p99 is None or p99 > limit):
        shown = "not reported" if p99 is None else f"{p99:g} ms"
        missing.append(f"shadow p99 {shown} > {limit:g} ms")
    if not missing:
        return GatePass(metrics)
    why = "; ".join(missing)
    if over:
        return GateFail(f"shadow not shown within {spec.shadow_s} s: {why} ({said})", metrics, ())
    return GateWait(f"shadow: {why}", metrics)


def _agreement(agree: int, n: int, lower: float, upper: float) -> str:
    ratio = f"{agree / n:.4f}" if n else "-"
    return f"agreement {ratio} ({agree} of n={n}; Wilson {lower:.4f}..{upper:.4f})"
