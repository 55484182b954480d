"""The triggered source: a frame captured at or after the trigger (the camera's software
trigger fires one), nothing while no trigger is armed, and a frame a stopping pipeline
gave back (a reload) is the next one taken, so its trigger still gets a decision. A
hardware-triggered camera (Aravis's in-process fake, which takes a frame 25 times a
second in that mode) is paired by its capture time within the station's window: a frame
exposed before the trigger reached the agent is the one decided, a frame after the
window is none for its trigger and kept for the next, none is decided twice; and
check-config keeps the window to hardware-triggered cameras."""

from __future__ import annotations

import time

import pytest

from agent.capture import Camera, CameraConfig
from agent.capture.genicam import aravis
from agent.config import parse_config
from agent.kernel.errors import ConfigError
from agent.line.handshake import Trigger
from agent.line.source import TriggeredSource


def _trigger(seq: int) -> Trigger:
    now = time.perf_counter_ns()
    return Trigger("st", seq, now, time.time(), f"P{seq}", now + 5_000_000_000)


def test_a_software_triggered_frame_comes_after_the_trigger_and_survives_a_reload() -> None:
    cam = Camera(
        CameraConfig(name="cam", kind="synthetic", width=32, height=24, trigger_mode="software")
    )
    cam.start()
    try:
        source = TriggeredSource(software_trigger=True).bind(cam)
        assert source.latest(0.1) is None  # nothing armed: nothing taken
        trig = _trigger(1)
        source.arm(trig)
        item = source.latest(5.0)
        assert item is not None
        assert item.trigger is trig
        assert item.t_capture_ns >= trig.t_ns
        source.give_back(item)  # the pipeline stopped with it in hand
        assert source.latest(0.1) is item  # the next pipeline decides it
        assert source.latest(0.1) is None
    finally:
        cam.stop()


# --- a hardware-triggered camera: paired by its capture time, within a window ------------


def _hardware_camera() -> Camera:
    """Aravis's in-process fake camera in hardware trigger mode: it models no input line
    and takes a frame 25 times a second, as a photo-eye seeing 25 parts a second would."""
    assert any(d.id == "Fake_1" for d in aravis.devices(("Fake",)))
    return Camera(
        CameraConfig.model_validate(
            {
                "name": "hw",
                "kind": "genicam",
                "uri": "Fake_1",
                "trigger_mode": "hardware",
                "fps": 100,
                "genicam": {"trigger_source": "Line0", "pixel_format": "Mono8"},
            }
        )
    )


def _wait_frames(cam: Camera, n: int) -> None:
    deadline = time.monotonic() + 10
    while cam.stats().frames_captured < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cam.stats().frames_captured >= n, cam.stats().last_error


def test_a_hardware_triggered_frame_exposed_before_the_trigger_is_the_one_decided() -> None:
    cam = _hardware_camera()
    cam.start()
    try:
        _wait_frames(cam, 3)  # the camera runs: its latest frame waits in the slot
        source = TriggeredSource(software_trigger=False, window_ms=(500.0, 200.0)).bind(cam)
        trig = _trigger(1)
        source.arm(trig)
        item = source.latest(5.0)
        assert item is not None, source.stats()
        # exposed before the station saw the trigger (the old rule passed such frames
        # over), within the window, stamped by the camera's own clock
        assert trig.t_ns - 500_000_000 <= item.t_capture_ns < trig.t_ns
        assert item.clock == "camera"
        assert source.stats()["no_frame"] == 0
    finally:
        cam.stop()


def test_a_frame_after_the_window_is_no_frame_for_its_trigger_and_is_kept_for_the_next() -> None:
    cam = _hardware_camera()
    cam.start()
    try:
        _wait_frames(cam, 3)
        source = TriggeredSource(software_trigger=False, window_ms=(100.0, 50.0)).bind(cam)
        now = time.perf_counter_ns()
        old = Trigger("st", 1, now - 2_000_000_000, time.time() - 2, "P1", now + 5_000_000_000)
        source.arm(old)  # a trigger whose window closed 1.95 s ago: every frame is later
        assert source.latest(5.0) is None
        assert source.stats()["after_window"] == 1
        assert source.stats()["no_frame"] == 1
        trig = _trigger(2)
        source.arm(trig)
        item = source.latest(5.0)
        assert item is not None, source.stats()
        assert trig.t_ns - 100_000_000 <= item.t_capture_ns <= trig.t_ns + 50_000_000
        again = _trigger(3)
        source.arm(again)
        second = source.latest(5.0)
        assert second is None or second.seq > item.seq  # a frame is never decided twice
    finally:
        cam.stop()


def test_check_config_pairs_a_hardware_triggered_camera_by_the_window_only() -> None:
    def config(trigger_mode: str, **station: object) -> dict[str, object]:
        camera: dict[str, object] = {"name": "cam", "kind": "genicam", "uri": "X"}
        camera["trigger_mode"] = trigger_mode
        return {
            "agent": {"device_id": "d", "state_dir": "/tmp/unused-state"},
            "cameras": [camera],
            "pipelines": [{"name": "p", "source": "cam", "bundle": "/nonexistent"}],
            "stations": [{"name": "st", "pipeline": "p", "deadline_ms": 100, **station}],
        }

    cfg = parse_config(config("hardware", hardware_trigger_window_ms=[80, 20]))
    assert cfg.stations[0].hardware_trigger_window_ms == (80.0, 20.0)
    with pytest.raises(ConfigError, match=r"stations\[0\]\.capture.*paired by hardware_trigger"):
        parse_config(config("hardware", capture="software_trigger"))
    with pytest.raises(ConfigError, match=r"hardware_trigger_window_ms.*camera 'cam' is software"):
        parse_config(config("software", hardware_trigger_window_ms=[80, 20]))
    with pytest.raises(ConfigError, match=r"before and after are 0\.\.60000 ms, and not both 0"):
        parse_config(config("hardware", hardware_trigger_window_ms=[0, 0]))
    with pytest.raises(ConfigError, match="before and after are"):
        parse_config(config("hardware", hardware_trigger_window_ms=[-5, 20]))
