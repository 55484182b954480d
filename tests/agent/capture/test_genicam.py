"""GenICam cameras against Aravis's own in-process fake camera (``Fake_1``, the real
libaravis with its fake interface): each pixel format, features set and read back, a
refused and a changed feature, software triggers answered one frame each, a hardware
trigger's settings; and the parts that need no camera: the
conversions' colour order, the frame ring, the clock mapping, the config's checks.
The GigE Vision tests (the simulator on a veth pair) are in test_genicam_gige.py."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from pydantic import ValidationError

from agent.benchsource import BenchSource, measure_source
from agent.capture import Camera, CameraConfig
from agent.capture.genicam import aravis
from agent.capture.genicam.clock import TickClock
from agent.capture.genicam.pixels import CODES, FrameRing, convert_array
from agent.capture.genicam.source import GenicamSource
from agent.capture.rtsp import SourceFailure
from agent.errors import AgentError

REPO = Path(__file__).resolve().parents[3]
FAKE = "Fake_1"


@pytest.fixture(scope="module", autouse=True)
def fake_interface() -> None:
    """Aravis's fake interface, on for the process (Aravis keeps it until exit)."""
    assert any(d.id == FAKE for d in aravis.devices(("Fake",)))


def genicam(**kw: Any) -> CameraConfig:
    base: dict[str, Any] = {
        "name": "gc",
        "kind": "genicam",
        "uri": FAKE,
        "fps": 200,
        "stall_timeout_s": 2.0,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.2,
    }
    base.update(kw)
    return CameraConfig.model_validate(base)


@pytest.fixture
def source() -> Iterator[list[GenicamSource]]:
    opened: list[GenicamSource] = []
    yield opened
    for s in opened:
        s.close()


def open_source(opened: list[GenicamSource], **genicam_table: Any) -> GenicamSource:
    s = GenicamSource(genicam(trigger_mode="software", genicam=genicam_table))
    opened.append(s)
    s.open()
    return s


@pytest.mark.parametrize("fmt", ["Mono8", "BayerRG8", "BayerGR8", "BayerGB8", "BayerBG8", "RGB8"])
def test_each_pixel_format_is_delivered_as_bgr_of_the_region_asked(
    source: list[GenicamSource], fmt: str
) -> None:
    s = open_source(source, pixel_format=fmt, roi=[0, 0, 128, 96])
    image = s.read()
    assert image is not None
    assert image.shape == (96, 128, 3)
    assert image.dtype == np.uint8
    assert s.state.read_back["PixelFormat"] == fmt
    assert int(image.max()) > int(image.min())  # the fake's ramp, not an empty buffer
    if fmt == "Mono8":
        assert (image[..., 0] == image[..., 1]).all()
        assert (image[..., 1] == image[..., 2]).all()


def test_exposure_gain_and_a_feature_table_are_set_and_read_back(
    source: list[GenicamSource],
) -> None:
    s = open_source(source, exposure_us=2500, gain=3, features={"TestRegister": 42})
    camera = s._camera
    assert camera is not None
    assert camera.call("get_exposure_time") == pytest.approx(2500)
    assert camera.call("get_gain") == pytest.approx(3)
    assert camera.get_feature("TestRegister") == "42"
    assert s.state.read_back["ExposureTime"] == "2500.0"
    assert s.state.read_back["TestRegister"] == "42"
    assert s.state.read_back["TriggerSource"] == "Software"


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({"pixel_format": "BGR8"}, "PixelFormat = BGR8 refused: the camera said: "),
        ({"gain": 2.5}, "Gain: set 2.5, the camera says 2"),
        ({"exposure_us": 50_000_000}, "ExposureTime = 50000000.0 refused: the camera said: "),
        ({"features": {"NoSuchThing": 1}}, "features.NoSuchThing: the camera has no such feature"),
        ({"features": {"TestRegister": "x"}}, "is a number, not 'x'"),
        ({"features": {"AcquisitionFrameRate": 30}}, ""),
    ],
)
def test_a_feature_the_camera_refuses_or_changes_fails_the_open_naming_it(
    source: list[GenicamSource], table: dict[str, Any], said: str
) -> None:
    if "AcquisitionFrameRate" in table.get("features", {}):  # its own key: check-config says
        with pytest.raises(ValidationError, match="AcquisitionFrameRate is set by frame_rate"):
            genicam(genicam=table)
        return
    with pytest.raises(SourceFailure) as caught:
        open_source(source, **table)
    assert caught.value.failure == "misconfigured"
    assert said in str(caught.value)


def test_software_triggers_are_answered_one_frame_each(cameras: list[Camera]) -> None:
    camera = Camera(genicam(trigger_mode="software", genicam={"pixel_format": "Mono8"}))
    cameras.append(camera)
    camera.start()
    seqs = []
    for _ in range(5):
        fired = time.perf_counter_ns()
        assert camera.software_trigger()
        frame = camera.latest(5.0)
        assert frame is not None, camera.stats().last_error
        assert frame.t_capture_ns >= fired  # taken after it was asked for
        seqs.append(frame.seq)
    assert camera.latest(0.3) is None  # no trigger, no frame
    g = camera.stats().genicam
    assert seqs == [0, 1, 2, 3, 4]
    assert g["software_triggers"] == 5
    assert g["frames"] == 5
    assert g["missed_triggers"] == 0
    assert g["clock"]["samples"] == 5


def test_a_refused_feature_keeps_the_camera_down_with_its_reason_word(
    cameras: list[Camera],
) -> None:
    camera = Camera(genicam(genicam={"pixel_format": "BGR8"}))
    cameras.append(camera)
    camera.start()
    deadline = time.monotonic() + 10
    while camera.stats().errors < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    stats = camera.stats()
    assert not stats.up
    assert stats.failure == "misconfigured"
    assert stats.failures["misconfigured"] >= 2  # reopened with backoff, refused again
    assert "PixelFormat = BGR8 refused" in stats.last_error


def test_a_hardware_triggered_camera_is_set_to_its_line_and_its_frames_are_read(
    cameras: list[Camera],
) -> None:
    # The simulator takes the trigger settings but does not model its lines: it keeps
    # sending frames, so only the settings and the reading are tested here.
    camera = Camera(genicam(trigger_mode="hardware", genicam={"trigger_source": "Line0"}))
    cameras.append(camera)
    camera.start()
    assert camera.latest(3.0) is not None, camera.stats().last_error
    read_back = camera.stats().genicam["read_back"]
    assert read_back["TriggerSource"] == "Line0"


def test_a_free_running_camera_publishes_frames_stamped_by_its_clock(
    cameras: list[Camera],
) -> None:
    camera = Camera(genicam(genicam={"pixel_format": "BayerRG8", "frame_rate": 50}))
    cameras.append(camera)
    camera.start()
    frames = [camera.latest(3.0) for _ in range(5)]
    assert all(f is not None for f in frames)
    stamps = [f.t_capture_ns for f in frames if f is not None]
    assert stamps == sorted(stamps)
    assert camera.stats().genicam["read_back"]["AcquisitionFrameRate"] == "50.0"


# --- no camera needed ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "red_at"),
    [("BayerRG8", (0, 0)), ("BayerGR8", (0, 1)), ("BayerGB8", (1, 0)), ("BayerBG8", (1, 1))],
)
def test_each_bayer_pattern_converts_a_red_scene_to_red(fmt: str, red_at: tuple[int, int]) -> None:
    mosaic = np.zeros((8, 8), np.uint8)
    mosaic[red_at[0] :: 2, red_at[1] :: 2] = 200
    out = np.empty((8, 8, 3), np.uint8)
    convert_array(mosaic.ravel(), 8, 8, CODES[fmt], out)
    assert out[4, 4].tolist() == [0, 0, 200]  # B, G, R


def test_rgb8_is_swapped_to_bgr_and_bgr8_copied_into_the_given_image() -> None:
    rgb = np.zeros((2, 2, 3), np.uint8)
    rgb[..., 0] = 200  # red
    out = np.empty((2, 2, 3), np.uint8)
    assert convert_array(rgb.ravel(), 2, 2, CODES["RGB8"], out) is out
    assert out[0, 0].tolist() == [0, 0, 200]
    convert_array(rgb.ravel(), 2, 2, CODES["BGR8"], out)
    assert out[0, 0].tolist() == [200, 0, 0]
    gray = cv2.cvtColor(np.full((2, 2), 7, np.uint8), cv2.COLOR_GRAY2BGR)
    convert_array(np.full(4, 7, np.uint8), 2, 2, CODES["Mono8"], out)
    assert (out == gray).all()


def test_the_frame_ring_reuses_an_image_only_once_nobody_holds_it() -> None:
    ring = FrameRing(2)
    first = ring.take(4, 4)
    second = ring.take(4, 4)
    assert first is not second
    assert ring.allocated == 2
    third = ring.take(4, 4)  # both held: a new one, counted
    assert third is not first
    assert third is not second
    assert ring.allocated == 3
    del second, third
    again = ring.take(4, 4)
    assert again is not first
    assert ring.allocated == 3
    view = again[1:2]  # a view holds its image too
    del again
    assert ring.take(4, 4) is not view.base
    del view


def test_the_clock_mapping_finds_offset_and_drift_and_says_its_error() -> None:
    clock = TickClock()
    offset, ppm, transfer = 7_000_000_000, 40.0, 1_500_000
    jitter = [0, 200_000, 50_000, 400_000, 10_000]
    for i in range(200):
        cam = i * 20_000_000
        host = offset + int(cam * (1 + ppm * 1e-6)) + transfer + jitter[i % len(jitter)]
        clock.arrival(cam, host)
    e = clock.estimate()
    true_at_end = offset + int(199 * 20_000_000 * (1 + ppm * 1e-6))
    mapped = clock.to_host(199 * 20_000_000)
    assert 0 <= mapped - true_at_end <= transfer + 50_000  # late by the fastest transfer
    assert e.drift_ppm == pytest.approx(ppm, abs=10)
    assert 0 < e.error_ns <= 500_000
    clock.arrival(5, offset)  # the camera's clock went back: a restarted camera
    assert clock.resets == 1
    assert clock.estimate().samples == 1


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ({"features": {"PixelFormat": "Mono8"}}, "PixelFormat is set by pixel_format"),
        ({"features": {"1st": 1}}, "is not a GenICam feature name"),
        ({"features": {"Gamma": "a\nb"}}, "is not a value a camera takes"),
        ({"roi": [0, 0, 0, 10]}, "width and height 1-65535"),
        ({"binning": [0, 1]}, "each must be 1-16"),
        ({"pixel_format": "YUV422"}, "pixel_format"),
        ({"exposure": 10}, "Extra inputs are not permitted"),
    ],
)
def test_check_config_refuses_what_no_camera_could_take(table: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        genicam(genicam=table)


def test_hardware_triggers_and_the_genicam_table_belong_to_genicam_cameras() -> None:
    with pytest.raises(ValidationError, match="trigger_mode = 'hardware' applies to genicam"):
        CameraConfig(name="c", kind="synthetic", trigger_mode="hardware")
    with pytest.raises(ValidationError, match=r"\[cameras.genicam\] applies to genicam"):
        CameraConfig.model_validate({"name": "c", "kind": "synthetic", "genicam": {}})
    with pytest.raises(ValidationError, match="frame_rate applies to a free_run camera"):
        genicam(trigger_mode="software", genicam={"frame_rate": 10})


def test_a_machine_without_libaravis_reports_the_camera_unavailable_naming_the_package() -> None:
    script = (
        "from agent.capture.genicam import aravis\n"
        "aravis.LIBRARY = 'libaravis-not-installed.so.0'\n"
        "from agent.capture import CameraConfig\n"
        "from agent.capture.genicam.source import GenicamSource\n"
        "s = GenicamSource(CameraConfig(name='c', kind='genicam', uri='X'))\n"
        "try:\n    s.open()\nexcept Exception as e:\n    print(e.failure, '|', e)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    word, _, text = run.stdout.partition("|")
    assert word.strip() == "unavailable"
    assert "install Debian's libaravis-0.8-0" in text


def test_the_bench_measures_a_genicam_source_delivered_converted_and_triggered() -> None:
    src = BenchSource(f"genicam://{FAKE}?pixel_format=BayerGB8&frame_rate=50")
    assert src.live
    assert src.kind == "genicam"
    first, figures = measure_source(src, 1.0)
    g = figures["genicam"]
    assert first.ndim == 3
    assert g["pixel_format"] == "BayerGB8"
    assert g["frame_rate"] == 50.0
    assert g["frames_delivered"] == figures["frames_decoded"] > 0
    assert g["frames_expected"] is not None
    assert g["convert_cpu_per_frame_ms"] > 0
    assert g["triggers_answered"] == g["triggers"] == 50
    assert g["trigger_to_frame_ms_p50"] > 0


def test_a_bench_source_with_an_unknown_genicam_setting_is_refused_naming_it() -> None:
    with pytest.raises(AgentError, match="'gain' is not one of pixel_format, frame_rate"):
        BenchSource("genicam://X?gain=3").config()
