"""NMS with the pairwise IoU matrix keeps exactly what the box-by-box pass keeps."""

from __future__ import annotations

import numpy as np
import pytest

from agent.pipeline import postprocess
from agent.pipeline.postprocess import nms


def random_boxes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 200, (n, 2))
    wh = rng.uniform(-5, 60, (n, 2))  # some boxes are empty or inside out
    scores = rng.choice(np.linspace(0, 1, 17), n)  # ties on purpose
    return np.hstack([xy, xy + wh]), scores


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("threshold", "limit"), [(0.5, 100), (0.3, 5), (0.0, 100), (0.9, 1)])
def test_matrix_nms_keeps_what_box_by_box_nms_keeps(
    seed: int, threshold: float, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    boxes, scores = random_boxes(300, seed)
    matrix = nms(boxes, scores, threshold, limit)
    monkeypatch.setattr(postprocess, "NMS_MATRIX_MAX", 0)
    assert nms(boxes, scores, threshold, limit) == matrix
    assert len(matrix) <= limit


def test_nms_over_the_matrix_bound_still_suppresses() -> None:
    boxes = np.tile(np.array([[0.0, 0.0, 10.0, 10.0]]), (postprocess.NMS_MATRIX_MAX + 5, 1))
    scores = np.linspace(0.1, 0.9, len(boxes))
    assert nms(boxes, scores, 0.5, 100) == [len(boxes) - 1]


def test_zero_limit_keeps_nothing() -> None:
    boxes, scores = random_boxes(10, 1)
    assert nms(boxes, scores, 0.5, 0) == []
