"""A wave's gate metrics next to the thresholds they are judged against (pure).

The rollout machine stores the metrics of its last gate evaluation
(:func:`fleet_server.rollout.gates.evaluate`); this lays them out as rows for the
rollout page: the check, the value, the threshold, and a verdict in words (``within``,
``over``, ``skipped``, ``off``, ``no data``), so the colour is never the only signal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from fleet_server.rollout import GatePolicy, RolloutSpec

Verdict = Literal["within", "over", "skipped", "off", "no data"]
MetricValue = float | int | str | None


@dataclass(frozen=True)
class GateRow:
    """One gate check as shown."""

    check: str
    value: str
    threshold: str
    verdict: Verdict
    note: str = ""


def _num(value: MetricValue) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _show(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.3g}"


def _at_most(check: str, value: MetricValue, limit: float | None, unit: str = "") -> GateRow:
    if limit is None:
        return GateRow(
            check, "—" if _num(value) is None else _show(_num(value) or 0.0), "off", "off"
        )
    number = _num(value)
    if number is None:
        return GateRow(check, "—", f"≤ {_show(limit)}{unit}", "no data")
    verdict: Verdict = "over" if number > limit else "within"
    return GateRow(check, f"{_show(number)}{unit}", f"≤ {_show(limit)}{unit}", verdict)


def _at_least(check: str, value: MetricValue, limit: float, note: str) -> GateRow:
    number = _num(value)
    if number is None:
        return GateRow(check, "—", f"≥ {_show(limit)}", "no data", note)
    verdict: Verdict = "within" if number >= limit else "over"
    return GateRow(check, _show(number), f"≥ {_show(limit)}", verdict, note)


def quality_rows(
    metrics: Mapping[str, MetricValue], policy: GatePolicy, spec: RolloutSpec | None
) -> list[GateRow]:
    """The shadow agreement (when the rollout has a shadow phase and it was judged) and
    the accuracy checks (when the policy sets them). A bound short of its threshold
    reads ``over`` (out of bounds) until it is shown; the note says n and the interval."""
    rows: list[GateRow] = []
    if spec is not None and spec.shadow_s and "shadow_n" in metrics:
        n = metrics.get("shadow_n")
        note = (
            f"agreement {metrics.get('shadow_agreement')} over n={n} (need {spec.shadow_min}), "
            f"Wilson {metrics.get('shadow_lower')}..{metrics.get('shadow_upper')}"
        )
        rows.append(
            _at_least("Shadow agreement (lower bound)", metrics.get("shadow_lower"),
                      spec.min_agreement, note)
        )  # fmt: skip
        limit = _num(metrics.get("shadow_p99_limit_ms"))
        rows.append(_at_most("Shadow p99", metrics.get("shadow_p99_ms"), limit, " ms"))
    status = metrics.get("accuracy_status")
    note = f"{metrics.get('accuracy_labels', 0)} labels (need {policy.min_labels}): {status}"
    if policy.min_accuracy is not None:
        row = _at_least(
            "Labelled accuracy (lower bound)", metrics.get("accuracy_lower"),
            policy.min_accuracy, note,
        )  # fmt: skip
        if isinstance(status, str) and status.startswith("waiting"):
            row = GateRow(row.check, row.value, row.threshold, "no data", note)
        rows.append(row)
    if policy.accuracy_drop is not None:
        p = metrics.get("accuracy_p_value")
        row = _at_most("Accuracy drop vs previous", metrics.get("accuracy_drop"),
                       policy.accuracy_drop)  # fmt: skip
        drop_note = f"p = {p} (significant below {_show(policy.accuracy_alpha)}); {note}"
        if row.verdict == "over" and (_num(p) or 1.0) >= policy.accuracy_alpha:
            row = GateRow(row.check, row.value, row.threshold, "within", drop_note)
        rows.append(GateRow(row.check, row.value, row.threshold, row.verdict, drop_note))
    return rows


def gate_rows(
    metrics: Mapping[str, MetricValue],
    policy: GatePolicy,
    budget_ms: float | None,
    spec: RolloutSpec | None = None,
) -> list[GateRow]:
    """The rows of a gate evaluation's ``metrics`` under ``policy`` (see the module
    docstring); ``budget_ms`` is the bundle's latency budget (None: it has none);
    ``spec`` adds the shadow phase's rows."""
    allowed = _num(metrics.get("install_failures_allowed"))
    rows = [
        _at_most(
            "Install failures",
            metrics.get("install_failures"),
            allowed if allowed is not None else float(policy.max_install_failures),
        ),
        _at_most("Automatic rollbacks", metrics.get("auto_rollbacks"), policy.max_auto_rollbacks),
        _at_most("Worker crashes", metrics.get("worker_crashes"), policy.max_worker_crashes),
    ]
    if budget_ms is None:
        rows.append(GateRow("Devices over latency budget", "—", "bundle has no budget", "skipped"))
    else:
        limit = budget_ms * policy.latency_budget_factor
        row = _at_most(
            "Devices over latency budget",
            metrics.get("devices_over_budget"),
            policy.max_devices_over_budget,
        )
        worst = _num(metrics.get("p99_ms_max"))
        note = f"budget {_show(limit)} ms" + (
            f", highest p99 {_show(worst)} ms" if worst is not None else ""
        )
        rows.append(GateRow(row.check, row.value, row.threshold, row.verdict, note))
    rows.append(
        _at_most(
            "p99 / previous version's p99", metrics.get("p99_ratio"), policy.max_p99_ratio, " x"
        )
    )
    tvd = metrics.get("outcome_tvd")
    samples = (metrics.get("outcome_samples"), metrics.get("baseline_outcome_samples"))
    need = policy.min_outcome_samples
    note = f"decisions: {samples[0] or 0} new, {samples[1] or 0} before (need {need} each)"
    if policy.max_outcome_tvd is not None and isinstance(tvd, str):
        rows.append(
            GateRow(
                "Outcome shift (TVD)", "—", f"≤ {_show(policy.max_outcome_tvd)}", "skipped", note
            )
        )
    else:
        row = _at_most("Outcome shift (TVD)", tvd, policy.max_outcome_tvd)
        rows.append(GateRow(row.check, row.value, row.threshold, row.verdict, note))
    return rows + quality_rows(metrics, policy, spec)
