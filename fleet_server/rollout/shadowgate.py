"""The shadow phase's verdict for one wave (pure), judged on devices, each device's weight
capped (docs/adr/0018-shadow-gate-from-stored-records.md).

Each :class:`ShadowSample` is one device of the wave running the target in its shadow
slot, with figures the fleet computed from what it stored
(:mod:`fleet_server.quality.shadowrecords`): ``n`` comparisons of the target with the
live model, each backed by a stored decision of the device received since its shadow
directive and bounded by what it could have decided in that time, ``agree`` of them
with the live model's outcome, and ``p99_ms`` of the target's latency in those records.
What a device claims in its health decides nothing here.

No single device can move the verdict:

- **cap**: in a wave of several, a device's counts enter at most ``shadow_min`` frames
  (scaled down with its ratio kept), so a device's volume never outweighs the others';
- **minimum per device**: in a wave of several, a device counts once it shows its
  share, ``ceil(shadow_min / devices in the wave)`` frames;
- **judged on devices**: the counting devices are ordered by their agreement. With three
  or more, the most and the least agreeing device are left out and the rest pooled (so
  an outlier, honest or not, neither passes nor fails the wave). With two, a pass needs
  the less agreeing one to pass on its own records and an early fail needs the more
  agreeing one to fail on its own (both must agree: a contested wave is not switched).
  One counting device in a wave of several decides nothing. A wave of one device is
  judged on that device (its records decide only for itself);
- **latency**: the highest p99 of the counting devices, leaving out the slowest one when
  there are three or more.

Agreement is judged by its Wilson score interval at ``policy.gates.shadow_confidence``,
never by the bare ratio:

- pass: the judged pool holds ``>= shadow_min`` frames, its lower bound
  ``>= min_agreement``, and (when the bundle has a latency budget) the p99 above is
  ``<= budget x latency_budget_factor``;
- fail early: the early-fail pool holds ``>= shadow_min`` frames and its upper bound is
  ``< min_agreement`` (no amount of further frames is likely to show it);
- fail at the deadline (``shadow_s``) without a pass, naming what was not shown;
- otherwise wait.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from fleet_server.quality.stats import wilson_interval
from fleet_server.rollout.gates import GateFail, GatePass, GateResult, GateWait, Metrics
from fleet_server.rollout.spec import RolloutSpec


@dataclass(frozen=True)
class ShadowSample:
    """One shadowing device's figures for the target, from the fleet's stored records
    (see the module docstring)."""

    device_id: str
    n: int = 0
    agree: int = 0
    p99_ms: float | None = None


@dataclass(frozen=True)
class Counted:
    """A device's counts as they enter the pool: capped, ratio kept."""

    device_id: str
    n: int
    agree: int
    p99_ms: float | None

    @property
    def ratio(self) -> Fraction:
        return Fraction(self.agree, self.n) if self.n else Fraction(0)


def device_cap(spec: RolloutSpec) -> int:
    """The most frames one device's records enter a pool with."""
    return max(1, spec.shadow_min)


def device_minimum(spec: RolloutSpec, wave_size: int) -> int:
    """Frames a device shows before it counts: its share of ``shadow_min`` (1 in a wave
    of one device: ``shadow_min`` applies to its pool)."""
    if wave_size <= 1:
        return 1
    return max(1, math.ceil(spec.shadow_min / wave_size))


def capped(sample: ShadowSample, cap: int) -> Counted:
    """``sample`` with at most ``cap`` frames, its agreement scaled (rounded half to
    even) so its ratio stays; negative or inconsistent figures count as none."""
    n = max(0, sample.n)
    agree = max(0, min(sample.agree, n))
    if n > cap:
        agree, n = round(Fraction(agree * cap, n)), cap
    return Counted(sample.device_id, n, agree, sample.p99_ms)


def pools(
    counting: Sequence[Counted], wave_size: int
) -> tuple[list[Counted], list[Counted], list[str]]:
    """(the pool a pass is judged on, the pool an early fail is judged on, the devices
    left out as outliers) of the counting devices (see the module docstring)."""
    ordered = sorted(counting, key=lambda c: (c.ratio, c.n, c.device_id))
    if wave_size <= 1:
        return ordered, ordered, []
    if len(ordered) >= 3:
        kept = ordered[1:-1]
        return kept, kept, [ordered[0].device_id, ordered[-1].device_id]
    if len(ordered) == 2:
        return ordered[:1], ordered[1:], []
    return [], [], []


def pooled_p99(counting: Sequence[Counted], wave_size: int) -> float | None:
    """The highest p99 of the counting devices, the slowest left out when there are
    three or more (None: a counting device reported none, or none counts)."""
    if not counting or any(c.p99_ms is None for c in counting):
        return None
    p99s = sorted(c.p99_ms for c in counting if c.p99_ms is not None)
    if wave_size > 1 and len(p99s) >= 3:
        p99s = p99s[:-1]
    return p99s[-1]


def evaluate_shadow(
    spec: RolloutSpec,
    samples: Sequence[ShadowSample],
    budget_ms: float | None,
    *,
    over: bool,
) -> GateResult:
    """The shadow verdict of a wave's shadowing devices; ``over``: the phase's deadline
    has passed. Metrics: ``shadow_devices`` (in the wave), ``shadow_counting`` (showed
    their share), ``shadow_judged`` (in the judged pool), ``shadow_left_out`` (outliers
    left out), ``shadow_device_cap``, ``shadow_n``, ``shadow_agree``,
    ``shadow_agreement``, ``shadow_lower``, ``shadow_upper`` (of the judged pool),
    ``shadow_p99_ms``, ``shadow_p99_limit_ms``."""
    gates = spec.policy.gates
    wave_size = len(samples)
    cap = device_cap(spec) if wave_size > 1 else max(0, *(s.n for s in samples))
    floor = device_minimum(spec, wave_size)
    counting = [c for s in samples if (c := capped(s, cap)).n >= floor]
    for_pass, for_fail, left_out = pools(counting, wave_size)
    n, agree = sum(c.n for c in for_pass), sum(c.agree for c in for_pass)
    lower, upper = wilson_interval(agree, n, gates.shadow_confidence)
    fail_n, fail_agree = sum(c.n for c in for_fail), sum(c.agree for c in for_fail)
    fail_lower, fail_upper = wilson_interval(fail_agree, fail_n, gates.shadow_confidence)
    p99 = pooled_p99(counting, wave_size)
    limit = None if budget_ms is None else budget_ms * gates.latency_budget_factor
    metrics: Metrics = {
        "shadow_devices": wave_size,
        "shadow_counting": len(counting),
        "shadow_judged": len(for_pass),
        "shadow_left_out": ",".join(left_out) or None,
        "shadow_device_cap": cap,
        "shadow_n": n,
        "shadow_agree": agree,
        "shadow_agreement": round(agree / n, 4) if n else None,
        "shadow_lower": round(lower, 4),
        "shadow_upper": round(upper, 4),
        "shadow_p99_ms": p99,
        "shadow_p99_limit_ms": limit,
    }
    want = spec.min_agreement
    if fail_n >= spec.shadow_min and fail_upper < want:
        said = _agreement(fail_agree, fail_n, fail_lower, fail_upper)
        metrics |= {
            "shadow_n": fail_n,
            "shadow_agree": fail_agree,
            "shadow_agreement": round(fail_agree / fail_n, 4),
            "shadow_lower": round(fail_lower, 4),
            "shadow_upper": round(fail_upper, 4),
            "shadow_judged": len(for_fail),
        }
        return GateFail(f"shadow {said}: upper bound < min_agreement {want:g}", metrics, ())
    said = _agreement(agree, n, lower, upper)
    missing = []
    if wave_size > 1 and len(counting) < 2:
        missing.append(
            f"{len(counting)} of {wave_size} devices showed {floor} sampled frames "
            "(a wave of several is not judged on one device)"
        )
    elif n < spec.shadow_min:
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
