"""Policy: turn a pipeline's results into an outcome. Pure: no I/O, no clock.

The evidence a policy sees is a list of items, each a ``(label, score)``:

- a classification result gives one item (top-1 label and its score);
- a score result gives one item (no label);
- a detection result gives one item per detection;
- a detector -> classifier chain gives one item per classified crop.

Rules are tried in order; the first that fires names the outcome, else ``default``.
A rule's items are those whose label matches (when the rule names one) and whose score
lies in ``[min_score, max_score)`` (each bound optional). The rule fires when the number
of such items is at least ``min_count`` (default 1) and at most ``max_count`` (if set):
``min_count = 0, max_count = 0`` fires when *no* item matches ("nothing detected").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError, model_validator

from agent.kernel.configbase import Section
from agent.kernel.errors import ConfigError

STANDARD_OUTCOMES = ("pass", "reject", "review")


class Rule(Section):
    """One threshold rule: when it fires, the decision's outcome is ``outcome``."""

    outcome: str = Field(
        description="Outcome this rule gives: pass, reject, review or a line's own."
    )
    label: str | None = Field(None, description="Only items with this label count (any if unset).")
    min_score: float | None = Field(None, description="Items count when score >= min_score.")
    max_score: float | None = Field(None, description="Items count when score < max_score.")
    min_count: int = Field(1, ge=0, description="The rule fires with at least this many items.")
    max_count: int | None = Field(
        None, ge=0, description="...and at most this many (unset: no upper bound)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> Rule:
        if (
            self.min_score is not None
            and self.max_score is not None
            and self.min_score >= self.max_score
        ):
            raise ValueError(f"min_score {self.min_score} must be below max_score {self.max_score}")
        if self.max_count is not None and self.max_count < self.min_count:
            raise ValueError(f"max_count {self.max_count} is below min_count {self.min_count}")
        return self


class PolicySpec(Section):
    """Ordered rules and the outcome when none fires."""

    rules: list[Rule] = Field(default_factory=list, description="Tried in order; first wins.")
    default: str = Field("pass", description="Outcome when no rule fires.")

    def outcomes(self) -> set[str]:
        return {self.default, *(r.outcome for r in self.rules)}


def parse_policy(data: Mapping[str, Any], where: str) -> PolicySpec:
    """A policy from a bundle manifest's free-form ``policy`` block.

    Raises:
        ConfigError: naming ``where`` (the manifest) and the dotted field.
    """
    try:
        return PolicySpec.model_validate(dict(data))
    except ValidationError as e:
        err = e.errors()[0]
        field = "policy." + ".".join(str(p) for p in err["loc"])
        raise ConfigError(where, field, err["msg"]) from None


@dataclass(frozen=True, slots=True)
class Item:
    """One piece of evidence: a label (or None) and a score."""

    label: str | None
    score: float


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome and why: the index of the rule that fired (None: the default)."""

    outcome: str
    rule: int | None
    matched: int

    def thresholds(self, policy: PolicySpec) -> dict[str, Any]:
        """What the decision log records as "the thresholds used"."""
        return {
            "rules": [r.model_dump(exclude_none=True) for r in policy.rules],
            "default": policy.default,
            "fired": self.rule,
        }


def _matches(rule: Rule, item: Item) -> bool:
    if rule.label is not None and item.label != rule.label:
        return False
    if rule.min_score is not None and item.score < rule.min_score:
        return False
    return not (rule.max_score is not None and item.score >= rule.max_score)


def decide(policy: PolicySpec, items: Sequence[Item]) -> Verdict:
    """The outcome of ``items`` under ``policy``."""
    for index, rule in enumerate(policy.rules):
        n = sum(1 for item in items if _matches(rule, item))
        if n >= rule.min_count and (rule.max_count is None or n <= rule.max_count):
            return Verdict(rule.outcome, index, n)
    return Verdict(policy.default, None, 0)
