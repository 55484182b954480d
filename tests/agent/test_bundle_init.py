"""Bundles on disk: `init_bundle` and `fleetctl bundle init` on real models, loading with
file verification, the runtime config a bundle gives, and the bundle digest."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from agent.kernel.bundle import Bundle, init_bundle, load_bundle
from agent.kernel.errors import BundleError
from agent.wire.manifest import MANIFEST_NAME, ClassificationPost, DetectionPost, ScorePost
from runtime import PoolConfig, WorkerPool
from runtime.backends import BackendOptions, open_model

REPO = Path(__file__).resolve().parents[2]
FLEETCTL = Path(sys.executable).parent / "fleetctl"
TINY_TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"
CLS_SHAPE = (1, 3, 48, 192)


def frame(h: int = 120, w: int = 300, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def reference_input(bundle: Bundle, image: np.ndarray) -> np.ndarray:
    """The model input computed here from the manifest, independently of the runtime."""
    pre = bundle.manifest.preprocess
    resized = cv2.resize(image, (pre.width, pre.height), interpolation=cv2.INTER_LINEAR)
    assert pre.color == "rgb"
    rgb = resized[:, :, ::-1].astype(np.float32)
    x = (rgb * np.float32(pre.scale) - np.float32(pre.mean)) / np.float32(pre.std)
    x = x.transpose(2, 0, 1) if pre.layout == "nchw" else x
    return np.ascontiguousarray(x[None], dtype=np.dtype(pre.dtype))


def bare_outputs(bundle: Bundle, tensor: np.ndarray) -> list[np.ndarray]:
    backend = open_model(str(bundle.model_file()), BackendOptions())
    try:
        backend.prepare({bundle.manifest.input.name: tensor.shape})
        return [np.array(o) for o in backend.run([tensor])]
    finally:
        backend.close()


def pool_outputs(bundle: Bundle, image: np.ndarray) -> list[np.ndarray]:
    with WorkerPool(
        [bundle.model_config()], PoolConfig(workers=1, pin=False, heartbeat_timeout_s=30)
    ) as pool:
        return pool.infer(bundle.manifest.name, frame=image, timeout_s=30)


def two_input_model(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        "two_inputs",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 3, 8, 8]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3, 8, 8]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def fleetctl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert FLEETCTL.exists(), f"{FLEETCTL} missing: run .venv/bin/pip install -e ."
    return subprocess.run(
        [str(FLEETCTL), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def cls_bundle(
    tmp_path_factory: pytest.TempPathFactory, real_model: Callable[[str], str]
) -> Bundle:
    out = tmp_path_factory.mktemp("cls") / "bundle"
    return init_bundle(
        Path(real_model("ppocr_mobile_v2_cls.onnx")),
        out,
        name="text-direction",
        version="1.0.0",
        input_shape=CLS_SHAPE,
    )


def test_init_on_onnx_classifier_reads_input_and_guesses_classification(
    cls_bundle: Bundle, real_model: Callable[[str], str]
) -> None:
    m = cls_bundle.manifest
    assert (m.name, m.version, m.release) == ("text-direction", "1.0.0", 1)
    assert list(m.models) == ["onnx"]
    assert m.models["onnx"].file == "ppocr_mobile_v2_cls.onnx"
    assert m.models["onnx"].size == Path(real_model("ppocr_mobile_v2_cls.onnx")).stat().st_size
    assert (m.input.name, m.input.shape, m.input.dtype) == ("x", [1, 3, 48, 192], "float32")
    pre = m.preprocess
    assert (pre.width, pre.height, pre.layout, pre.color) == (192, 48, "nchw", "rgb")
    assert isinstance(m.postprocess, ClassificationPost)
    assert m.postprocess.top_k == 2
    assert m.postprocess.output == "save_infer_model/scale_0.tmp_1"
    assert m.policy == {"rules": [], "default": "pass"}
    assert m.latency_budget_ms == 100.0
    assert sorted(p.name for p in cls_bundle.path.iterdir()) == [
        MANIFEST_NAME,
        "ppocr_mobile_v2_cls.onnx",
    ]
    # readable by the services' own users (a bundle is published, not secret)
    assert {p.name: p.stat().st_mode & 0o777 for p in cls_bundle.path.iterdir()} == {
        MANIFEST_NAME: 0o644,
        "ppocr_mobile_v2_cls.onnx": 0o644,
    }


def test_onnx_bundle_runs_in_the_pool_like_the_bare_backend(cls_bundle: Bundle) -> None:
    loaded = load_bundle(cls_bundle.path)
    assert loaded.digest == cls_bundle.digest
    config = loaded.model_config()
    assert config.input_shapes == {"x": CLS_SHAPE}
    assert config.backend == "onnx"
    image = frame()
    expected = bare_outputs(loaded, reference_input(loaded, image))
    got = pool_outputs(loaded, image)
    assert len(got) == 1
    assert got[0].shape == (1, 2)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-5)


def test_tflite_bundle_runs_in_the_pool_like_the_bare_backend(tmp_path: Path) -> None:
    bundle = init_bundle(TINY_TFLITE, tmp_path / "tiny")
    m = bundle.manifest
    assert list(m.models) == ["tflite"]
    assert m.name == "tiny_classifier"
    assert (m.input.name, m.input.shape) == ("image", [1, 16, 16, 3])
    assert m.preprocess.layout == "nhwc"
    assert isinstance(m.postprocess, ClassificationPost)
    assert m.postprocess.top_k == 4
    config = bundle.model_config(name="tiny", queue_bound=2)
    assert (config.name, config.backend, config.queue_bound) == ("tiny", "litert", 2)
    image = frame(40, 50, seed=3)
    expected = bare_outputs(bundle, reference_input(bundle, image))
    with WorkerPool([config], PoolConfig(workers=1, pin=False, heartbeat_timeout_s=30)) as pool:
        got = pool.infer("tiny", frame=image, timeout_s=30)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-5)


def test_init_on_real_tflite_detector_guesses_a_score(
    tmp_path: Path, real_model: Callable[[str], str]
) -> None:
    bundle = init_bundle(Path(real_model("face_detection_short.tflite")), tmp_path / "face")
    m = bundle.manifest
    assert (m.input.shape, m.preprocess.layout) == ([1, 128, 128, 3], "nhwc")
    assert isinstance(m.postprocess, ScorePost)
    assert [o.name for o in m.outputs] == ["regressors", "classificators"]
    assert load_bundle(bundle.path).model_file().name == "face_detection_short.tflite"


def test_dynamic_shape_model_is_refused_without_an_input_shape(
    tmp_path: Path, real_model: Callable[[str], str]
) -> None:
    out = tmp_path / "det"
    with pytest.raises(BundleError) as info:
        init_bundle(Path(real_model("ppocr_v4_det.onnx")), out)
    assert "dynamic shape [?, 3, ?, ?]" in info.value.reason
    assert "--input-shape" in info.value.reason
    assert not out.exists()


def test_dynamic_shape_model_is_accepted_with_an_input_shape(
    tmp_path: Path, real_model: Callable[[str], str]
) -> None:
    bundle = init_bundle(
        Path(real_model("ppocr_v4_det.onnx")), tmp_path / "det", input_shape=(1, 3, 640, 640)
    )
    m = bundle.manifest
    assert m.input.shape == [1, 3, 640, 640]
    assert (m.preprocess.width, m.preprocess.height) == (640, 640)
    assert isinstance(m.postprocess, DetectionPost)
    assert m.postprocess.format == "heatmap"
    assert m.outputs[0].shape == [1, 1, 640, 640]
    assert bundle.model_config().input_shapes == {"x": (1, 3, 640, 640)}


def test_input_shape_contradicting_the_model_is_refused(
    tmp_path: Path, real_model: Callable[[str], str]
) -> None:
    with pytest.raises(BundleError, match="cannot use"):
        init_bundle(
            Path(real_model("ppocr_v4_det.onnx")), tmp_path / "d", input_shape=(1, 1, 64, 64)
        )


def test_two_input_model_is_refused_naming_the_inputs(tmp_path: Path) -> None:
    model = two_input_model(tmp_path / "two.onnx")
    with pytest.raises(BundleError) as info:
        init_bundle(model, tmp_path / "out")
    assert "2 inputs ('a' [1, 3, 8, 8], 'b' [1, 3, 8, 8])" in info.value.reason


def test_non_image_model_is_refused_naming_the_shape(tmp_path: Path, add_model: str) -> None:
    with pytest.raises(BundleError) as info:
        init_bundle(Path(add_model), tmp_path / "out")
    assert "input 'x' has shape [1, 4]" in info.value.reason


def test_non_empty_output_directory_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(BundleError, match="exists and is not an empty directory"):
        init_bundle(TINY_TFLITE, out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert init_bundle(TINY_TFLITE, empty).path == empty


def test_bad_name_or_version_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"version: '1\.0' is not a semantic version"):
        init_bundle(TINY_TFLITE, tmp_path / "a", version="1.0")
    with pytest.raises(BundleError, match="name: 'Tiny Model' is not a valid bundle name"):
        init_bundle(TINY_TFLITE, tmp_path / "b", name="Tiny Model")
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()


def test_explicit_postprocess_overrides_the_guess(tmp_path: Path) -> None:
    bundle = init_bundle(TINY_TFLITE, tmp_path / "a", postprocess="score")
    assert isinstance(bundle.manifest.postprocess, ScorePost)
    with pytest.raises(BundleError, match="neither box rows"):
        init_bundle(TINY_TFLITE, tmp_path / "b", postprocess="detection")


def copy_bundle(bundle: Bundle, dest: Path) -> Path:
    shutil.copytree(bundle.path, dest)
    return dest


def test_digest_is_stable_across_locations_and_changes_with_content(
    cls_bundle: Bundle, tmp_path: Path
) -> None:
    copy = copy_bundle(cls_bundle, tmp_path / "copy")
    assert load_bundle(copy).digest == cls_bundle.digest
    data = json.loads((copy / MANIFEST_NAME).read_text())
    data["release"] = 2
    (copy / MANIFEST_NAME).write_text(json.dumps(data))
    assert load_bundle(copy).digest != cls_bundle.digest


def test_altered_model_file_is_refused_naming_the_file(cls_bundle: Bundle, tmp_path: Path) -> None:
    copy = copy_bundle(cls_bundle, tmp_path / "copy")
    model = copy / "ppocr_mobile_v2_cls.onnx"
    data = bytearray(model.read_bytes())
    data[1000] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(BundleError) as info:
        load_bundle(copy)
    assert info.value.path == str(model)
    assert "models.onnx.sha256 says" in info.value.reason


def test_model_file_altered_after_load_is_refused_when_used(
    cls_bundle: Bundle, tmp_path: Path
) -> None:
    copy = copy_bundle(cls_bundle, tmp_path / "copy")
    bundle = load_bundle(copy)
    with (copy / "ppocr_mobile_v2_cls.onnx").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(BundleError, match=r"models\.onnx\.size says"):
        bundle.model_config()


def test_missing_model_file_is_refused(cls_bundle: Bundle, tmp_path: Path) -> None:
    copy = copy_bundle(cls_bundle, tmp_path / "copy")
    (copy / "ppocr_mobile_v2_cls.onnx").unlink()
    with pytest.raises(BundleError, match=r"models\.onnx\.file: no such file in the bundle"):
        load_bundle(copy)


def test_symlink_out_of_the_bundle_is_refused(cls_bundle: Bundle, tmp_path: Path) -> None:
    copy = copy_bundle(cls_bundle, tmp_path / "copy")
    outside = tmp_path / "outside.onnx"
    (copy / "ppocr_mobile_v2_cls.onnx").rename(outside)
    (copy / "ppocr_mobile_v2_cls.onnx").symlink_to(outside)
    with pytest.raises(BundleError, match="resolves outside the bundle"):
        load_bundle(copy)


def test_missing_variant_and_profile_checks(cls_bundle: Bundle) -> None:
    with pytest.raises(BundleError, match="no 'tflite' variant"):
        cls_bundle.model_file("tflite")
    assert cls_bundle.model_file("onnx").name == "ppocr_mobile_v2_cls.onnx"
    cls_bundle.check_profile("anything")  # no profiles listed: any profile
    limited = Bundle(
        cls_bundle.path,
        cls_bundle.manifest.model_copy(update={"profiles": ["jetson-orin"]}),
        cls_bundle.digest,
    )
    limited.check_profile("jetson-orin")
    with pytest.raises(BundleError, match="not for firmware profile 'x86-gateway'"):
        limited.check_profile("x86-gateway")


def test_fleetctl_bundle_init_writes_a_bundle(
    tmp_path: Path, real_model: Callable[[str], str]
) -> None:
    out = tmp_path / "cli"
    proc = fleetctl(
        "bundle", "init", real_model("ppocr_mobile_v2_cls.onnx"), "--out", out,
        "--name", "cls", "--version", "2.0.0", "--input-shape", "1x3x48x192",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"wrote {out / MANIFEST_NAME}"
    bundle = load_bundle(out)
    assert (bundle.manifest.name, bundle.manifest.version) == ("cls", "2.0.0")
    assert bundle.digest in proc.stdout


def test_fleetctl_bundle_init_json(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    proc = fleetctl("bundle", "init", TINY_TFLITE, "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["manifest"] == str(out / MANIFEST_NAME)
    assert report["digest"] == load_bundle(out).digest
    assert report["bundle"]["input"]["shape"] == [1, 16, 16, 3]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("fleetctl: error: ")
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0]


def test_fleetctl_missing_model_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = fleetctl("bundle", "init", tmp_path / "nope.onnx", "--out", tmp_path / "out")
    assert_one_line_error(proc, "nope.onnx", "no such model file")


def test_fleetctl_two_input_model_is_one_line_and_exit_2(tmp_path: Path) -> None:
    model = two_input_model(tmp_path / "two.onnx")
    proc = fleetctl("bundle", "init", model, "--out", tmp_path / "out")
    assert_one_line_error(proc, "2 inputs")
    assert not (tmp_path / "out").exists()


def test_fleetctl_dynamic_model_without_shape_is_one_line_and_exit_2(
    tmp_path: Path, real_model: Callable[[str], str]
) -> None:
    proc = fleetctl("bundle", "init", real_model("ppocr_v4_det.onnx"), "--out", tmp_path / "o")
    assert_one_line_error(proc, "dynamic shape", "--input-shape")


def test_fleetctl_help_shows_an_example() -> None:
    proc = fleetctl("bundle", "init", "--help")
    assert proc.returncode == 0
    assert "example:" in proc.stdout
    assert "fleetctl bundle init" in proc.stdout
