"""Bundles for the installer tests, built from small ONNX models at test time.

- :func:`make_bundle`: the per-channel mean of an 8x8 RGB image; ``pad`` bytes of doc
  string make the model file as large as a test needs (several copy chunks) and give
  every release its own digest.
- :func:`make_bright_fails_bundle`: runs on a dark frame (the self-benchmark's frame of
  zeros) and fails in the runtime on a bright one: a Reshape whose target shape grows
  by one when the image's maximum is over 0.5.
- :func:`make_bright_hangs_bundle`: runs on a dark frame and, on a bright one, loops
  :data:`HANG_TRIPS` times before it answers (minutes): no inference completes and none
  fails within a test's health window.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from agent.kernel.bundle import Bundle, init_bundle, load_bundle

OPSET = 17
IR_VERSION = 9
PROFILE = "x86-gateway"


def _save(graph: onnx.GraphProto, path: Path, doc: str) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    model.doc_string = doc
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _finish(
    model: Path, out: Path, name: str, version: str, release: int, budget_ms: float, **extra: object
) -> Bundle:
    bundle = init_bundle(model, out, name=name, version=version)
    path = bundle.path / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(release=release, latency_budget_ms=budget_ms, **extra)
    path.write_text(json.dumps(manifest, indent=2))
    model.unlink()
    return load_bundle(bundle.path)


def make_bundle(
    root: Path,
    *,
    name: str = "cls",
    version: str = "1.0.0",
    release: int = 1,
    budget_ms: float = 1000.0,
    pad: int = 0,
    **extra: object,
) -> Bundle:
    """An image bundle in ``root/<name>-<release>``; its digest differs per release."""
    work = Path(tempfile.mkdtemp(prefix=f"{name}-{release}-", dir=root))
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)],
        "channel_mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
    )
    doc = f"{name} {version} release {release} " + "p" * pad
    model = _save(graph, work / f"{name}.onnx", doc)
    return _finish(model, work / "bundle", name, version, release, budget_ms, **extra)


def make_bright_fails_bundle(
    root: Path, *, name: str = "cls", version: str = "2.0.0", release: int = 2
) -> Bundle:
    """Runs on dark frames; every bright frame fails at run time (see module doc)."""
    work = Path(tempfile.mkdtemp(prefix="bright-fails-", dir=root))
    consts = [
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array(np.array([1, 192], np.int64), "base"),
        numpy_helper.from_array(np.array([0, 1], np.int64), "grow"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
            helper.make_node("Greater", ["m", "half"], ["bright"]),
            helper.make_node("Cast", ["bright"], ["flag"], to=TensorProto.INT64),
            helper.make_node("Mul", ["flag", "grow"], ["extra"]),
            helper.make_node("Add", ["base", "extra"], ["shape"]),
            helper.make_node("Reshape", ["x", "shape"], ["y"]),
        ],
        "bright_fails",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 192])],
        consts,
    )
    model = _save(graph, work / f"{name}.onnx", f"bright fails {release}")
    return _finish(model, work / "bundle", name, version, release, 1000.0)


HANG_TRIPS = 10**9
"""Loop trips of :func:`make_bright_hangs_bundle` on a bright frame (about 2 µs each)."""


def make_bright_hangs_bundle(
    root: Path, *, name: str = "cls", version: str = "2.0.0", release: int = 2
) -> Bundle:
    """Runs on dark frames; every bright frame keeps a worker busy for minutes."""
    work = Path(tempfile.mkdtemp(prefix="bright-hangs-", dir=root))
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "one"], ["v_out"]),
        ],
        "spin",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, []),
        ],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    consts = [
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array(np.array(HANG_TRIPS, np.int64), "trips_if_bright"),
        numpy_helper.from_array(np.array(True), "true"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
            helper.make_node("Greater", ["m", "half"], ["bright"]),
            helper.make_node("Cast", ["bright"], ["flag"], to=TensorProto.INT64),
            helper.make_node("Mul", ["flag", "trips_if_bright"], ["trips"]),
            helper.make_node("Loop", ["trips", "true", "zero"], ["v"], body=body),
            helper.make_node("ReduceMean", ["x"], ["mean"], axes=[2, 3], keepdims=0),
            helper.make_node("Mul", ["v", "zero"], ["nil"]),
            helper.make_node("Add", ["mean", "nil"], ["y"]),
        ],
        "bright_hangs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        consts,
    )
    model = _save(graph, work / f"{name}.onnx", f"bright hangs {release}")
    return _finish(model, work / "bundle", name, version, release, 1000.0)


def slot_files(state_dir: Path, name: str, slot: str) -> list[str]:
    """Every file under a slot (hidden temp files included), relative, sorted."""
    d = state_dir / "bundles" / name / f"slot-{slot}"
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []


def temp_files(state_dir: Path) -> list[str]:
    """Temp files anywhere under the installer's directory."""
    return sorted(str(p) for p in (state_dir / "bundles").rglob(".*.tmp"))
