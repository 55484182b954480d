"""RTSP cameras through the profile's decoders, against the real RTSP server: a decoder
that can't run here (VAAPI without a GPU, V4L2 M2M without a decoder device, Jetson's
nvv4l2decoder without JetPack) is passed over with its reason and software runs; a
GStreamer pipeline of the shape Jetson uses decodes (with a software decoder element
in place of nvv4l2decoder); key frames only gives one frame per GOP; a decoder child
that stalls is reported ``stalled``."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agent.capture import Camera, CameraConfig
from agent.capture.pipe import StreamInfo, gst_argv, printable
from runtime.profiles import VideoConfig, load_profile
from tests.agent.capture.camera_watch import wait_for

if TYPE_CHECKING:
    from tests.support.rtsp import RtspServer

pytest_plugins = ["tests.support.rtsp"]

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[3]
GOP_FRAMES = 15  # the test videos: 15 fps, a key frame every second


def start(
    cameras: list[Camera], rtsp_server: RtspServer, video: VideoConfig, **fields: object
) -> Camera:
    config = CameraConfig.model_validate(
        {"name": "dock", "kind": "rtsp", "uri": rtsp_server.url("/h264"), "fps": 15, **fields}
    )
    camera = Camera(config, video=video)
    cameras.append(camera)
    camera.start()
    wait_for(lambda: camera.stats().frames_captured >= 3, 30, "3 frames")
    return camera


def frames_in(camera: Camera, seconds: float) -> int:
    before = camera.stats().frames_captured
    time.sleep(seconds)
    return camera.stats().frames_captured - before


def test_vaapi_without_a_render_node_is_passed_over_before_anything_starts(
    rtsp_server: RtspServer, cameras: list[Camera], tmp_path: Path
) -> None:
    node = tmp_path / "renderD128"  # not there
    video = VideoConfig(decoders=("vaapi", "software"), vaapi_device=str(node))
    camera = start(cameras, rtsp_server, video)
    stats = camera.stats()
    assert stats.decoder == "software"
    assert stats.decoders_passed_over == {
        "vaapi": f"no {node} (no GPU render node here, or not allowed to it)"
    }


def test_vaapi_whose_ffmpeg_fails_falls_back_to_software_and_says_why_in_the_log(
    rtsp_server: RtspServer, cameras: list[Camera], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.capture.decoders")
    video = VideoConfig(decoders=("vaapi",), vaapi_device="/dev/null")  # not a GPU
    camera = start(cameras, rtsp_server, video)
    stats = camera.stats()
    assert stats.decoder == "software"
    assert stats.decoders_passed_over["vaapi"].startswith("ffmpeg exited")
    assert "vaapi" in stats.decoders_passed_over["vaapi"].lower()  # ffmpeg's own words
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("camera dock: decoder vaapi can't run: ffmpeg") for line in lines)
    assert "camera dock: decoding with software (OpenCV FFmpeg, in process)" in lines
    frame = camera.latest(5.0)
    assert frame is not None
    assert frame.image.shape == (360, 640, 3)


def test_v4l2m2m_without_a_decoder_device_falls_back_to_software(
    rtsp_server: RtspServer, cameras: list[Camera]
) -> None:
    camera = start(cameras, rtsp_server, VideoConfig(decoders=("v4l2m2m",)))
    stats = camera.stats()
    assert stats.decoder == "software"
    assert stats.decoders_passed_over == {
        "v4l2m2m": "OpenCV's FFmpeg did not open the stream with "
        "OpenCV FFmpeg h264_v4l2m2m, in process"
    }
    assert stats.failures == {}  # the decoder failed, not the camera


def test_a_gstreamer_pipeline_of_jetsons_shape_decodes_the_camera(
    rtsp_server: RtspServer, cameras: list[Camera]
) -> None:
    # Jetson's pipeline with a software H.264 decoder in place of nvv4l2decoder and no
    # NVMM copy: rtspsrc, depayloader, parser, decoder, conversion to BGR, fdsink.
    video = VideoConfig(decoders=("gstreamer",), gst_decoder="openh264dec", gst_convert="")
    camera = start(cameras, rtsp_server, video)
    stats = camera.stats()
    assert stats.decoder == "gstreamer (openh264dec)"
    assert stats.decoders_passed_over == {}
    frame = camera.latest(5.0)
    assert frame is not None
    assert frame.image.shape == (360, 640, 3)
    assert 40 < float(frame.image.mean()) < 220  # a picture, not a blank or torn frame
    assert frames_in(camera, 2.0) >= 15  # the stream's 15 fps, give or take


def test_jetsons_decoder_missing_here_falls_back_to_software_naming_the_element(
    rtsp_server: RtspServer, cameras: list[Camera]
) -> None:
    camera = start(cameras, rtsp_server, load_profile("jetson-orin").video)
    stats = camera.stats()
    assert stats.decoder == "software"
    assert 'no element "nvv4l2decoder"' in stats.decoders_passed_over["gstreamer"]


def test_keyframes_only_decodes_one_frame_per_gop(
    rtsp_server: RtspServer, cameras: list[Camera]
) -> None:
    camera = start(cameras, rtsp_server, VideoConfig(), keyframes_only=True)
    assert camera.stats().decoder == "software (key frames)"
    n = frames_in(camera, 4.0)
    assert 2 <= n <= 6, n  # 4 s of a 15 fps stream with a key frame a second
    frame = camera.latest(5.0)
    assert frame is not None
    assert frame.image.shape == (360, 640, 3)


def test_a_decoder_child_that_gets_no_data_is_reported_stalled_and_recovers(
    rtsp_server: RtspServer, cameras: list[Camera]
) -> None:
    camera = start(
        cameras, rtsp_server, VideoConfig(), keyframes_only=True,
        stall_timeout_s=2.0, open_timeout_s=3.0, backoff_initial_s=0.2, backoff_max_s=1.0,
    )  # fmt: skip
    rtsp_server.pause()
    stalled_s = wait_for(lambda: "stalled" in camera.stats().failures, 10, "the stall reported")
    assert not camera.up
    rtsp_server.resume()
    back_s = wait_for(lambda: camera.up, 20, "the camera to capture again")
    print(f"stall reported in {stalled_s:.2f} s; capturing {back_s:.2f} s after the resume")
    stats = camera.stats()
    # A reopen during the stall can find the stream opening in software (the server
    # prerolls a frame) while ffmpeg, which reads further, times out: that session runs in
    # software, and the decoder is tried again at the next reopen, not given up.
    assert stats.decoder in ("software (key frames)", "software")
    assert stats.decoders_passed_over == {}


def test_the_documented_jetson_pipeline_is_the_one_the_agent_runs() -> None:
    video = load_profile("jetson-orin").video
    config = CameraConfig(
        name="press-3", kind="rtsp", uri="rtsp://10.0.0.21/Streaming/Channels/102"
    )
    stages = gst_argv(config, StreamInfo(640, 360, "h264"), video.gst_decoder, video.gst_convert)
    documented = re.sub(r"\s*\\\n\s*", " ", (ROOT / "docs/cameras.md").read_text())
    assert printable(stages) in documented


@pytest.mark.parametrize("fields", [{"decoder": "vaapi"}, {"keyframes_only": True}])
def test_decoder_settings_on_a_camera_that_is_not_rtsp_are_refused_naming_them(
    fields: dict[str, object],
) -> None:
    with pytest.raises(ValueError, match="decoder and keyframes_only apply to rtsp cameras only"):
        CameraConfig.model_validate({"name": "f", "kind": "file", "uri": "a.mp4", **fields})
