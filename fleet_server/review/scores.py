"""How good the devices' decisions are by the reviews: accuracy, per-outcome precision
and recall, each with a Wilson confidence interval (pure: counts in, numbers out).

The reviews' confusion counts ``(decided, label) -> n`` hold everything:

- accuracy: the share of reviewed decisions whose label is what the device decided;
- precision of outcome X: of the decisions the device called X, the share the
  reviewer labelled X (how far an X from the device can be trusted);
- recall of outcome X: of the decisions the reviewer labelled X, the share the device
  called X (how many of the real X the device finds).

A bare ratio of a few reviews says little, so each comes with the Wilson score interval
at the asked ``confidence`` (:func:`fleet_server.quality.stats.wilson_interval`): 9 of
10 is [0.60, 0.98] at 95 %, 900 of 1000 is [0.88, 0.92]. Reviews are not a random sample
of the decisions (a line manager reviews mostly what the device flagged, unless the
devices keep thumbnails of a share of passes: ``[decision_log] pass_sample``), so
precision of the flagged outcomes is the best measured figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fleet_server.quality.stats import wilson_interval
from fleet_server.review.errors import BadQuery

DEFAULT_CONFIDENCE = 0.95
"""The confidence of an interval unless asked otherwise."""
MIN_CONFIDENCE, MAX_CONFIDENCE = 0.5, 0.9999
"""The confidences taken (a narrower range than (0, 1): an interval at 0.1 or 1 - 1e-12
would read as a mistake, not a choice)."""

Confusion = Mapping[tuple[str, str], int]
"""``(decided, label) -> reviews``."""


def check_confidence(confidence: float) -> float:
    """``confidence`` if it is within :data:`MIN_CONFIDENCE`..:data:`MAX_CONFIDENCE`.

    Raises:
        BadQuery: it is not (naming ``confidence``).
    """
    if not MIN_CONFIDENCE <= confidence <= MAX_CONFIDENCE:
        raise BadQuery(
            "confidence",
            f"{confidence} is not within {MIN_CONFIDENCE}..{MAX_CONFIDENCE} (0.95 is 95 %)",
        )
    return confidence


@dataclass(frozen=True)
class Proportion:
    """``hits`` of ``n`` with its Wilson interval; ``value`` is None when ``n`` is 0
    (nothing to measure; the interval is then [0, 1])."""

    hits: int
    n: int
    lower: float
    upper: float

    @property
    def value(self) -> float | None:
        """hits / n, or None at n = 0."""
        return self.hits / self.n if self.n else None


def proportion(hits: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> Proportion:
    """``hits`` of ``n`` with its interval at ``confidence``.

    Raises:
        BadQuery: ``confidence`` out of range.
        ValueError: the counts are not a proportion (a programming error).
    """
    lower, upper = wilson_interval(hits, n, check_confidence(confidence))
    return Proportion(hits, n, lower, upper)


@dataclass(frozen=True)
class OutcomeScore:
    """Precision and recall of one outcome.

    Attributes:
        outcome: the outcome (e.g. ``reject``).
        precision: of the decisions the device called it (``precision.n``), those the
            reviewer labelled it too (``precision.hits``).
        recall: of the decisions the reviewer labelled it (``recall.n``), those the
            device called it (``recall.hits``, the same count).
    """

    outcome: str
    precision: Proportion
    recall: Proportion


def outcome_scores(
    confusion: Confusion, confidence: float = DEFAULT_CONFIDENCE
) -> list[OutcomeScore]:
    """Precision and recall of every outcome that was decided or labelled, sorted by
    outcome.

    Raises:
        BadQuery: ``confidence`` out of range.
    """
    outcomes = sorted({o for pair in confusion for o in pair})
    out = []
    for outcome in outcomes:
        hits = confusion.get((outcome, outcome), 0)
        decided = sum(n for (d, _), n in confusion.items() if d == outcome)
        labelled = sum(n for (_, label), n in confusion.items() if label == outcome)
        out.append(
            OutcomeScore(
                outcome,
                proportion(hits, decided, confidence),
                proportion(hits, labelled, confidence),
            )
        )
    return out


def agreed(confusion: Confusion) -> int:
    """Reviews whose label is what the device decided."""
    return sum(n for (decided, label), n in confusion.items() if decided == label)
