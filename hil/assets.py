"""What a device under test replays and runs: the conveyor video and the bundles.

Made with the demo's own builders (:mod:`hil.demo_assets`: ``make_video``,
``make_bundles``) from the pretrained models ``make models`` fetched; each is made once
per cache.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from hil.agentconf import BUNDLE
from hil.demo_assets import make_bundles, make_video
from hil.errors import FleetSetupError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ROOT / ".cache" / "models"
RELEASE2_VERSION = "2.0.1"


@dataclass(frozen=True)
class Assets:
    """Paths on this machine.

    Attributes:
        video: the looped conveyor video (640x480, 15 fps, MJPG).
        bundle: the device's fallback bundle (text-cls 2.0.0, release 1, not signed).
        release2: text-cls 2.0.1 release 2, to be signed into the repository.
    """

    video: Path
    bundle: Path
    release2: Path


def prepare(cache: Path, models: Path = DEFAULT_MODELS) -> Assets:
    """Make (or reuse) the video and bundles under ``cache``.

    Raises:
        FleetSetupError: the models are missing (run ``make models``) or a bundle can't
            be made.
    """
    for name in ("ppocr_mobile_v2_cls.onnx", "ppocr_v4_det.onnx"):
        if not (models / name).is_file():
            raise FleetSetupError(f"model {models / name} is missing: run `make models`")
    cache.mkdir(parents=True, exist_ok=True)
    video = cache / "line.avi"
    if not video.exists():
        make_video(video)
    bundles = cache / "bundles"
    try:
        make_bundles(models, bundles)
    except Exception as exc:  # the builder runs fleetctl; say which step failed
        raise FleetSetupError(f"making the bundles in {bundles} failed: {exc}") from exc
    bundle = bundles / BUNDLE
    release2 = cache / f"{BUNDLE}-r2"
    if not (release2 / "manifest.json").exists():
        shutil.rmtree(release2, ignore_errors=True)
        shutil.copytree(bundle, release2)
        manifest = release2 / "manifest.json"
        data = json.loads(manifest.read_text())
        data.update(version=RELEASE2_VERSION, release=2)
        manifest.write_text(json.dumps(data, indent=2) + "\n")
    return Assets(video=video.resolve(), bundle=bundle.resolve(), release2=release2.resolve())
