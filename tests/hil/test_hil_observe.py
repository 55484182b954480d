"""The judgements the scenarios make, on figures given here."""

from __future__ import annotations

from hil.fleet import HealthSample
from hil.observe import (
    compare_ids,
    drop_policy_holds,
    judge_health,
    labelled,
    metric_samples,
    percentile,
)


def _health(seqs: list[int], start: float = 1000.0) -> list[HealthSample]:
    return [HealthSample(s, start + i) for i, s in enumerate(seqs)]


def test_ids_exactly_once_missing_and_extra() -> None:
    assert compare_ids(["a", "b"], ["b", "a"]).exactly_once
    cmp = compare_ids(["a", "b", "c"], ["a", "x"])
    assert cmp.missing == ["b", "c"]
    assert cmp.extra == ["x"]
    assert not cmp.exactly_once
    assert "missing at the fleet: b, c" in cmp.detail()
    assert compare_ids(["a"], ["a", "a"]).duplicated == 1


def test_health_complete_in_order_passes() -> None:
    v = judge_health(_health(list(range(20))), (1000.0, 1019.0), 1.0)
    assert v.ok
    assert v.figures["in_window"] == 20


def test_health_with_a_gap_a_duplicate_or_too_few_fails() -> None:
    gap = judge_health(_health([0, 1, 2, 4, 5]), (1000.0, 1004.0), 1.0)
    assert not gap.ok
    assert "seq gaps [3]" in gap.detail
    dup = judge_health(_health([0, 1, 2, 2, 3]), (1000.0, 1004.0), 1.0)
    assert dup.figures["duplicates"] == 1
    few = judge_health(_health([0, 1, 2]), (1000.0, 1060.0), 1.0)
    assert "only 3 of ~60" in few.detail


def test_a_restarted_agent_starts_a_new_run_of_seqs() -> None:
    v = judge_health(_health([0, 1, 2, 0, 1]), (1000.0, 1004.0), 1.0)
    assert v.ok
    assert v.figures["runs"] == 2


def test_drop_policy() -> None:
    order = ("health", "event", "decisions")
    assert drop_policy_holds({"health": 5}, {"event": 2, "decisions": 3}, order)[0]
    assert drop_policy_holds({"health": 5, "decisions": 1}, {}, order)[0]
    ok, why = drop_policy_holds({"decisions": 4}, {"health": 2}, order)
    assert not ok
    assert "2 health" in why


def test_percentile_and_metrics() -> None:
    assert percentile([], 99) is None
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    text = (
        "# HELP edgefleet_alarms_total Alarms raised, by kind.\n"
        'edgefleet_alarms_total{kind="outbox_dropping"} 1.0\n'
        'edgefleet_alarms_total{kind="decision_log_write_failed"} 12.0\n'
        "edgefleet_decision_log_queued 0.0\n"
    )
    samples = metric_samples(text)
    assert samples["edgefleet_decision_log_queued"] == 0.0
    assert labelled(samples, "edgefleet_alarms_total", "kind") == {
        "outbox_dropping": 1.0,
        "decision_log_write_failed": 12.0,
    }
