"""Whether a camera is served: frames taken, the drop ratio, the starved flag, and the
trigger offset (phase) of paced sources."""

from __future__ import annotations

import time
from collections.abc import Callable

from agent.capture import Camera, CameraConfig
from agent.capture.latest import LatestSlot


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def synthetic(name: str, fps: float, **kw: object) -> Camera:
    return Camera(
        CameraConfig.model_validate(
            {"name": name, "kind": "synthetic", "fps": fps, "width": 32, "height": 24, **kw}
        )
    )


def test_the_slot_counts_takes_and_when_the_last_was() -> None:
    slot: LatestSlot[int] = LatestSlot()
    assert (slot.taken, slot.last_take_ns) == (0, 0)
    slot.put(1)
    slot.put(2)
    before = time.perf_counter_ns()
    assert slot.take(0.1) == 2
    assert (slot.taken, slot.dropped) == (1, 1)
    assert slot.last_take_ns >= before
    assert slot.take(0.01) is None
    assert slot.taken == 1


def test_a_camera_nobody_takes_from_is_starved_and_drops_everything() -> None:
    camera = synthetic("lonely", 50)
    camera.start()
    try:
        wait_for(lambda: camera.stats().starved, 5, "the camera to be starved")
        stats = camera.stats()
        assert stats.frames_taken == 0
        assert stats.drop_ratio > 0.9
        assert stats.up
    finally:
        camera.stop()
    assert not camera.stats().starved  # a stopped camera is down, not starved


def test_a_served_camera_is_not_starved_and_drops_nothing() -> None:
    camera = synthetic("served", 20)
    camera.start()
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            camera.latest(0.5)
        stats = camera.stats()
        assert not stats.starved
        assert stats.frames_taken >= 20
        assert stats.drop_ratio < 0.5  # a loaded test machine may miss a frame now and then
    finally:
        camera.stop()


def test_a_camera_whose_consumer_stops_taking_becomes_starved() -> None:
    camera = synthetic("abandoned", 50)
    camera.start()
    try:
        assert camera.latest(2.0) is not None
        assert not camera.stats().starved
        wait_for(lambda: camera.stats().starved, 5, "the camera to be starved")
    finally:
        camera.stop()


def test_a_phase_delays_the_first_frame_of_a_paced_source() -> None:
    camera = synthetic("late", 2, phase=0.5)  # 0.25 s after the source opened
    t0 = time.monotonic()
    camera.start()
    try:
        assert camera.latest(5.0) is not None
        assert time.monotonic() - t0 >= 0.2
    finally:
        camera.stop()
