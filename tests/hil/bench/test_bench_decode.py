"""The decode-cost bench on small clips: the camera-like clips it encodes decode to the
frames written (H.264 and H.265, no B-frames), and its figures for a given source are
consistent (frames read, CPU per frame, cameras that fill the cores)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import cv2
import pytest

from hil.bench import decode


@pytest.mark.parametrize("codec", ["h264", "h265"])
def test_a_camera_like_clip_decodes_to_every_frame_written(tmp_path: Path, codec: str) -> None:
    clip = tmp_path / f"small-{codec}.mp4"
    decode.make_clip(clip, 320, 180, codec, 256)
    frames, walls, cpu = decode.decode_round(str(clip))
    assert frames == decode.FPS * decode.SECONDS
    assert len(walls) == frames
    assert cpu > 0
    cap = cv2.VideoCapture(str(clip), cv2.CAP_FFMPEG)
    assert (cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (320, 180)
    cap.release()


def test_the_figures_of_a_source_are_consistent(tmp_path: Path) -> None:
    clip = tmp_path / "src.mp4"
    decode.make_clip(clip, 320, 180, "h264", 256)
    out = tmp_path / "figures.json"
    assert decode.main(["--source", str(clip), "--rounds", "2", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    (row,) = figures["rows"]
    assert (row["width"], row["height"], row["frames"]) == (320, 180, 120)
    cores = os.cpu_count() or 1
    per_frame = row["decode_cpu_per_frame_ms"]
    assert per_frame > 0
    assert row["cameras_full_at_15fps"] == pytest.approx(cores * 1000 / (per_frame * 15), rel=0.01)
    assert row["cameras_full_at_5fps"] == pytest.approx(3 * row["cameras_full_at_15fps"], rel=0.01)
    assert row["keyframes_cpu_ms_per_video_s"] is not None


def test_a_source_that_does_not_open_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nothing.mp4"
    assert decode.main(["--source", str(missing), "--rounds", "1"]) == 1
    assert f"{missing}: does not open" in capsys.readouterr().err
