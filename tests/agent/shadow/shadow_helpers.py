"""Small image classifiers of known behaviour for the shadow tests, and frames for them.

``bright_bundle(threshold)``: class "bright" when the frame's mean (0..1) is above
``threshold``, else "dark" (a softmax over (mean - threshold) x +-20); the bundle's policy
rejects "dark". A live model at 0.5 and a candidate at 0.3 disagree exactly on frames
whose mean lies between the two.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from agent.capture import Frame
from agent.kernel.bundle import Bundle, init_bundle, load_bundle


def bright_model(path: Path, threshold: float) -> Path:
    w = numpy_helper.from_array(np.array([[-20.0, 20.0]] * 3, np.float32) / 3, "w")
    b = numpy_helper.from_array(np.array([20 * threshold, -20 * threshold], np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["m", "w"], ["mw"]),
            helper.make_node("Add", ["mw", "b"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["prob"], axis=1),
        ],
        "bright",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 2])],
        initializer=[w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def bright_bundle(
    out: Path, threshold: float, *, name: str = "bright", version: str = "1.0.0"
) -> Bundle:
    """A bundle of :func:`bright_model` in ``out`` (created; its parent must exist)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    model = bright_model(out.parent / f"{out.name}.onnx", threshold)
    bundle = init_bundle(model, out, name=name, version=version)
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    manifest["postprocess"]["labels"] = ["dark", "bright"]
    manifest["policy"] = {"rules": [{"outcome": "reject", "label": "dark"}], "default": "pass"}
    (bundle.path / "manifest.json").write_text(json.dumps(manifest))
    return load_bundle(bundle.path)


def frame(level: int, seq: int = 0) -> Frame:
    """A flat 48x64 BGR frame of brightness ``level`` (0..255)."""
    image = np.full((48, 64, 3), level, np.uint8)
    return Frame("cam", seq, image, time.perf_counter_ns(), time.time())


def spot_detector_bundle(out: Path, gain: float, *, version: str = "1.0.0") -> Bundle:
    """A heatmap "detector": the map is the frame's luma (channel mean, 0..1) times
    ``gain``; a region above 0.5 is a detection labelled "spot". A candidate with a
    higher gain finds spots the live one does not."""
    out.parent.mkdir(parents=True, exist_ok=True)
    g = numpy_helper.from_array(np.array(gain, np.float32), "g")
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
            helper.make_node("Mul", ["m", "g"], ["map"]),
        ],
        "spots",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("map", TensorProto.FLOAT, [1, 1, 32, 32])],
        initializer=[g],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path = out.parent / f"{out.name}.onnx"
    onnx.save(model, str(path))
    bundle = init_bundle(path, out, name="spots", version=version)
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    manifest["postprocess"] = {
        "kind": "detection",
        "format": "heatmap",
        "threshold": 0.5,
        "labels": ["spot"],
    }
    (bundle.path / "manifest.json").write_text(json.dumps(manifest))
    return load_bundle(bundle.path)
