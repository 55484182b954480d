"""The LiteRT backend against a real interpreter and the generated tiny classifier.

The model in ``tests/data`` is built by ``scripts/make_tiny_tflite.py`` from seeded
weights; the tests import that script's weights and compute the same network in NumPy,
so a wrong result from the backend (or a wrong model from the script) fails here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from runtime.backends import available_backends, open_model
from runtime.backends.base import BackendOptions
from runtime.backends.litert import LiteRTBackend
from runtime.errors import ModelLoadError

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "make_tiny_tflite.py"
MODEL = REPO / "tests" / "data" / "tiny_classifier.tflite"
MODEL_UINT8 = REPO / "tests" / "data" / "tiny_classifier_uint8.tflite"


@pytest.fixture(scope="module")
def maker() -> ModuleType:
    """The generator script, imported from its file (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("make_tiny_tflite", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def weights(maker: ModuleType) -> dict[str, np.ndarray]:
    return maker.make_weights()  # type: ignore[no-any-return]


def reference_scores(w: dict[str, Any], image: np.ndarray) -> np.ndarray:
    """The classifier in NumPy: conv 3x3 SAME + ReLU, mean over H, W, dense, softmax."""
    padded = np.pad(image.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    # windows: [n, y, x, c, i, j]; filter is OHWI: [o, i, j, c]
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))
    conv = np.einsum("nyxcij,oijc->nyxo", windows, w["conv/filter"]) + w["conv/bias"]
    pooled = np.maximum(conv, 0.0).mean(axis=(1, 2))
    logits = pooled @ w["fc/weights"].T + w["fc/bias"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)  # type: ignore[no-any-return]


def images(batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, 16, 16, 3), dtype=np.float32)


@pytest.fixture
def backend() -> Iterator[LiteRTBackend]:
    b = LiteRTBackend(str(MODEL), BackendOptions(threads=1))
    yield b
    b.close()


def test_generated_model_loads_with_specs_read_from_the_file(backend: LiteRTBackend) -> None:
    assert [(s.name, s.shape, s.dtype) for s in backend.inputs] == [
        ("image", (1, 16, 16, 3), np.dtype(np.float32))
    ]
    assert [(s.name, s.shape, s.dtype) for s in backend.outputs] == [
        ("scores", (1, 4), np.dtype(np.float32))
    ]
    assert backend.key == "litert"
    assert backend.active_providers == ["xnnpack", "cpu"]


def test_uint8_variant_declares_a_uint8_image_input() -> None:
    b = LiteRTBackend(str(MODEL_UINT8), BackendOptions())
    assert [(s.name, s.shape, s.dtype) for s in b.inputs] == [
        ("image", (1, 16, 16, 3), np.dtype(np.uint8))
    ]
    assert [(s.name, s.shape, s.dtype) for s in b.outputs] == [
        ("scores", (1, 4), np.dtype(np.float32))
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_run_matches_a_numpy_reference_of_the_same_network(
    backend: LiteRTBackend, weights: dict[str, np.ndarray], seed: int
) -> None:
    image = images(1, seed)
    (scores,) = backend.run([image])
    expected = reference_scores(weights, image)
    assert scores.dtype == np.float32
    assert scores.shape == (1, 4)
    # Not a saturated softmax: the comparison below must see the weights' effect.
    assert expected.max() < 0.99
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-6)


def test_uint8_variant_dequantizes_the_image_by_one_over_255(
    weights: dict[str, np.ndarray],
) -> None:
    b = LiteRTBackend(str(MODEL_UINT8), BackendOptions())
    pixels = np.random.default_rng(7).integers(0, 256, (1, 16, 16, 3), dtype=np.uint8)
    (scores,) = b.run([pixels])
    expected = reference_scores(weights, pixels.astype(np.float32) / np.float32(255.0))
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-6)


def test_run_bound_writes_into_the_bound_arrays_and_matches_run(backend: LiteRTBackend) -> None:
    backend.prepare({"image": (1, 16, 16, 3)})
    image = images(1, 3)
    out = np.full((1, 4), np.nan, dtype=np.float32)
    address = out.ctypes.data
    binding = backend.bind([image], [out])

    backend.run_bound(binding)
    np.testing.assert_array_equal(out, backend.run([image])[0])
    assert out.ctypes.data == address

    # The binding reads the caller's input array afresh on every run (it is the slot
    # the next frame lands in), and many runs in a row must not trip LiteRT's guard
    # against numpy views held across invoke().
    for seed in (4, 5, 6):
        image[...] = images(1, seed)
        backend.run_bound(binding)
        np.testing.assert_array_equal(out, backend.run([image.copy()])[0])
    assert out.ctypes.data == address


def test_run_output_is_a_copy_not_a_view_of_interpreter_memory(backend: LiteRTBackend) -> None:
    (first,) = backend.run([images(1, 8)])
    kept = first.copy()
    backend.run([images(1, 9)])
    np.testing.assert_array_equal(first, kept)


def test_bind_rejects_arrays_that_do_not_fit_the_model(backend: LiteRTBackend) -> None:
    out = np.empty((1, 4), np.float32)
    with pytest.raises(ValueError, match="image"):
        backend.bind([np.zeros((1, 16, 16, 3), np.float64)], [out])
    with pytest.raises(ValueError, match="scores"):
        backend.bind([images(1, 0)], [np.empty((4,), np.float32)])
    with pytest.raises(ValueError, match="C-contiguous"):
        backend.bind([np.asfortranarray(np.zeros((1, 16, 16, 3), np.float32))], [out])


def test_dynamic_batch_is_fixed_by_prepare(
    maker: ModuleType, weights: dict[str, np.ndarray], tmp_path: Path
) -> None:
    path = tmp_path / "dynamic.tflite"
    path.write_bytes(maker.build_model(weights, dynamic_batch=True))
    b = LiteRTBackend(str(path), BackendOptions())
    assert b.inputs[0].shape == (None, 16, 16, 3)
    assert b.outputs[0].shape == (None, 4)

    b.prepare({"image": (3, 16, 16, 3)})
    assert b.inputs[0].shape == (3, 16, 16, 3)
    assert b.outputs[0].shape == (3, 4)
    batch = images(3, 11)
    out = np.empty((3, 4), np.float32)
    b.run_bound(b.bind([batch], [out]))
    np.testing.assert_allclose(out, reference_scores(weights, batch), rtol=1e-4, atol=1e-6)


def test_prepare_rejects_a_shape_that_contradicts_the_model(backend: LiteRTBackend) -> None:
    with pytest.raises(ModelLoadError, match="input 'image'") as info:
        backend.prepare({"image": (1, 8, 8, 3)})
    assert info.value.path == str(MODEL)
    with pytest.raises(ModelLoadError, match="no input named picture"):
        backend.prepare({"picture": (1, 16, 16, 3)})


def test_corrupt_model_file_is_rejected_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.tflite"
    path.write_bytes(np.random.default_rng(0).bytes(2048))
    with pytest.raises(ModelLoadError) as info:
        LiteRTBackend(str(path), BackendOptions())
    assert info.value.path == str(path)
    assert str(path) in str(info.value)
    assert info.value.reason  # LiteRT's own words, on one line
    assert "\n" not in info.value.reason


def test_missing_model_file_is_rejected_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.tflite"
    with pytest.raises(ModelLoadError) as info:
        LiteRTBackend(str(path), BackendOptions())
    assert info.value.path == str(path)


def test_model_with_an_unresolved_custom_op_is_rejected_naming_the_op(tmp_path: Path) -> None:
    import flatbuffers
    from ai_edge_litert import schema_py_generated as tfl

    model = tfl.ModelT.InitFromPackedBuf(bytearray(MODEL.read_bytes()), 0)
    conv = model.subgraphs[0].operators[0]
    code = model.operatorCodes[conv.opcodeIndex]
    code.builtinCode = code.deprecatedBuiltinCode = tfl.BuiltinOperator.CUSTOM
    code.customCode = "EdgefleetNoSuchOp"
    conv.builtinOptionsType, conv.builtinOptions = tfl.BuiltinOptions.NONE, None
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path = tmp_path / "custom_op.tflite"
    path.write_bytes(bytes(builder.Output()))

    with pytest.raises(ModelLoadError, match="EdgefleetNoSuchOp") as info:
        LiteRTBackend(str(path), BackendOptions())
    assert info.value.path == str(path)


def test_unusable_delegates_fall_back_to_the_cpu_with_a_warning(
    caplog: pytest.LogCaptureFixture, weights: dict[str, np.ndarray]
) -> None:
    caplog.set_level(logging.WARNING, logger="runtime.backends.litert")
    b = LiteRTBackend(str(MODEL), BackendOptions(delegates=("edgetpu", "quantum", "xnnpack")))
    assert b.active_providers == ["xnnpack", "cpu"]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "edgetpu" in warned
    assert "quantum" in warned
    image = images(1, 12)
    np.testing.assert_allclose(
        b.run([image])[0], reference_scores(weights, image), rtol=1e-4, atol=1e-6
    )


def test_registry_lists_litert_as_available_and_opens_tflite_files() -> None:
    infos = {i.key: i for i in available_backends()}
    assert infos["litert"].available, infos["litert"].reason
    assert isinstance(open_model(str(MODEL), BackendOptions()), LiteRTBackend)


def test_committed_models_are_what_the_script_builds(tmp_path: Path) -> None:
    out = tmp_path / "tiny_classifier.tflite"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for committed in (MODEL, MODEL_UINT8):
        rebuilt = tmp_path / committed.name
        assert rebuilt.read_bytes() == committed.read_bytes(), committed.name
        assert hashlib.sha256(rebuilt.read_bytes()).hexdigest() in result.stdout


def test_litert_is_reported_unavailable_when_neither_package_imports() -> None:
    probe = (
        "import json, sys\n"
        "sys.modules['ai_edge_litert'] = None\n"
        "sys.modules['tflite_runtime'] = None\n"
        "from runtime.backends import available_backends\n"
        "print(json.dumps({i.key: [i.available, i.reason] for i in available_backends()}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    available, reason = report["litert"]
    assert available is False
    assert "ai-edge-litert" in reason
    assert "tflite-runtime" in reason
    assert reason.count("ModuleNotFoundError") == 2  # both failures, each in its own words
    assert report["onnx"][0] is True  # one missing backend does not take the others down
