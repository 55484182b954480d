"""The demo's assets, for the demos (``scripts/demo.py``, ``scripts/demo_fleet.py``), the
benches (``make bench``) and the HIL harness (:mod:`hil.assets`): a looped conveyor
video whose label cards pass the camera, every fourth upside down, and two bundles made
from real pretrained models (``make models``).

``python -m hil.demo_assets --dir .cache/demo`` makes both (each skipped when it exists).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np

BIN = Path(sys.executable).parent
"""Where this interpreter's console scripts (``fleetctl``) are."""

W, H, FPS = 640, 480, 15
CARD_W, CARD_H, SPEED = 420, 120, 24  # a card crosses the view in ~2.9 s
LABELS = ["LOT 4821 EXP 2027-03", "LOT 4822 EXP 2027-04", "BATCH 77A QC OK", "LOT 4823 EXP 2027-05"]


def make_video(path: Path) -> None:
    """Label cards crossing a conveyor; the card with index 3 (mod 4) is upside down."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.avi")
    out = cv2.VideoWriter(str(tmp), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (W, H))
    card_w, card_h, speed = CARD_W, CARD_H, SPEED
    period = (W + card_w) // speed
    for i in range(period * len(LABELS)):  # four cards, then the loop starts over
        img = np.full((H, W, 3), (90, 95, 100), np.uint8)
        cv2.rectangle(img, (0, 150), (W, 330), (60, 62, 64), -1)  # the belt
        n, t = divmod(i, period)
        card: np.ndarray[Any, Any] = np.full((card_h, card_w, 3), 245, np.uint8)
        text = LABELS[n % len(LABELS)]
        cv2.putText(card, text, (14, 76), cv2.FONT_HERSHEY_SIMPLEX, 1.05, (20, 20, 20), 3)
        if n % 4 == 3:
            card = cv2.rotate(card, cv2.ROTATE_180)
        x = W - t * speed
        xa, xb = max(0, x), min(W, x + card_w)
        if xb > xa:
            img[180 : 180 + card_h, xa:xb] = card[:, xa - x : xb - x]
        out.write(img)
    out.release()
    tmp.replace(path)


def edit_manifest(manifest: Path, **changes: object) -> None:
    """Set ``changes`` in a bundle's ``manifest.json``, keeping the rest."""
    data = json.loads(manifest.read_text())
    data.update(changes)
    manifest.write_text(json.dumps(data, indent=2) + "\n")


def make_bundles(models: Path, bundles: Path) -> None:
    """``text-det`` (PP-OCRv4 detection) and ``text-cls`` (PP-OCR direction classifier)
    under ``bundles``, made with ``fleetctl bundle init`` from the pretrained models in
    ``models``, their manifests edited for the conveyor video; each kept if it exists.

    Raises:
        subprocess.CalledProcessError: ``fleetctl`` failed.
    """
    det, cls = bundles / "text-det", bundles / "text-cls"
    fleetctl = str(BIN / "fleetctl")
    if not (det / "manifest.json").exists():
        shutil.rmtree(det, ignore_errors=True)
        subprocess.run(
            [
                fleetctl,
                "bundle",
                "init",
                str(models / "ppocr_v4_det.onnx"),
                "--out",
                str(det),
                "--name",
                "text-det",
                "--version",
                "4.0.0",
                "--input-shape",
                f"1x3x{H}x{W}",
            ],
            check=True,
        )
        data = json.loads((det / "manifest.json").read_text())
        pre = data["preprocess"] | {
            "color": "bgr",
            "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225],
        }
        edit_manifest(
            det / "manifest.json",
            preprocess=pre,
            postprocess={
                "kind": "detection",
                "format": "heatmap",
                "threshold": 0.3,
                "max_detections": 8,
                "min_area": 200.0,
                "labels": ["text"],
                "unclip_ratio": 1.5,
            },
            latency_budget_ms=150.0,
        )
    if not (cls / "manifest.json").exists():
        shutil.rmtree(cls, ignore_errors=True)
        subprocess.run(
            [
                fleetctl,
                "bundle",
                "init",
                str(models / "ppocr_mobile_v2_cls.onnx"),
                "--out",
                str(cls),
                "--name",
                "text-cls",
                "--version",
                "2.0.0",
                "--input-shape",
                "1x3x48x192",
            ],
            check=True,
        )
        data = json.loads((cls / "manifest.json").read_text())
        pre = data["preprocess"] | {"color": "bgr", "mean": [0.5] * 3, "std": [0.5] * 3}
        edit_manifest(
            cls / "manifest.json",
            preprocess=pre,
            postprocess={"kind": "classification", "top_k": 2, "labels": ["0", "180"]},
        )


def prepare(directory: Path, models: Path) -> None:
    """The video (``line.avi``) and the bundles (``bundles/``) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "line.avi").exists():
        make_video(directory / "line.avi")
    make_bundles(models, directory / "bundles")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hil.demo_assets",
        description="The demo's conveyor video and bundles (each kept if it exists).",
        epilog="example: python -m hil.demo_assets --dir .cache/demo --models .cache/models",
    )
    parser.add_argument("--dir", type=Path, default=Path(".cache/demo"), help="where to")
    parser.add_argument("--models", type=Path, default=Path(".cache/models"),
                        help="the pretrained models of `make models`")  # fmt: skip
    args = parser.parse_args(argv)
    prepare(args.dir, args.models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
