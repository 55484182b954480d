"""A decision's policy in words (fleet_server/web/rules.py), from the thresholds the
agent logs (agent/policy.py's Verdict.thresholds)."""

from __future__ import annotations

from agent.policy import Item, PolicySpec, decide
from fleet_server.web.rules import policy_text, rule_text

POLICY = PolicySpec.model_validate(
    {
        "default": "pass",
        "rules": [
            {"outcome": "reject", "label": "180", "min_score": 0.8},
            {"outcome": "review", "min_score": 0.5, "max_score": 0.8, "min_count": 2},
            {"outcome": "review", "label": "scratch", "min_count": 0, "max_count": 0},
        ],
    }
)


def test_the_rule_that_fired_and_each_rule_read_in_words() -> None:
    logged = decide(POLICY, [Item("180", 0.91)]).thresholds(POLICY)
    fired, rules = policy_text(logged)
    assert fired == "rule 1 fired: reject: label 180 with score \u2265 0.8"
    assert rules == [
        "reject: label 180 with score \u2265 0.8",
        "review: any item with score \u2265 0.5 and score < 0.8, at least 2 of them",
        "review: label scratch, exactly 0 of them",
    ]
    two = decide(POLICY, [Item("a", 0.6), Item("b", 0.7), Item("scratch", 0.1)])
    assert policy_text(two.thresholds(POLICY))[0].startswith("rule 2 fired: review: any item")
    none = decide(POLICY, [Item("scratch", 0.3)]).thresholds(POLICY)
    assert policy_text(none)[0] == "no rule fired: the default, pass"


def test_other_shapes_are_shown_as_they_are() -> None:
    assert policy_text({"reject_above": 0.8, "review_above": 0.6}) == (
        "reject_above 0.8; review_above 0.6",
        [],
    )
    assert policy_text(None) == ("", [])
    assert policy_text({"rules": [], "default": "pass", "fired": None})[0] == (
        "no rule fired: the default, pass"
    )
    assert rule_text("odd") == "odd"
