"""edge-runtime as a user runs it: a subprocess whose exit code and output are checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def edge_runtime(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_bench_writes_the_documented_json_keys(real_models_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = edge_runtime(
        "bench",
        str(real_models_dir / "ppocr_mobile_v2_cls.onnx"),
        "--input-shape",
        "1x3x48x192",
        "--workers",
        "2",
        "--rate",
        "200",
        "--duration",
        "1",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    for key in (
        "bare_p50_ms",
        "bare_p99_ms",
        "pool_p50_ms",
        "pool_p99_ms",
        "pool_p999_ms",
        "throughput_rps",
        "bare_throughput_rps",
        "refused",
        "expired",
        "workers",
        "backend",
    ):
        assert key in data, key
    assert data["workers"] == 2
    assert data["backend"] == "onnx"
    assert data["sent"] == 200  # --rate 200 for --duration 1
    # every request once, however loaded the machine (a stall refuses or delays some)
    counts = [data[k] for k in ("completed", "refused", "expired", "failed", "unfinished")]
    assert sum(counts) == data["sent"], data
    assert data["completed"] >= 1
    assert (
        "sent 200  completed {}  refused {}  expired {}  failed {}  unfinished {}".format(*counts)
        in proc.stdout
    )
    assert data["pool_p50_ms"] > 0
    assert data["bare_p50_ms"] > 0
    assert "bare" in proc.stdout
    assert "pool" in proc.stdout


def test_bench_runs_a_tflite_model_closed_loop(real_models_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = edge_runtime(
        "bench",
        str(real_models_dir / "face_detection_short.tflite"),
        "--workers",
        "1",
        "--rate",
        "max",
        "--duration",
        "1",
        "--json",
        str(out),
        "-q",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["backend"] == "litert"
    assert data["mode"] == "closed-loop"
    assert data["input_shape"] == [1, 128, 128, 3]
    assert data["completed"] > 0
    assert data["failed"] == 0


def test_bench_on_a_corrupt_model_fails_with_one_line_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 50)
    proc = edge_runtime("bench", str(bad), "--duration", "1")
    assert proc.returncode == 2
    assert "broken.onnx" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bench_on_a_dynamic_model_without_shape_says_which_input(real_models_dir: Path) -> None:
    proc = edge_runtime("bench", str(real_models_dir / "ppocr_v4_det.onnx"), "--duration", "1")
    assert proc.returncode == 2
    assert "'x'" in proc.stderr
    assert "--input-shape" in proc.stderr


def test_inspect_reads_shapes_from_the_model(real_models_dir: Path) -> None:
    proc = edge_runtime("inspect", str(real_models_dir / "blazepose_detector.tflite"), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["backend"] == "litert"
    assert data["inputs"][0]["shape"] == [1, 224, 224, 3]
    assert data["inputs"][0]["dtype"] == "float32"


def test_backends_lists_both_backends_as_available() -> None:
    proc = edge_runtime("backends", "--json")
    assert proc.returncode == 0, proc.stderr
    infos = {i["key"]: i for i in json.loads(proc.stdout)}
    assert infos["onnx"]["available"] is True
    assert infos["litert"]["available"] is True


def test_profile_auto_resolves_cores_on_this_machine() -> None:
    proc = edge_runtime("profile", "auto", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["resolved_workers"] >= 1
    assert data["resolved_cores"]


def test_bad_rate_is_a_usage_error() -> None:
    proc = edge_runtime("bench", "m.onnx", "--rate", "fast")
    assert proc.returncode == 2
    assert "rate must be a number or 'max'" in proc.stderr


def test_every_command_has_help_with_an_example() -> None:
    for command in ("bench", "targets", "inspect", "backends", "profile"):
        proc = edge_runtime(command, "--help")
        assert proc.returncode == 0, proc.stderr
        assert "example:" in proc.stdout, command
