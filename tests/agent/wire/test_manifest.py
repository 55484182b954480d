"""The bundle manifest schema: validation naming the field, unknown fields kept, durable
writes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agent.kernel.errors import BundleError
from agent.wire.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    BundleManifest,
    ClassificationPost,
    DetectionPost,
    ScorePost,
    dump_manifest,
    load_manifest,
    manifest_bytes,
)
from runtime import PreprocessSpec

SHA = "ab" * 32


def valid() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "name": "text-cls",
        "version": "1.2.3-rc.1+build.7",
        "release": 4,
        "models": {"onnx": {"file": "models/cls.onnx", "sha256": SHA, "size": 10}},
        "input": {"name": "x", "shape": [1, 3, 48, 192], "dtype": "float32"},
        "outputs": [{"name": "probs", "shape": [1, 2], "dtype": "float32"}],
        "preprocess": {
            "width": 192,
            "height": 48,
            "color": "bgr",
            "layout": "nchw",
            "scale": 0.00392156862745098,
            "mean": [0.5, 0.5, 0.5],
            "std": [0.5, 0.5, 0.5],
            "dtype": "float32",
            "interpolation": "linear",
        },
        "postprocess": {
            "kind": "classification",
            "output": "probs",
            "top_k": 2,
            "softmax": False,
            "labels": ["0", "180"],
        },
        "policy": {"rules": [{"outcome": "review", "label": "180"}], "default": "pass"},
        "profiles": ["x86-gateway", "jetson-orin"],
        "latency_budget_ms": 20.0,
    }


def write(directory: Path, data: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST_NAME).write_text(json.dumps(data))
    return directory


def load_error(tmp_path: Path, data: Any) -> str:
    with pytest.raises(BundleError) as info:
        load_manifest(write(tmp_path / "b", data))
    assert info.value.path == str(tmp_path / "b" / MANIFEST_NAME)
    return info.value.reason


def test_valid_manifest_loads_with_typed_sections(tmp_path: Path) -> None:
    m = load_manifest(write(tmp_path, valid()))
    assert m.name == "text-cls"
    assert m.release == 4
    assert m.models["onnx"].file == "models/cls.onnx"
    assert m.input.concrete_shape() == (1, 3, 48, 192)
    assert isinstance(m.postprocess, ClassificationPost)
    assert m.postprocess.labels == ["0", "180"]
    assert m.profiles == ["x86-gateway", "jetson-orin"]


def test_defaults_fill_optional_sections(tmp_path: Path) -> None:
    data = valid()
    for key in ("policy", "profiles", "latency_budget_ms", "outputs", "schema_version"):
        del data[key]
    m = load_manifest(write(tmp_path, data))
    assert m.policy == {"rules": [], "default": "pass"}
    assert m.profiles == []
    assert m.latency_budget_ms == 100.0
    assert m.schema_version == 1


def test_preprocess_converts_to_the_runtime_spec(tmp_path: Path) -> None:
    m = load_manifest(write(tmp_path, valid()))
    assert m.preprocess.to_runtime() == PreprocessSpec(
        color="bgr",
        layout="nchw",
        scale=0.00392156862745098,
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        interpolation="linear",
    )


def test_unknown_fields_at_every_level_survive_load_and_dump(tmp_path: Path) -> None:
    data = valid()
    data["future_top"] = {"nested": [1, 2]}
    data["models"]["onnx"]["signature_hint"] = "x"
    data["models"]["tensorrt"] = {"file": "m.engine", "sha256": SHA, "size": 3, "sm": 87}
    data["input"]["quant"] = {"zero_point": 0}
    data["preprocess"]["crop"] = [0, 0, 10, 10]
    data["postprocess"]["calibration"] = "isotonic"
    data["policy"]["hysteresis"] = 3
    src = write(tmp_path / "a", data)
    m = load_manifest(src)
    out = tmp_path / "b"
    out.mkdir()
    dump_manifest(m, out)
    again = json.loads((out / MANIFEST_NAME).read_text())
    assert again["future_top"] == {"nested": [1, 2]}
    assert again["models"]["onnx"]["signature_hint"] == "x"
    assert again["models"]["tensorrt"]["sm"] == 87
    assert again["input"]["quant"] == {"zero_point": 0}
    assert again["preprocess"]["crop"] == [0, 0, 10, 10]
    assert again["postprocess"]["calibration"] == "isotonic"
    assert again["policy"]["hysteresis"] == 3
    # A second round trip writes the very same bytes: signing hashes them.
    assert manifest_bytes(load_manifest(out)) == (out / MANIFEST_NAME).read_bytes()


def test_dump_replaces_the_file_and_leaves_no_temp_files(tmp_path: Path) -> None:
    m = load_manifest(write(tmp_path, valid()))
    path = dump_manifest(m.model_copy(update={"release": 9}), tmp_path)
    assert path == tmp_path / MANIFEST_NAME
    assert json.loads(path.read_text())["release"] == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST_NAME]


def test_dump_into_a_missing_directory_is_a_bundle_error(tmp_path: Path) -> None:
    m = BundleManifest.model_validate(valid())
    with pytest.raises(BundleError, match="cannot write the manifest"):
        dump_manifest(m, tmp_path / "nope")


@pytest.mark.parametrize(
    "version", ["1.2", "v1.2.3", "01.2.3", "1.2.3-", "1.2.3+", "1.2.3.4", "latest"]
)
def test_bad_semver_is_refused_naming_version(tmp_path: Path, version: str) -> None:
    data = valid()
    data["version"] = version
    reason = load_error(tmp_path, data)
    assert reason.startswith("version:"), reason
    assert "semantic version" in reason


@pytest.mark.parametrize("missing", ["name", "version", "release", "models", "input"])
def test_missing_field_is_named(tmp_path: Path, missing: str) -> None:
    data = valid()
    del data[missing]
    assert load_error(tmp_path, data) == f"{missing}: Field required"


def test_missing_nested_field_is_named_with_its_dotted_path(tmp_path: Path) -> None:
    data = valid()
    del data["models"]["onnx"]["sha256"]
    assert load_error(tmp_path, data) == "models.onnx.sha256: Field required"


@pytest.mark.parametrize(
    "file", ["../cls.onnx", "models/../../cls.onnx", "/etc/passwd", "a\\b.onnx", "./cls.onnx"]
)
def test_model_path_leaving_the_bundle_is_refused(tmp_path: Path, file: str) -> None:
    data = valid()
    data["models"]["onnx"]["file"] = file
    reason = load_error(tmp_path, data)
    assert reason.startswith("models.onnx.file:"), reason


def test_bad_sha256_and_negative_release_are_named(tmp_path: Path) -> None:
    data = valid()
    data["models"]["onnx"]["sha256"] = "AB" * 32
    data["release"] = -1
    reason = load_error(tmp_path, data)
    assert "release:" in reason
    assert "models.onnx.sha256:" in reason


def test_bad_name_and_profile_are_named(tmp_path: Path) -> None:
    data = valid()
    data["name"] = "Text Cls"
    data["profiles"] = ["x86-gateway", "Jetson Orin"]
    reason = load_error(tmp_path, data)
    assert "name: 'Text Cls' is not a valid bundle name" in reason
    assert "profiles[1]:" in reason


def test_postprocess_errors_name_the_field_without_the_union_tag(tmp_path: Path) -> None:
    data = valid()
    data["postprocess"]["top_k"] = 0
    assert load_error(tmp_path, data).startswith("postprocess.top_k:")


def test_unknown_postprocess_kind_is_refused(tmp_path: Path) -> None:
    data = valid()
    data["postprocess"] = {"kind": "segmentation"}
    reason = load_error(tmp_path, data)
    assert reason.startswith("postprocess:"), reason
    assert "segmentation" in reason


def test_score_and_detection_postprocess_parse(tmp_path: Path) -> None:
    data = valid()
    data["postprocess"] = {"kind": "score", "output": "probs", "index": 1, "label": "180"}
    assert isinstance(load_manifest(write(tmp_path / "a", data)).postprocess, ScorePost)
    data["postprocess"] = {"kind": "detection", "format": "heatmap", "threshold": 0.3}
    post = load_manifest(write(tmp_path / "b", data)).postprocess
    assert isinstance(post, DetectionPost)
    assert (post.format, post.threshold, post.nms_iou) == ("heatmap", 0.3, 0.5)
    data["postprocess"]["format"] = "masks"
    assert load_error(tmp_path, data).startswith("postprocess.format:")


def test_postprocess_output_must_be_one_of_the_listed_outputs(tmp_path: Path) -> None:
    data = valid()
    data["postprocess"]["output"] = "logits"
    reason = load_error(tmp_path, data)
    assert "postprocess.output: no output 'logits' (outputs: probs)" in reason


def test_preprocess_size_that_contradicts_the_input_shape_is_named(tmp_path: Path) -> None:
    data = valid()
    data["preprocess"]["width"] = 100
    assert "preprocess.width: 100 but input.shape says 192" in load_error(tmp_path, data)


def test_nhwc_layout_reads_size_and_channels_from_the_right_axes(tmp_path: Path) -> None:
    data = valid()
    data["input"]["shape"] = [1, 48, 192, 3]
    data["preprocess"]["layout"] = "nhwc"
    assert load_manifest(write(tmp_path / "a", data)).preprocess.layout == "nhwc"
    data["preprocess"]["color"] = "gray"
    data["preprocess"]["mean"] = [0.0]
    data["preprocess"]["std"] = [1.0]
    assert "preprocess.color: 'gray' gives 1 channels" in load_error(tmp_path, data)


def test_symbolic_input_dims_are_allowed_but_not_negative_ones(tmp_path: Path) -> None:
    data = valid()
    data["input"]["shape"] = ["batch", 3, -1, -1]
    m = load_manifest(write(tmp_path / "a", data))
    assert m.input.concrete_shape() is None
    data["input"]["shape"] = [1, 3, -2, 192]
    assert load_error(tmp_path, data).startswith("input.shape:")


def test_preprocess_dtype_must_match_the_input(tmp_path: Path) -> None:
    data = valid()
    data["preprocess"]["dtype"] = "uint8"
    assert "preprocess.dtype: uint8 but input.dtype is float32" in load_error(tmp_path, data)


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    data = valid()
    data["schema_version"] = 2
    assert load_error(tmp_path, data).startswith("schema_version: 2 is newer")


def test_missing_manifest_file_is_a_bundle_error(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="cannot read the manifest"):
        load_manifest(tmp_path)


def test_bad_json_and_non_object_json_are_refused(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_NAME).write_text('{"name": "x",')
    with pytest.raises(BundleError, match="not valid JSON"):
        load_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("[1, 2]")
    with pytest.raises(BundleError, match="JSON list, not an object"):
        load_manifest(tmp_path)


def test_oversized_manifest_is_refused_before_parsing(tmp_path: Path) -> None:
    data = copy.deepcopy(valid())
    data["padding"] = "x" * MAX_MANIFEST_BYTES
    with pytest.raises(BundleError, match="limit"):
        load_manifest(write(tmp_path, data))


def test_dump_refuses_a_manifest_edited_into_an_invalid_one(tmp_path: Path) -> None:
    m = load_manifest(write(tmp_path, valid()))
    before = (tmp_path / MANIFEST_NAME).read_bytes()
    broken = m.model_copy(update={"version": "one"})  # model_copy does not validate
    with pytest.raises(BundleError, match="version: 'one' is not a semantic version"):
        dump_manifest(broken, tmp_path)
    assert (tmp_path / MANIFEST_NAME).read_bytes() == before


def test_the_documented_example_is_a_valid_manifest(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "bundle-manifest.md").read_text()
    example = doc.split("## Example", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    m = load_manifest(write(tmp_path, json.loads(example)))
    assert (m.name, m.release, m.profiles) == ("text-direction", 3, ["x86-gateway"])
    documented = set(doc.split("### Top level", 1)[1].split("###", 1)[0].split("`"))
    assert set(BundleManifest.model_fields) <= documented
