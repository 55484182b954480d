"""Post-processing: a model's outputs into a :class:`Result` the policy can judge.

:func:`build_postprocessor` turns a manifest's ``postprocess`` section into a function of
``(outputs, frame_hw, input_hw)``. Boxes come back in frame pixels: the runtime resizes
the whole frame to the input (no letterbox), so x scales by frame width over input width
and y by frame height over input height.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from agent.errors import PipelineError
from agent.wire.postprocess import ClassificationPost, DetectionPost, ScorePost

Array = npt.NDArray[Any]
PostprocessSpec = ClassificationPost | ScorePost | DetectionPost
Postprocessor = Callable[[Sequence[Array], tuple[int, int], tuple[int, int]], "Result"]

SUMMARY_BOXES = 20
"""At most this many boxes go into a result's summary."""


@dataclass
class Detection:
    """One detected object: box (x1, y1, x2, y2) in frame pixels, score, label."""

    box: tuple[float, float, float, float]
    score: float
    label: str | None = None


@dataclass
class Result:
    """What a model said about one frame.

    Attributes:
        kind: "classification", "score" or "detection".
        score: the primary score: top-1 probability, the score, or the best detection's
            score (0.0 without detections).
        label: the top-1 class, the score's label, or the best detection's label.
        detections: detections, best first (empty for other kinds).
        summary: a small JSON-able digest for the decision log.
    """

    kind: str
    score: float
    label: str | None
    detections: list[Detection] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


NMS_MATRIX_MAX = 1024
"""Up to this many candidates, NMS computes every pairwise IoU at once (a 4 MB float32
matrix at most) and the greedy pass only reads it; above, it goes box by box."""


def nms(boxes: Array, scores: Array, iou_threshold: float, limit: int) -> list[int]:
    """Greedy non-maximum suppression; indexes of the kept boxes, best score first.

    ``boxes`` is [N, 4] as (x1, y1, x2, y2). A box goes when its IoU with a kept,
    better-scoring box exceeds ``iou_threshold``. At most ``limit`` are kept.
    """
    if len(boxes) == 0 or limit <= 0:
        return []
    order = np.argsort(-scores, kind="stable")
    b = boxes.astype(np.float64)[order]
    areas = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    if len(b) > NMS_MATRIX_MAX:
        return [int(order[i]) for i in _nms_box_by_box(b, areas, iou_threshold, limit)]
    w = np.minimum(b[:, None, 2], b[None, :, 2]) - np.maximum(b[:, None, 0], b[None, :, 0])
    h = np.minimum(b[:, None, 3], b[None, :, 3]) - np.maximum(b[:, None, 1], b[None, :, 1])
    inter = np.clip(w, 0, None) * np.clip(h, 0, None)
    union = areas[:, None] + areas[None, :] - inter
    iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    over = iou > iou_threshold
    removed = np.zeros(len(b), np.bool_)
    keep: list[int] = []
    for i in range(len(b)):  # one vector OR per kept box
        if removed[i]:
            continue
        keep.append(int(order[i]))
        if len(keep) >= limit:
            break
        removed |= over[i]
    return keep


def _nms_box_by_box(b: Array, areas: Array, iou_threshold: float, limit: int) -> list[int]:
    """Greedy NMS over boxes already sorted best first, without a pairwise matrix."""
    order = np.arange(len(b))
    keep: list[int] = []
    while order.size and len(keep) < limit:  # each pass removes at least one index
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        w = np.clip(np.minimum(b[i, 2], b[rest, 2]) - np.maximum(b[i, 0], b[rest, 0]), 0, None)
        h = np.clip(np.minimum(b[i, 3], b[rest, 3]) - np.maximum(b[i, 1], b[rest, 1]), 0, None)
        inter = w * h
        union = areas[i] + areas[rest] - inter
        iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        order = rest[iou <= iou_threshold]
    return keep


def _softmax(x: Array) -> Array:
    e = np.exp(x - np.max(x))
    result: Array = e / np.sum(e)
    return result


class _Builder:
    """Shared checks for one post-processor."""

    def __init__(self, pipeline: str, output: str | None, output_names: Sequence[str]) -> None:
        self.pipeline = pipeline
        if not output_names:
            raise PipelineError(pipeline, "the model has no outputs")
        if output is None:
            self.index = 0
        elif output in output_names:
            self.index = list(output_names).index(output)
        else:
            raise PipelineError(
                pipeline,
                f"postprocess.output: no output {output!r} (outputs: {', '.join(output_names)})",
            )
        self.name = output_names[self.index]
        self.count = len(output_names)

    def output(self, outputs: Sequence[Array]) -> Array:
        if len(outputs) != self.count:
            raise PipelineError(
                self.pipeline, f"expected {self.count} outputs, the model gave {len(outputs)}"
            )
        return np.asarray(outputs[self.index])

    def error(self, arr: Array, wanted: str) -> PipelineError:
        return PipelineError(
            self.pipeline, f"output '{self.name}' has shape {list(arr.shape)}; expected {wanted}"
        )


def _classification(spec: ClassificationPost, b: _Builder) -> Postprocessor:
    def run(outputs: Sequence[Array], _f: tuple[int, int], _i: tuple[int, int]) -> Result:
        arr = b.output(outputs)
        if arr.size == 0 or (arr.ndim > 1 and arr.shape[0] != 1):
            raise b.error(arr, "[1, N] class scores")
        scores = arr.reshape(-1).astype(np.float64)
        labels = spec.labels
        if labels is not None and len(labels) != scores.size:
            raise b.error(arr, f"{len(labels)} classes (postprocess.labels)")
        if spec.softmax:
            scores = _softmax(scores)
        k = min(spec.top_k, scores.size)
        top = np.argsort(-scores, kind="stable")[:k]
        names = [labels[i] if labels else str(i) for i in (int(t) for t in top)]
        values = [float(scores[int(t)]) for t in top]
        entries = [{"label": n, "score": v} for n, v in zip(names, values, strict=True)]
        return Result("classification", values[0], names[0], [], {"top_k": entries})

    return run


def _score(spec: ScorePost, b: _Builder) -> Postprocessor:
    def run(outputs: Sequence[Array], _f: tuple[int, int], _i: tuple[int, int]) -> Result:
        arr = b.output(outputs)
        if spec.index >= arr.size:
            raise b.error(arr, f"at least {spec.index + 1} values (postprocess.index)")
        score = float(arr.reshape(-1)[spec.index])
        return Result("score", score, spec.label, [], {"score": score})

    return run


def _summary(detections: list[Detection]) -> dict[str, Any]:
    return {
        "count": len(detections),
        "boxes": [
            {"box": [round(v, 1) for v in d.box], "score": round(d.score, 4), "label": d.label}
            for d in detections[:SUMMARY_BOXES]
        ],
    }


def _finish(
    spec: DetectionPost, boxes: Array, scores: Array, classes: Array | None, labels: list[str]
) -> Result:
    """Threshold, area filter, NMS (per class), cap; boxes already in frame pixels."""
    keep = scores >= spec.threshold
    if spec.min_area > 0:
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        keep &= area >= spec.min_area
    idx = np.flatnonzero(keep)
    boxes, scores = boxes[idx], scores[idx]
    cls = classes[idx] if classes is not None else np.zeros(len(idx), np.int64)
    # Per-class NMS in one pass: shift each class's boxes apart so classes never overlap.
    span = float(np.ptp(boxes)) + 1.0 if len(boxes) else 0.0
    offset = cls.astype(np.float64)[:, None] * span
    kept = nms(boxes + offset, scores, spec.nms_iou, spec.max_detections)
    detections = []
    for (x1, y1, x2, y2), score, c in zip(
        boxes[kept].tolist(), scores[kept].tolist(), cls[kept].tolist(), strict=True
    ):
        label = labels[c] if 0 <= c < len(labels) else (str(c) if classes is not None else None)
        detections.append(Detection((x1, y1, x2, y2), score, label))
    best = detections[0] if detections else None
    return Result(
        "detection",
        best.score if best else 0.0,
        best.label if best else None,
        detections,
        _summary(detections),
    )


def _boxes(spec: DetectionPost, b: _Builder) -> Postprocessor:
    labels = spec.labels or []

    def run(
        outputs: Sequence[Array], frame_hw: tuple[int, int], input_hw: tuple[int, int]
    ) -> Result:
        arr = b.output(outputs)
        rows = arr[0] if arr.ndim == 3 and arr.shape[0] == 1 else arr
        if rows.ndim != 2 or rows.shape[1] not in (5, 6):
            raise b.error(arr, "[1, N, 5|6] or [N, 5|6] rows (x1, y1, x2, y2, score(, class))")
        rows = rows.astype(np.float64)
        fh, fw = frame_hw
        sx, sy = (fw, fh) if spec.normalized else (fw / input_hw[1], fh / input_hw[0])
        boxes = rows[:, :4] * np.array([sx, sy, sx, sy])
        classes = rows[:, 5].round().astype(np.int64) if rows.shape[1] == 6 else None
        return _finish(spec, boxes, rows[:, 4], classes, labels)

    return run


def _heatmap(spec: DetectionPost, b: _Builder) -> Postprocessor:
    labels = spec.labels or []

    def run(outputs: Sequence[Array], frame_hw: tuple[int, int], _i: tuple[int, int]) -> Result:
        arr = b.output(outputs)
        if not (arr.ndim == 4 and arr.shape[:2] == (1, 1)) and not (
            arr.ndim == 3 and arr.shape[0] == 1
        ):
            raise b.error(arr, "a probability map [1, 1, H, W] or [1, H, W]")
        mh, mw = int(arr.shape[-2]), int(arr.shape[-1])
        prob = arr.reshape(mh, mw).astype(np.float32)
        mask = (prob > spec.threshold).astype(np.uint8)
        contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        found: list[tuple[float, float, float, float, float]] = []
        region = np.zeros_like(mask)
        for contour in contours:  # bounded by the map's size
            x, y, w, h = cv2.boundingRect(contour)
            region[y : y + h, x : x + w] = 0
            cv2.drawContours(region, [contour], 0, 1, thickness=-1)
            inside = region[y : y + h, x : x + w].astype(bool)
            score = float(prob[y : y + h, x : x + w][inside].mean())
            grow = 0.0
            if spec.unclip_ratio > 0:
                area = float(cv2.contourArea(contour))
                length = float(cv2.arcLength(contour, closed=True))
                grow = area * spec.unclip_ratio / length if length > 0 else 0.0
            found.append(
                (
                    max(0.0, x - grow),
                    max(0.0, y - grow),
                    min(float(mw), x + w + grow),
                    min(float(mh), y + h + grow),
                    score,
                )
            )
        data = np.array(found, np.float64).reshape(-1, 5)
        fh, fw = frame_hw
        scale = np.array([fw / mw, fh / mh, fw / mw, fh / mh])
        return _finish(spec, data[:, :4] * scale, data[:, 4], None, labels)

    return run


def build_postprocessor(
    spec: PostprocessSpec, output_names: Sequence[str], *, pipeline: str = "postprocess"
) -> Postprocessor:
    """The post-processor for ``spec`` over a model with outputs ``output_names``.

    The returned function takes ``(outputs, frame_hw, input_hw)``: the model's outputs in
    order, the frame's (height, width) and the model input's (height, width).

    Raises:
        PipelineError: here when the named output does not exist; from the function when
            an output's shape does not fit the spec.
    """
    b = _Builder(pipeline, spec.output, output_names)
    if isinstance(spec, ClassificationPost):
        return _classification(spec, b)
    if isinstance(spec, ScorePost):
        return _score(spec, b)
    if spec.format == "boxes":
        return _boxes(spec, b)
    return _heatmap(spec, b)


__all__ = ["Detection", "Postprocessor", "Result", "build_postprocessor", "nms"]
