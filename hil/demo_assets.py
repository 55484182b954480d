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
CARD_W, CARD_H, SPEED = 420, 120, 24  # a card crosses the view in ~2.9 s at 15 fps
LABELS = ["LOT 4821 EXP 2027-03", "LOT 4822 EXP 2027-04", "BATCH 77A QC OK", "LOT 4823 EXP 2027-05"]


PERIOD = (W + CARD_W) // SPEED
"""Frames from one card's entry to the next's."""
CENTRED = (W + CARD_W) // 2 // SPEED
"""The frame of a card's crossing where it is whole and near the middle of the view."""


def render(i: int) -> np.ndarray[Any, Any]:
    """Frame ``i`` of the conveyor: card ``i // PERIOD`` crossing; the card with index 3
    (mod 4) is upside down."""
    img = np.full((H, W, 3), (90, 95, 100), np.uint8)
    cv2.rectangle(img, (0, 150), (W, 330), (60, 62, 64), -1)  # the belt
    n, t = divmod(i, PERIOD)
    card: np.ndarray[Any, Any] = np.full((CARD_H, CARD_W, 3), 245, np.uint8)
    text = LABELS[n % len(LABELS)]
    cv2.putText(card, text, (14, 76), cv2.FONT_HERSHEY_SIMPLEX, 1.05, (20, 20, 20), 3)
    if n % 4 == 3:
        card = cv2.rotate(card, cv2.ROTATE_180)
    x = W - t * SPEED
    xa, xb = max(0, x), min(W, x + CARD_W)
    if xb > xa:
        img[180 : 180 + CARD_H, xa:xb] = card[:, xa - x : xb - x]
    return img


def make_video(path: Path) -> None:
    """Label cards crossing a conveyor; the card with index 3 (mod 4) is upside down."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.avi")
    out = cv2.VideoWriter(str(tmp), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (W, H))
    for i in range(PERIOD * len(LABELS)):  # four cards, then the loop starts over
        out.write(render(i))
    out.release()
    tmp.replace(path)


def make_cards(directory: Path) -> None:
    """One still per card, whole in the view (``card-N.png``): what a triggered camera
    takes when the photo-eye sees the card (the demo's station)."""
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(len(LABELS)):
        path = directory / f"card-{n}.png"
        if not path.exists():
            cv2.imwrite(str(path), render(n * PERIOD + CENTRED))


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
    """The video (``line.avi``), the cards' stills (``cards/``) and the bundles
    (``bundles/``) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "line.avi").exists():
        make_video(directory / "line.avi")
    make_cards(directory / "cards")
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
