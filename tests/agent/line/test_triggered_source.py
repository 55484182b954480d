"""The triggered source: a frame captured at or after the trigger (the camera's software
trigger fires one), nothing while no trigger is armed, and a frame a stopping pipeline
gave back (a reload) is the next one taken, so its trigger still gets a decision."""

from __future__ import annotations

import time

from agent.capture import Camera, CameraConfig
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
