"""A decision's policy in words: which rule fired and what each says
("reject: label 180 with score >= 0.8"), from the ``thresholds`` the device logged
(``{"rules": [...], "default": ..., "fired": index or None}``); older or other shapes
are shown as their keys and values. Pure."""

from __future__ import annotations

from typing import Any


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def rule_text(rule: Any) -> str:
    """One rule as a line manager reads it."""
    if not isinstance(rule, dict):
        return str(rule)
    what = f"label {rule['label']}" if rule.get("label") is not None else "any item"
    bounds = []
    if rule.get("min_score") is not None:
        bounds.append(f"score \N{GREATER-THAN OR EQUAL TO} {_number(rule['min_score'])}")
    if rule.get("max_score") is not None:
        bounds.append(f"score < {_number(rule['max_score'])}")
    if bounds:
        what += " with " + " and ".join(bounds)
    low, high = rule.get("min_count", 1), rule.get("max_count")
    if high is not None:
        what += f", {low} to {high} of them" if low != high else f", exactly {low} of them"
    elif low not in (1, None):
        what += f", at least {low} of them"
    elif low == 0:
        what += ", or none"
    return f"{rule.get('outcome', '?')}: {what}"


def policy_text(thresholds: Any) -> tuple[str, list[str]]:
    """``(what decided, every rule in words)`` of a decision's logged thresholds."""
    if not isinstance(thresholds, dict) or not thresholds:
        return "", []
    rules = thresholds.get("rules")
    if not isinstance(rules, list):  # another shape: its keys and values as they are
        shown = "; ".join(f"{k} {_number(v)}" for k, v in sorted(thresholds.items()))
        return shown, []
    texts = [rule_text(r) for r in rules]
    fired = thresholds.get("fired")
    if isinstance(fired, int) and 0 <= fired < len(texts):
        return f"rule {fired + 1} fired: {texts[fired]}", texts
    return f"no rule fired: the default, {thresholds.get('default', '?')}", texts
