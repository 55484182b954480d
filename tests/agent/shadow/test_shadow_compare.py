"""The pure comparison of a candidate's result with the live one: outcome agreement and
the greedy IoU match of detections with the same label."""

from __future__ import annotations

import pytest

from agent.pipeline.postprocess import Detection, Result
from agent.shadow.compare import BoxMatch, compare, iou, match_detections


def det(x1: float, y1: float, x2: float, y2: float, label: str = "scratch") -> Detection:
    return Detection((x1, y1, x2, y2), 0.9, label)


def detection_result(*dets: Detection) -> Result:
    best = dets[0] if dets else None
    return Result(
        "detection", best.score if best else 0.0, best.label if best else None, list(dets)
    )


def test_iou_of_identical_disjoint_and_half_overlapping_boxes() -> None:
    assert iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert iou((0, 0, 10, 10), (20, 20, 30, 30)) == 0.0
    assert iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0


def test_same_classification_outcome_agrees_and_has_no_boxes() -> None:
    live = Result("classification", 0.9, "ok")
    cand = Result("classification", 0.7, "ok")
    c = compare(live, "pass", cand, "pass")
    assert c.agree
    assert c.boxes == BoxMatch(0, 0, 0)


def test_different_outcome_disagrees_whatever_the_labels() -> None:
    live = Result("score", 0.2, "defect")
    cand = Result("score", 0.8, "defect")
    c = compare(live, "pass", cand, "reject")
    assert not c.agree
    assert (c.live_outcome, c.shadow_outcome) == ("pass", "reject")


def test_boxes_match_at_the_threshold_and_not_below() -> None:
    live = [det(0, 0, 10, 10)]
    half = [det(5, 0, 15, 10)]  # IoU 1/3
    assert match_detections(live, half, 0.33) == BoxMatch(1, 0, 0)
    assert match_detections(live, half, 0.34) == BoxMatch(0, 1, 1)


def test_a_box_with_another_label_never_matches() -> None:
    live = [det(0, 0, 10, 10, "scratch")]
    cand = [det(0, 0, 10, 10, "dent")]
    assert match_detections(live, cand, 0.5) == BoxMatch(0, 1, 1)


def test_greedy_match_pairs_the_best_iou_first_and_each_box_once() -> None:
    live = [det(0, 0, 10, 10), det(100, 100, 110, 110)]
    # two candidates on the first live box: the better one (identical) takes it, the
    # other is unmatched even though it overlaps enough; one candidate on the second
    cand = [det(1, 0, 11, 10), det(0, 0, 10, 10), det(100, 100, 110, 111), det(50, 50, 60, 60)]
    m = match_detections(live, cand, 0.5)
    assert m == BoxMatch(matched=2, unmatched_live=0, unmatched_shadow=2)


def test_detection_results_compare_outcome_and_boxes_together() -> None:
    live = detection_result(det(0, 0, 10, 10), det(20, 20, 30, 30))
    cand = detection_result(det(0, 0, 10, 10))
    c = compare(live, "reject", cand, "reject", 0.5)
    assert c.agree
    assert c.boxes == BoxMatch(matched=1, unmatched_live=1, unmatched_shadow=0)


def test_no_detections_on_either_side_is_no_box_at_all() -> None:
    c = compare(detection_result(), "pass", detection_result(det(1, 1, 5, 5)), "reject")
    assert not c.agree
    assert c.boxes == BoxMatch(0, 0, 1)


def test_an_iou_threshold_outside_0_1_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="iou_threshold"):
        match_detections([], [], 1.5)
