"""Gate evaluation for a wave (pure): device samples + policy → pass, fail or wait.

The samples are every device the rollout has assigned so far (this wave and the waves
before it), so a problem that shows late on a first-wave device still stops a later wave.
Failure checks are judged as soon as the numbers are over a threshold (fail fast); a pass
needs every sample settled, at least one device done, and the soak over.

Outcome shift is the total variation distance (TVD) between the pooled decision outcome
distribution under the new bundle and under the previous one on the same devices:
``0.5 * sum(|p_i - q_i|)`` over every outcome seen on either side, in [0, 1]. It needs no
expected counts per cell (unlike chi-square, which misbehaves on rare outcomes such as
'review') and reads directly as "this share of decisions moved to another outcome".
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleet_server.quality.stats import proportion_drop, wilson_interval
from fleet_server.rollout.spec import GatePolicy

Metrics = dict[str, float | int | str | None]


@dataclass(frozen=True)
class LabelCounts:
    """Review labels: ``confirmed`` of ``reviewed`` decisions of the new version, and
    ``base_*`` of the version(s) the rollout's devices ran before, on the same lines."""

    confirmed: int = 0
    reviewed: int = 0
    base_confirmed: int = 0
    base_reviewed: int = 0


@dataclass(frozen=True)
class DeviceSample:
    """What the gate needs to know about one assigned device.

    ``p99_ms``/``outcomes``/``worker_crashes`` are under the new bundle; ``base_*`` under
    the bundle the device ran before the rollout.
    """

    device_id: str
    settled: bool
    done: bool
    install_failed: bool = False
    auto_rollback: bool = False
    worker_crashes: int = 0
    p99_ms: float | None = None
    outcomes: Mapping[str, int] = field(default_factory=dict)
    base_p99_ms: float | None = None
    base_outcomes: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GatePass:
    """Every check within its threshold, every device settled, soak over."""

    metrics: Metrics


@dataclass(frozen=True)
class GateFail:
    """A check over its threshold. ``devices``: the devices that made it fail."""

    reason: str
    metrics: Metrics
    devices: tuple[str, ...]


@dataclass(frozen=True)
class GateWait:
    """No check failed, but no verdict yet (devices installing, no evidence, soaking)."""

    reason: str
    metrics: Metrics


GateResult = GatePass | GateFail | GateWait


def tvd(p: Mapping[str, int], q: Mapping[str, int]) -> float:
    """Total variation distance between two count distributions (0 when either is empty)."""
    np_, nq = sum(p.values()), sum(q.values())
    if np_ <= 0 or nq <= 0:
        return 0.0
    keys = set(p) | set(q)
    return 0.5 * sum(abs(p.get(k, 0) / np_ - q.get(k, 0) / nq) for k in keys)


def evaluate(
    policy: GatePolicy,
    samples: Sequence[DeviceSample],
    budget_ms: float | None,
    *,
    soak_over: bool,
    labels: LabelCounts | None = None,
) -> GateResult:
    """The gate's verdict over ``samples`` and the review ``labels`` (see the module
    docstring)."""
    metrics: Metrics = {"devices": len(samples)}
    fails: list[tuple[str, tuple[str, ...]]] = []

    installs = [s.device_id for s in samples if s.install_failed and not s.auto_rollback]
    allowed = max(
        policy.max_install_failures,
        math.floor(policy.max_install_failure_fraction * len(samples) + 1e-9),
    )
    metrics |= {"install_failures": len(installs), "install_failures_allowed": allowed}
    if len(installs) > allowed:
        fails.append((f"{len(installs)} install failures > {allowed} allowed", tuple(installs)))

    rolled = [s.device_id for s in samples if s.auto_rollback]
    metrics["auto_rollbacks"] = len(rolled)
    if len(rolled) > policy.max_auto_rollbacks:
        fails.append(
            (f"{len(rolled)} automatic rollbacks > {policy.max_auto_rollbacks}", tuple(rolled))
        )

    crashes = sum(max(0, s.worker_crashes) for s in samples)
    metrics["worker_crashes"] = crashes
    if crashes > policy.max_worker_crashes:
        who = tuple(s.device_id for s in samples if s.worker_crashes > 0)
        fails.append((f"{crashes} worker crashes > {policy.max_worker_crashes}", who))

    done = [s for s in samples if s.done]
    fails += _latency(policy, done, budget_ms, metrics)
    fails += _outcomes(policy, done, metrics)
    accuracy_fails, unshown = accuracy(policy, labels or LabelCounts(), metrics)
    fails += [(reason, ()) for reason in accuracy_fails]

    if fails:
        devices = tuple(sorted({d for _, ds in fails for d in ds}))
        return GateFail("; ".join(r for r, _ in fails), metrics, devices)
    unsettled = sum(1 for s in samples if not s.settled)
    pending = f"{unsettled} devices not settled" if unsettled else ""
    if pending or not done:
        return GateWait(pending or "no device done yet", metrics)
    if unshown and soak_over:
        return GateFail(f"accuracy not shown by the end of the soak: {unshown}", metrics, ())
    if unshown or not soak_over:
        return GateWait(unshown or "soaking", metrics)
    return GatePass(metrics)


def _latency(
    policy: GatePolicy, done: Sequence[DeviceSample], budget_ms: float | None, metrics: Metrics
) -> list[tuple[str, tuple[str, ...]]]:
    fails: list[tuple[str, tuple[str, ...]]] = []
    timed = [s for s in done if s.p99_ms is not None]
    metrics["p99_ms_max"] = max((s.p99_ms for s in timed if s.p99_ms is not None), default=None)
    if budget_ms is not None:
        limit = budget_ms * policy.latency_budget_factor
        over = tuple(s.device_id for s in timed if s.p99_ms is not None and s.p99_ms > limit)
        metrics["devices_over_budget"] = len(over)
        if len(over) > policy.max_devices_over_budget:
            fails.append((f"{len(over)} devices with p99 over {limit:g} ms", over))
    pairs = [(s.p99_ms, s.base_p99_ms) for s in timed if s.base_p99_ms]
    if pairs and policy.max_p99_ratio is not None:
        new = statistics.median(p for p, _ in pairs if p is not None)
        old = statistics.median(b for _, b in pairs if b is not None)
        ratio = new / old if old > 0 else math.inf
        metrics["p99_ratio"] = round(ratio, 4)
        if ratio > policy.max_p99_ratio:
            who = tuple(s.device_id for s in timed if s.base_p99_ms)
            fails.append((f"p99 {ratio:.2f}x the previous version's", who))
    return fails


def _outcomes(
    policy: GatePolicy, done: Sequence[DeviceSample], metrics: Metrics
) -> list[tuple[str, tuple[str, ...]]]:
    new: Counter[str] = Counter()
    old: Counter[str] = Counter()
    for s in done:
        new.update({k: max(0, v) for k, v in s.outcomes.items()})
        old.update({k: max(0, v) for k, v in s.base_outcomes.items()})
    n_new, n_old = sum(new.values()), sum(old.values())
    metrics |= {"outcome_samples": n_new, "baseline_outcome_samples": n_old}
    if policy.max_outcome_tvd is None:
        return []
    if min(n_new, n_old) < policy.min_outcome_samples:
        metrics["outcome_tvd"] = "skipped: too few decisions"
        return []
    distance = tvd(new, old)
    metrics["outcome_tvd"] = round(distance, 4)
    if distance > policy.max_outcome_tvd:
        who = tuple(s.device_id for s in done if s.outcomes)
        return [(f"outcome distribution shifted (TVD {distance:.3f})", who)]
    return []


def accuracy(policy: GatePolicy, labels: LabelCounts, metrics: Metrics) -> tuple[list[str], str]:
    """The accuracy checks: (failure reasons, why accuracy is not shown yet or "").

    Adds ``accuracy``, ``accuracy_lower``, ``accuracy_upper``, ``accuracy_labels``,
    ``accuracy_status`` and, for the drop, ``accuracy_base``, ``accuracy_base_labels``,
    ``accuracy_drop``, ``accuracy_p_value`` to ``metrics``.
    """
    if policy.min_accuracy is None and policy.accuracy_drop is None:
        return [], ""
    need = policy.min_labels
    n, ok = labels.reviewed, labels.confirmed
    metrics["accuracy_labels"] = n
    if n:
        lower, upper = wilson_interval(ok, n, policy.accuracy_confidence)
        metrics |= {
            "accuracy": round(ok / n, 4),
            "accuracy_lower": round(lower, 4),
            "accuracy_upper": round(upper, 4),
        }
    fails: list[str] = []
    unshown: list[str] = []
    if n < need:
        unshown.append(f"waiting: {n} of {need} labels")
    elif policy.min_accuracy is not None:
        limit = policy.min_accuracy
        if upper < limit:
            fails.append(
                f"labelled accuracy {ok / n:.3f} over {n} labels: upper bound {upper:.3f} "
                f"< min_accuracy {limit:g}"
            )
        elif lower < limit:
            unshown.append(f"lower bound {lower:.3f} < min_accuracy {limit:g} over {n} labels")
    if policy.accuracy_drop is not None:
        fails += _drop(policy, labels, metrics, unshown)
    status = "failed" if fails else ("; ".join(unshown) if unshown else "shown")
    metrics["accuracy_status"] = status
    return fails, "; ".join(unshown)


def _drop(
    policy: GatePolicy, labels: LabelCounts, metrics: Metrics, unshown: list[str]
) -> list[str]:
    need, limit = policy.min_labels, policy.accuracy_drop
    base_n, base_ok = labels.base_reviewed, labels.base_confirmed
    metrics["accuracy_base_labels"] = base_n
    if base_n:
        metrics["accuracy_base"] = round(base_ok / base_n, 4)
    if limit is None or labels.reviewed < need:
        return []
    if base_n < need:
        unshown.append(f"waiting: {base_n} of {need} labels of the previous version")
        return []
    test = proportion_drop(labels.confirmed, labels.reviewed, base_ok, base_n)
    metrics |= {"accuracy_drop": round(test.drop, 4), "accuracy_p_value": round(test.p_value, 6)}
    if test.significant(policy.accuracy_alpha) and test.drop > limit:
        return [
            f"labelled accuracy dropped by {test.drop:.3f} (> {limit:g}) from the previous "
            f"version's, p = {test.p_value:.4f} < {policy.accuracy_alpha:g} "
            f"({labels.reviewed} and {base_n} labels)"
        ]
    return []
