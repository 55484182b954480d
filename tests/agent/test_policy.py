"""Policy: rules in order, first that fires wins; counts, labels and score bounds."""

from __future__ import annotations

import pytest

from agent.kernel.errors import ConfigError
from agent.policy import Item, PolicySpec, Rule, decide, parse_policy


def _policy() -> PolicySpec:
    return PolicySpec(
        rules=[
            Rule(outcome="review", min_count=0, max_count=0),  # nothing seen at all
            Rule(outcome="reject", label="180", min_score=0.8),
            Rule(outcome="review", max_score=0.6),
        ],
        default="pass",
    )


def test_first_firing_rule_names_the_outcome() -> None:
    items = [Item("0", 0.99), Item("180", 0.95), Item("0", 0.5)]
    v = decide(_policy(), items)
    assert (v.outcome, v.rule, v.matched) == ("reject", 1, 1)


def test_no_items_fires_the_nothing_detected_rule() -> None:
    v = decide(_policy(), [])
    assert (v.outcome, v.rule) == ("review", 0)


def test_low_score_gives_review_and_confident_items_pass() -> None:
    assert decide(_policy(), [Item("0", 0.55)]).outcome == "review"
    v = decide(_policy(), [Item("0", 0.9), Item("180", 0.7)])
    assert (v.outcome, v.rule) == ("pass", None)


def test_score_bounds_are_half_open() -> None:
    p = PolicySpec(rules=[Rule(outcome="reject", min_score=0.5, max_score=0.7)])
    assert decide(p, [Item(None, 0.5)]).outcome == "reject"
    assert decide(p, [Item(None, 0.7)]).outcome == "pass"


def test_min_count_needs_that_many_matching_items() -> None:
    p = PolicySpec(rules=[Rule(outcome="rework", label="scratch", min_count=2)], default="ok")
    assert decide(p, [Item("scratch", 0.9)]).outcome == "ok"
    assert decide(p, [Item("scratch", 0.9), Item("scratch", 0.4)]).outcome == "rework"


def test_thresholds_record_the_rules_and_the_one_that_fired() -> None:
    p = _policy()
    t = decide(p, [Item("180", 0.9)]).thresholds(p)
    assert t["fired"] == 1
    assert t["rules"][1] == {"outcome": "reject", "label": "180", "min_score": 0.8, "min_count": 1}
    assert t["default"] == "pass"


def test_inverted_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="min_score"):
        Rule(outcome="x", min_score=0.9, max_score=0.1)


def test_manifest_policy_errors_name_the_field() -> None:
    with pytest.raises(ConfigError) as e:
        parse_policy({"rules": [{"outcome": "reject", "min_scor": 0.5}]}, "b/manifest.json")
    assert e.value.path == "b/manifest.json"
    assert e.value.field == "policy.rules.0.min_scor"
