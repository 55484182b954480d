"""The drift accumulator: which bins and counts each kind of decision lands in (pure,
no database)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from agent.drift import DriftAccumulator, FrameError, HourCounts, bucket, input_stats
from agent.wire.quality import DRIFT_BINS, MAX_CLASSES, OTHER, DriftHour, bin_index

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
HOUR0 = int(T0 // 3600) * 3600


def add(acc: DriftAccumulator, outputs: dict[str, Any], **fields: Any) -> None:
    values: dict[str, Any] = {
        "model_name": "defects",
        "model_version": "1.0.0",
        "line": "line-1",
        "source": "cam-1",
        "decision_time": T0,
        "outcome": "pass",
        "outputs": outputs,
    }
    values.update(fields)
    acc.add(**values)


def only(acc: DriftAccumulator) -> HourCounts:
    rows = acc.take()
    assert len(rows) == 1, rows
    return next(iter(rows.values()))


def bins(counts: list[int]) -> dict[int, int]:
    return {i: k for i, k in enumerate(counts) if k}


def test_a_classification_counts_its_outcome_top_label_and_score_decile() -> None:
    acc = DriftAccumulator()
    top = {"top_k": [{"label": "scratch", "score": 0.93}, {"label": "ok", "score": 0.05}]}
    add(acc, top, outcome="reject")
    add(acc, {"top_k": [{"label": "ok", "score": 0.41}]}, outcome="pass")
    add(acc, {"top_k": [{"label": "ok", "score": 0.47}]}, outcome="pass")
    row = only(acc)
    assert row.n == 3
    assert row.outcomes == {"reject": 1, "pass": 2}
    assert row.top_class == {"scratch": 1, "ok": 2}
    assert bins(row.hist["score"]) == {9: 1, 4: 2}
    assert set(row.hist) == {"score"}  # no detections, no image


def test_a_detection_counts_boxes_their_areas_and_the_best_box() -> None:
    acc = DriftAccumulator()
    outputs = {
        "count": 3,
        "boxes": [
            {"box": [0, 0, 100, 100], "score": 0.88, "label": "dent"},  # 1/48 of the frame
            {"box": [0, 0, 640, 480], "score": 0.6, "label": "scratch"},  # all of it
            {"box": [10, 10, 11, 11], "score": 0.55, "label": "dent"},  # a pixel
        ],
        "frame": {"width": 640, "height": 480},
    }
    add(acc, outputs, outcome="reject")
    add(acc, {"count": 0, "boxes": [], "frame": {"width": 640, "height": 480}})
    row = only(acc)
    assert row.n == 2
    assert row.top_class == {"dent": 1}  # the best box; none for the empty frame
    assert bins(row.hist["score"]) == {8: 1}
    assert bins(row.hist["detections"]) == {0: 1, 3: 1}
    area = 100 * 100 / (640 * 480)
    assert bins(row.hist["box_area"]) == {
        bin_index("box_area", area): 1,
        len(DRIFT_BINS["box_area"]) - 2: 1,
        0: 1,
    }


def test_box_areas_use_the_frame_array_when_the_outputs_name_no_size() -> None:
    acc = DriftAccumulator(image_stats=False)
    frame = np.zeros((100, 200, 3), np.uint8)
    add(acc, {"count": 1, "boxes": [{"box": [0, 0, 100, 100], "score": 0.9}]}, frame=frame)
    row = only(acc)
    assert bins(row.hist["box_area"]) == {bin_index("box_area", 0.5): 1}
    assert row.top_class == {}  # a box without a label
    assert "brightness" not in row.hist


def test_a_score_model_counts_its_score_and_no_class() -> None:
    acc = DriftAccumulator()
    for score in (0.05, 0.15, 0.95, 1.0):
        add(acc, {"score": score})
    row = only(acc)
    assert row.top_class == {}
    assert bins(row.hist["score"]) == {0: 1, 1: 1, 9: 2}


def test_labels_past_the_limit_are_counted_as_other() -> None:
    acc = DriftAccumulator()
    for i in range(MAX_CLASSES + 10):
        add(acc, {"label": f"class-{i}", "score": 0.5})
    add(acc, {"label": "class-0", "score": 0.5})
    row = only(acc)
    assert len(row.top_class) == MAX_CLASSES + 1
    assert row.top_class[OTHER] == 10
    assert row.top_class["class-0"] == 2
    DriftHour(model_name="m", model_version="1", line="l", source="s", hour=HOUR0,
              n=row.n, top_class=row.top_class, hist=row.hist)  # fmt: skip


def test_merging_keeps_the_label_limit_and_adds_every_bin() -> None:
    a, b = HourCounts(), HourCounts()
    for i in range(MAX_CLASSES):
        a.add_class(f"a{i}")
    b.add_class("new")
    b.add_class("a3", 4)
    a.count("score", 0.5)
    b.count("score", 0.5)
    b.count("contrast", 3.0)
    a.merge(b)
    assert a.top_class[OTHER] == 1
    assert a.top_class["a3"] == 5
    assert "new" not in a.top_class
    assert bins(a.hist["score"]) == {5: 2}
    assert bins(a.hist["contrast"]) == {0: 1}


def test_a_dark_frame_lands_in_the_low_brightness_bins_and_a_bright_one_high() -> None:
    acc = DriftAccumulator()
    rng = np.random.default_rng(7)
    dark = rng.integers(0, 20, (1080, 1920, 3), dtype=np.uint8)
    bright = rng.integers(230, 256, (1080, 1920, 3), dtype=np.uint8)
    add(acc, {"label": "ok", "score": 0.9}, frame=dark, source="dark")
    add(acc, {"label": "ok", "score": 0.9}, frame=bright, source="bright")
    rows = {key[3]: row for key, row in acc.take().items()}
    assert bins(rows["dark"].hist["brightness"]) == {0: 1}  # mean about 9.5 of 255
    assert bins(rows["bright"].hist["brightness"]) == {15: 1}
    for row in rows.values():
        assert sum(row.hist["contrast"]) == 1
        assert sum(row.hist["sharpness"]) == 1


def test_input_statistics_of_flat_sharp_and_gray_frames() -> None:
    flat = input_stats(np.full((480, 640, 3), 128, np.uint8))
    assert flat.brightness == pytest.approx(128, abs=0.5)
    assert flat.contrast == pytest.approx(0, abs=0.5)
    assert flat.sharpness < 0  # log10 of a zero variance (plus 1e-9)
    board = np.kron((np.indices((64, 64)).sum(axis=0) % 2) * 255, np.ones((8, 8)))
    sharp = input_stats(board.astype(np.uint8))  # a gray 512x512 checkerboard
    assert sharp.contrast > 100
    assert sharp.sharpness > 4
    assert input_stats(np.zeros((5, 7, 1), np.uint8)).brightness == 0


@pytest.mark.parametrize(
    "frame",
    [np.zeros((4, 4, 5), np.uint8), np.zeros((4, 4), np.float32), np.zeros((0, 3), np.uint8), "x"],
)
def test_a_frame_that_is_not_an_image_is_refused_naming_what_is_wrong(frame: Any) -> None:
    acc = DriftAccumulator()
    with pytest.raises(FrameError, match="frame"):
        add(acc, {"score": 0.1}, frame=frame)
    assert acc.take() == {}  # nothing counted


def test_decisions_fall_into_buckets_of_the_configured_period() -> None:
    acc = DriftAccumulator(period_s=60)
    for t in (T0, T0 + 39.9, T0 + 40.0, T0 + 3600):
        add(acc, {"score": 0.5}, decision_time=t)
    starts = sorted((key[4], row.n) for key, row in acc.take().items())
    first = int(T0 // 60) * 60
    assert starts == [(first, 2), (first + 60, 1), (first + 3600, 1)]
    assert bucket(T0, 3600) == HOUR0
    with pytest.raises(ValueError, match="not a Unix time"):
        bucket(float("nan"), 60)


def test_outputs_that_are_not_numbers_are_left_out_not_counted_wrong() -> None:
    acc = DriftAccumulator()
    add(acc, {"label": {"nested": 1}, "score": "high"})
    add(acc, {"count": -2, "boxes": "many"})
    add(acc, {"top_k": [{"label": "ok", "score": float("nan")}]})
    row = only(acc)
    assert row.n == 3
    assert row.top_class == {"ok": 1}
    assert "score" not in row.hist


@pytest.mark.parametrize("module", ["agent.drift", "agent.drift.store", "agent.uplink.quality"])
def test_the_drift_modules_import_first_without_a_cycle(module: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
