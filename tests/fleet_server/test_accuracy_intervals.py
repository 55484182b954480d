"""Accuracy from the review labels on SQLite and on PostgreSQL (db_fixtures): Wilson
intervals on accuracy, precision and recall per outcome from known confusion counts,
and ``labelled_accuracy`` (what the rollout's accuracy gates read) by model version and
lines. Decisions are stored through the ingest sink and reviewed with ``save_review``,
as the API does."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine

from agent.wire.messages import DecisionRow
from fleet_server.quality.stats import wilson_interval
from fleet_server.review import (
    BadQuery,
    DecisionFilter,
    accuracy,
    labelled_accuracy,
    outcome_scores,
    save_review,
)
from tests.fleet_server.review_data import T0, Fleet, decision, store_rows

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db (SQLite and PostgreSQL), pg_cluster


def seed(
    db: Engine,
    fleet: Fleet,
    device_id: str,
    pairs: dict[tuple[str, str], int],
    *,
    line: str,
    version: str,
    model_name: str = "surface-check",
    unreviewed: int = 0,
) -> None:
    """Decisions of ``device_id`` on ``line`` by ``model_name`` ``version``: for each
    (decided, label) pair, that many decisions decided so and reviewed to that label;
    plus ``unreviewed`` pass decisions nobody reviewed."""
    rows: list[tuple[DecisionRow, str]] = []
    for (decided, label), n in sorted(pairs.items()):
        for _ in range(n):
            ts = T0 + len(fleet.rows) + len(rows)
            row = decision(device_id, ts, line=line, outcome=decided, model_version=version)
            rows.append((row.model_copy(update={"model_name": model_name}), label))
    extra = [
        decision(device_id, T0 + 10_000 + len(fleet.rows) + i, line=line, model_version=version)
        for i in range(unreviewed)
    ]
    store_rows(db, fleet, [r for r, _ in rows] + extra)
    for row, label in rows:
        if label == row.outcome:
            save_review(db, row.id, verdict="confirm", outcome=None, note="", reviewer="lena")
        else:
            save_review(db, row.id, verdict="override", outcome=label, note="", reviewer="lena")


LINE_1_V1 = {
    ("reject", "reject"): 8,
    ("reject", "pass"): 2,
    ("pass", "pass"): 9,
    ("pass", "reject"): 1,
}
"""17 of 20 right; reject: precision 8/10, recall 8/9; pass: precision 9/10, recall 9/11."""


def test_accuracy_carries_its_wilson_interval_and_precision_recall_per_outcome(
    db: Engine,
) -> None:
    fleet = Fleet()
    fleet.add_device(db, "d1", line="1")
    seed(db, fleet, "d1", LINE_1_V1, line="1", version="1.0.0", unreviewed=5)
    (group,) = accuracy(db, ["model_version", "line"], DecisionFilter())
    assert group.key == {"model_version": "1.0.0", "line": "1"}
    assert (group.reviewed, group.confirmed) == (20, 17)
    bounds = group.interval
    assert (bounds.hits, bounds.n) == (17, 20)
    assert (bounds.lower, bounds.upper) == pytest.approx(wilson_interval(17, 20))
    # the Wilson interval of 17/20 at 95 %, worked by hand: centre 0.8137, half 0.1480
    assert bounds.lower == pytest.approx(0.6396, abs=1e-3)
    assert bounds.upper == pytest.approx(0.9476, abs=1e-3)
    scores = {s.outcome: s for s in group.outcomes}
    assert list(scores) == ["pass", "reject"]
    reject, passed = scores["reject"], scores["pass"]
    assert (reject.precision.hits, reject.precision.n) == (8, 10)
    assert (reject.recall.hits, reject.recall.n) == (8, 9)
    assert (passed.precision.hits, passed.precision.n) == (9, 10)
    assert (passed.recall.hits, passed.recall.n) == (9, 11)
    assert reject.precision.value == pytest.approx(0.8)
    assert reject.recall.value == pytest.approx(8 / 9)
    assert (reject.recall.lower, reject.recall.upper) == pytest.approx(wilson_interval(8, 9))
    assert (passed.precision.lower, passed.precision.upper) == pytest.approx(wilson_interval(9, 10))


def test_a_lower_confidence_gives_a_narrower_interval_around_the_same_accuracy(
    db: Engine,
) -> None:
    fleet = Fleet()
    fleet.add_device(db, "d1", line="1")
    seed(db, fleet, "d1", LINE_1_V1, line="1", version="1.0.0")
    (wide,) = accuracy(db, [], DecisionFilter())
    (narrow,) = accuracy(db, [], DecisionFilter(), confidence=0.8)
    assert wide.accuracy == narrow.accuracy == pytest.approx(0.85)
    assert wide.interval.lower < narrow.interval.lower < 0.85 < narrow.interval.upper
    assert narrow.interval.upper < wide.interval.upper
    assert (narrow.interval.lower, narrow.interval.upper) == pytest.approx(
        wilson_interval(17, 20, 0.8)
    )


@pytest.mark.parametrize("confidence", [0.0, 0.3, 1.0, 1.5, float("nan")])
def test_a_confidence_out_of_range_is_refused_naming_it(db: Engine, confidence: float) -> None:
    with pytest.raises(BadQuery, match=r"^confidence:"):
        accuracy(db, [], DecisionFilter(), confidence=confidence)


def test_per_version_rows_each_have_their_own_interval(db: Engine) -> None:
    fleet = Fleet()
    fleet.add_device(db, "d1", line="1")
    seed(db, fleet, "d1", LINE_1_V1, line="1", version="1.0.0")
    seed(db, fleet, "d1", {("pass", "pass"): 3, ("pass", "reject"): 3}, line="1", version="1.1.0")
    groups = accuracy(db, ["model_version", "line"], DecisionFilter())
    assert [(g.key["model_version"], g.confirmed, g.reviewed) for g in groups] == [
        ("1.0.0", 17, 20),
        ("1.1.0", 3, 6),
    ]
    new = groups[1]
    assert (new.interval.lower, new.interval.upper) == pytest.approx(wilson_interval(3, 6))
    # 1.1.0 never called reject: its precision is unknown (no value, [0, 1]), recall 0 of 3
    reject = {s.outcome: s for s in new.outcomes}["reject"]
    assert reject.precision.value is None
    assert (reject.precision.lower, reject.precision.upper) == (0.0, 1.0)
    assert (reject.recall.hits, reject.recall.n) == (0, 3)
    assert reject.recall.value == 0.0


def test_outcome_scores_of_a_confusion_without_the_database() -> None:
    scores = outcome_scores({("a", "a"): 2, ("a", "b"): 1, ("c", "b"): 4})
    assert [(s.outcome, s.precision.hits, s.precision.n, s.recall.n) for s in scores] == [
        ("a", 2, 3, 2),
        ("b", 0, 0, 5),
        ("c", 0, 4, 0),
    ]


def test_labelled_accuracy_counts_one_model_version_on_the_lines_asked(db: Engine) -> None:
    fleet = Fleet()
    for device_id, line in (("d1", "1"), ("d2", "2"), ("d3", "3")):
        fleet.add_device(db, device_id, line=line)
    seed(db, fleet, "d1", LINE_1_V1, line="1", version="1.0.0")
    seed(db, fleet, "d1", {("pass", "pass"): 4, ("reject", "pass"): 1}, line="1", version="1.1.0")
    line_2 = {("reject", "reject"): 1, ("pass", "reject"): 2}
    seed(db, fleet, "d2", line_2, line="2", version="1.1.0")
    seed(
        db, fleet, "d3", {("pass", "pass"): 7}, line="3", version="1.1.0", model_name="other",
        unreviewed=3,
    )  # fmt: skip
    assert labelled_accuracy(db, "surface-check", "1.1.0", ["1"]) == (4, 5)
    assert labelled_accuracy(db, "surface-check", "1.1.0", ["2"]) == (1, 3)
    assert labelled_accuracy(db, "surface-check", "1.1.0", ["1", "2", "2"]) == (5, 8)
    assert labelled_accuracy(db, "surface-check", "1.1.0", None) == (5, 8)
    assert labelled_accuracy(db, "surface-check", "1.0.0", ["1"]) == (17, 20)
    assert labelled_accuracy(db, "surface-check", "1.0.0", ["2"]) == (0, 0)
    assert labelled_accuracy(db, "surface-check", "1.1.0", []) == (0, 0)
    assert labelled_accuracy(db, "other", "1.1.0", ["3"]) == (7, 7)
    assert labelled_accuracy(db, "surface-check", "9.9.9", None) == (0, 0)


def test_labelled_accuracy_follows_a_changed_label(db: Engine) -> None:
    fleet = Fleet()
    fleet.add_device(db, "d1", line="1")
    seed(db, fleet, "d1", {("pass", "pass"): 2}, line="1", version="2.0.0")
    assert labelled_accuracy(db, "surface-check", "2.0.0", ["1"]) == (2, 2)
    first = fleet.rows[0]
    save_review(db, first.id, verdict="override", outcome="reject", note="", reviewer="olga")
    assert labelled_accuracy(db, "surface-check", "2.0.0", ["1"]) == (1, 2)
