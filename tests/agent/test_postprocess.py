"""Post-processing: classification, score, boxes with NMS, heatmaps (synthetic and the
real PP-OCRv4 text detector run through a bundle in the worker pool)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest

from agent.errors import PipelineError
from agent.kernel.bundle import init_bundle, load_bundle
from agent.pipeline.postprocess import SUMMARY_BOXES, Detection, build_postprocessor, nms
from agent.wire.manifest import (
    ClassificationPost,
    DetectionPost,
    Preprocess,
    ScorePost,
    dump_manifest,
)
from runtime import PoolConfig, WorkerPool

F32 = np.float32


def cls_spec(**kw: object) -> ClassificationPost:
    return ClassificationPost.model_validate({"kind": "classification", **kw})


def det_spec(**kw: object) -> DetectionPost:
    return DetectionPost.model_validate({"kind": "detection", **kw})


def test_classification_top_k_with_softmax_and_labels() -> None:
    spec = cls_spec(top_k=3, softmax=True, labels=["a", "b", "c", "d"])
    post = build_postprocessor(spec, ["logits"])
    logits = np.array([[2.0, 1.0, 0.1, 3.0]], F32)
    result = post([logits], (480, 640), (224, 224))
    probs = np.exp(logits[0].astype(np.float64)) / np.exp(logits[0].astype(np.float64)).sum()
    assert result.kind == "classification"
    assert result.label == "d"
    assert result.score == pytest.approx(probs[3])
    assert [e["label"] for e in result.summary["top_k"]] == ["d", "a", "b"]
    assert [e["score"] for e in result.summary["top_k"]] == pytest.approx(
        [probs[3], probs[0], probs[1]]
    )
    assert result.detections == []
    json.dumps(result.summary)


def test_classification_without_labels_uses_class_indexes_and_caps_top_k() -> None:
    post = build_postprocessor(cls_spec(top_k=5), ["probs"])
    result = post([np.array([[0.1, 0.7, 0.2]], F32)], (10, 10), (10, 10))
    assert [e["label"] for e in result.summary["top_k"]] == ["1", "2", "0"]
    assert result.score == pytest.approx(0.7)
    assert result.label == "1"


def test_classification_labels_that_do_not_fit_the_output_fail_at_call() -> None:
    post = build_postprocessor(cls_spec(labels=["a", "b", "c"]), ["probs"])
    with pytest.raises(PipelineError, match=r"shape \[1, 4\]; expected 3 classes"):
        post([np.zeros((1, 4), F32)], (10, 10), (10, 10))
    with pytest.raises(PipelineError, match=r"shape \[2, 3\]"):
        post([np.zeros((2, 3), F32)], (10, 10), (10, 10))


def test_score_reads_the_flat_index_of_the_named_output() -> None:
    spec = ScorePost(kind="score", output="defect_map", index=4, label="defect")
    post = build_postprocessor(spec, ["logits", "defect_map"])
    second = np.arange(6, dtype=F32).reshape(1, 2, 3) / 10
    result = post([np.zeros((1, 4), F32), second], (10, 10), (10, 10))
    assert result.kind == "score"
    assert result.score == pytest.approx(0.4)
    assert result.label == "defect"
    assert result.summary == {"score": pytest.approx(0.4)}
    with pytest.raises(PipelineError, match="expected 2 outputs"):
        post([second], (10, 10), (10, 10))
    with pytest.raises(PipelineError, match="at least 5 values"):
        post([np.zeros((1, 4), F32), np.zeros((1, 2), F32)], (10, 10), (10, 10))


def test_unknown_output_name_fails_when_building() -> None:
    spec = ScorePost(kind="score", output="nope")
    with pytest.raises(PipelineError) as info:
        build_postprocessor(spec, ["a", "b"], pipeline="line-3")
    assert info.value.pipeline == "line-3"
    assert "postprocess.output: no output 'nope' (outputs: a, b)" in info.value.reason


def test_nms_keeps_the_best_of_overlapping_boxes() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [5, 0, 15, 10]], F32)
    scores = np.array([0.9, 0.8, 0.7], F32)
    # IoU(0, 1) = 90/110, IoU(0, 2) = 50/150, IoU(1, 2) = 60/140.
    assert nms(boxes, scores, 0.5, 100) == [0, 2]
    assert nms(boxes, scores, 0.85, 100) == [0, 1, 2]
    assert nms(boxes, scores, 0.3, 100) == [0]
    assert nms(boxes, scores, 0.85, 2) == [0, 1]
    assert nms(boxes[:0], scores[:0], 0.5, 10) == []


BOX_ROWS = np.array(
    [
        [10, 10, 50, 50, 0.9, 0],  # A
        [12, 12, 52, 52, 0.8, 0],  # B: overlaps A, same class -> suppressed
        [60, 60, 90, 90, 0.7, 0],  # C: apart -> kept
        [11, 11, 51, 51, 0.85, 1],  # D: overlaps A, other class -> kept
        [70, 10, 90, 30, 0.3, 0],  # E: below threshold
    ],
    F32,
)


def test_boxes_with_nms_give_exact_survivors_in_frame_pixels() -> None:
    post = build_postprocessor(det_spec(format="boxes", labels=["cat", "dog"]), ["dets"])
    # input 100x100, frame 200 high x 300 wide: x * 3, y * 2
    result = post([BOX_ROWS[None]], (200, 300), (100, 100))
    assert [(d.box, d.score, d.label) for d in result.detections] == [
        ((30.0, 20.0, 150.0, 100.0), pytest.approx(0.9), "cat"),
        ((33.0, 22.0, 153.0, 102.0), pytest.approx(0.85), "dog"),
        ((180.0, 120.0, 270.0, 180.0), pytest.approx(0.7), "cat"),
    ]
    assert result.kind == "detection"
    assert (result.score, result.label) == (pytest.approx(0.9), "cat")
    assert result.summary["count"] == 3
    assert result.summary["boxes"][0] == {
        "box": [30.0, 20.0, 150.0, 100.0],
        "score": 0.9,
        "label": "cat",
    }
    json.dumps(result.summary)


def test_boxes_max_detections_min_area_and_normalized() -> None:
    capped = build_postprocessor(det_spec(format="boxes", max_detections=2), ["dets"])
    got = capped([BOX_ROWS], (200, 300), (100, 100))
    assert [d.score for d in got.detections] == pytest.approx([0.9, 0.85])
    assert [d.label for d in got.detections] == ["0", "1"]
    # C is 90 x 60 = 5400 frame pixels, A and D 9600.
    big = build_postprocessor(det_spec(format="boxes", min_area=6000), ["dets"])
    assert [d.score for d in big([BOX_ROWS], (200, 300), (100, 100)).detections] == pytest.approx(
        [0.9, 0.85]
    )
    norm = build_postprocessor(det_spec(format="boxes", normalized=True), ["dets"])
    rows = np.array([[0.1, 0.2, 0.5, 0.6, 0.95]], F32)
    (det,) = norm([rows], (200, 300), (100, 100)).detections
    assert det == Detection(pytest.approx((30.0, 40.0, 150.0, 120.0)), pytest.approx(0.95), None)


def test_boxes_with_wrong_columns_fail_at_call() -> None:
    post = build_postprocessor(det_spec(format="boxes"), ["dets"])
    with pytest.raises(PipelineError, match=r"shape \[1, 10, 4\]"):
        post([np.zeros((1, 10, 4), F32)], (10, 10), (10, 10))


def test_summary_holds_at_most_twenty_boxes() -> None:
    rows = np.array([[i * 10, 0, i * 10 + 5, 5, 0.9 - i * 0.01] for i in range(30)], F32)
    result = build_postprocessor(det_spec(format="boxes"), ["dets"])([rows], (10, 400), (10, 400))
    assert len(result.detections) == 30
    assert result.summary["count"] == 30
    assert len(result.summary["boxes"]) == SUMMARY_BOXES


def two_blobs() -> np.ndarray:
    prob = np.full((100, 200), 0.05, F32)
    prob[10:30, 20:60] = 0.9
    prob[60:90, 120:180] = 0.7
    return prob


def test_heatmap_with_two_blobs_gives_two_boxes_in_frame_pixels() -> None:
    post = build_postprocessor(det_spec(format="heatmap", threshold=0.5, labels=["text"]), ["map"])
    result = post([two_blobs()[None, None]], (200, 400), (100, 200))
    assert [(d.box, d.score, d.label) for d in result.detections] == [
        ((40.0, 20.0, 120.0, 60.0), pytest.approx(0.9), "text"),
        ((240.0, 120.0, 360.0, 180.0), pytest.approx(0.7), "text"),
    ]
    # [1, H, W] maps work the same; the frame scale comes from the map's own size.
    same = post([two_blobs()[None]], (200, 400), (400, 800))
    assert [d.box for d in same.detections] == [d.box for d in result.detections]


def test_heatmap_threshold_min_area_and_unclip() -> None:
    high = build_postprocessor(det_spec(format="heatmap", threshold=0.8), ["map"])
    assert len(high([two_blobs()[None, None]], (100, 200), (100, 200)).detections) == 1
    small = build_postprocessor(det_spec(format="heatmap", min_area=1000), ["map"])
    # 40 x 20 = 800 and 60 x 30 = 1800 frame pixels at scale 1
    (kept,) = small([two_blobs()[None, None]], (100, 200), (100, 200)).detections
    assert kept.score == pytest.approx(0.7)
    grown = build_postprocessor(det_spec(format="heatmap", unclip_ratio=1.5), ["map"])
    first = grown([two_blobs()[None, None]], (100, 200), (100, 200)).detections[0]
    # The 40 x 20 blob's contour (pixel centres) is 39 x 19: grows by 741 * 1.5 / 116.
    grow = 741 * 1.5 / 116
    assert first.box == pytest.approx((20 - grow, 10 - grow, 60 + grow, 30 + grow))


def test_empty_heatmap_gives_no_detections_and_score_zero() -> None:
    post = build_postprocessor(det_spec(format="heatmap"), ["map"])
    result = post([np.zeros((1, 1, 32, 32), F32)], (64, 64), (32, 32))
    assert (result.score, result.label, result.detections) == (0.0, None, [])
    assert result.summary == {"count": 0, "boxes": []}
    with pytest.raises(PipelineError, match="probability map"):
        post([np.zeros((1, 2, 32, 32), F32)], (64, 64), (32, 32))


def text_image() -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """Black text on white, 480 x 640, and the box of its ink (x1, y1, x2, y2)."""
    image = np.full((480, 640, 3), 255, np.uint8)
    font = cv2.FONT_HERSHEY_SIMPLEX
    cv2.putText(image, "EDGEFLEET", (120, 260), font, 2.0, (0, 0, 0), 5, cv2.LINE_AA)
    ys, xs = np.nonzero(image[:, :, 0] < 128)
    return image, (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)


def test_real_text_detector_finds_drawn_text_through_a_bundle_and_the_pool(
    tmp_path: Path, real_model: Callable[[str], str]
) -> None:
    out = tmp_path / "det"
    init_bundle(Path(real_model("ppocr_v4_det.onnx")), out, input_shape=(1, 3, 640, 640))
    bundle = load_bundle(out)
    # What a user edits after `bundle init`: PP-OCR's normalisation and DB settings.
    manifest = bundle.manifest.model_copy(
        update={
            "preprocess": Preprocess(
                width=640,
                height=640,
                color="bgr",
                mean=[0.485, 0.456, 0.406],
                std=[0.229, 0.224, 0.225],
            ),
            "postprocess": det_spec(
                format="heatmap", output="sigmoid_0.tmp_0", threshold=0.3, unclip_ratio=1.5
            ),
        }
    )
    dump_manifest(manifest, out)
    bundle = load_bundle(out)
    image, (tx1, ty1, tx2, ty2) = text_image()
    with WorkerPool(
        [bundle.model_config()], PoolConfig(workers=1, pin=False, heartbeat_timeout_s=30)
    ) as pool:
        names = [o.name for o in pool.info(bundle.manifest.name).outputs]
        outputs = pool.infer(bundle.manifest.name, frame=image, timeout_s=60)
    post = build_postprocessor(bundle.manifest.postprocess, names)
    result = post(outputs, image.shape[:2], (640, 640))
    assert result.detections, result.summary
    covering = [
        d
        for d in result.detections
        if d.box[0] <= tx1 + 8
        and d.box[1] <= ty1 + 8
        and d.box[2] >= tx2 - 8
        and d.box[3] >= ty2 - 8
    ]
    assert covering, (result.summary, (tx1, ty1, tx2, ty2))
    # ... and no wider than the text plus a margin: the box is about the text.
    x1, y1, x2, y2 = covering[0].box
    assert x1 > tx1 - 40
    assert y1 > ty1 - 40
    assert x2 < tx2 + 40
    assert y2 < ty2 + 40
    assert result.score > 0.5
