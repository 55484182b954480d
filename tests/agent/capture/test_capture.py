"""Cameras on real sources: synthetic patterns, image directories, video files, and a
source that never opens, each read by the real capture thread."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from agent.capture import Camera, CameraConfig, Frame, open_source
from agent.errors import CaptureError
from tests.support.broker import free_port


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def take(camera: Camera, count: int, timeout_s: float = 10.0) -> list[Frame]:
    """Up to ``count`` frames, stopping at ``timeout_s`` or when the camera ends."""
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout_s
    while len(frames) < count and time.monotonic() < deadline:
        frame = camera.latest(0.5)
        if frame is not None:
            frames.append(frame)
        elif not camera.up and camera.stats().frames_captured > 0:
            break
    return frames


class StateLog:
    """Records on_state calls (from the capture threads)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bool, str]] = []
        self._lock = threading.Lock()

    def __call__(self, name: str, up: bool, reason: str) -> None:
        with self._lock:
            self.events.append((name, up, reason))

    def of(self, name: str) -> list[tuple[bool, str]]:
        with self._lock:
            return [(up, reason) for n, up, reason in self.events if n == name]


@pytest.fixture
def cameras() -> Iterator[list[Camera]]:
    """Cameras a test starts; all stopped at the end, whatever happened."""
    started: list[Camera] = []
    yield started
    for camera in started:
        camera.stop(timeout_s=5.0)


def run(cameras: list[Camera], config: CameraConfig, on_state: StateLog | None = None) -> Camera:
    camera = Camera(config, on_state=on_state)
    cameras.append(camera)
    camera.start()
    return camera


# --- synthetic ---------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["bars", "checker", "noise"])
def test_synthetic_frames_have_increasing_seq_and_timestamps_and_differ(
    cameras: list[Camera], pattern: str
) -> None:
    config = CameraConfig(
        name=f"syn-{pattern}", kind="synthetic", fps=50, width=160, height=120, pattern=pattern
    )
    camera = run(cameras, config)
    frames = take(camera, 5)
    assert len(frames) == 5
    for frame in frames:
        assert frame.camera == f"syn-{pattern}"
        assert frame.image.shape == (120, 160, 3)
        assert frame.image.dtype == np.uint8
        assert not frame.image.flags.writeable
    for a, b in itertools.pairwise(frames):
        assert b.seq > a.seq
        assert b.t_capture_ns > a.t_capture_ns
        assert b.wall_time >= a.wall_time
        assert not np.array_equal(a.image, b.image)
    # the timestamp is taken at capture: a frame is never from the future
    assert frames[-1].t_capture_ns <= time.perf_counter_ns()
    assert abs(frames[-1].wall_time - time.time()) < 5.0


def test_synthetic_frame_number_is_drawn_so_consecutive_frames_differ() -> None:
    config = CameraConfig(name="syn", kind="synthetic", width=64, height=48, pattern="checker")
    source = open_source(config)
    try:
        first, second = source.read(), source.read()
    finally:
        source.close()
    assert first is not None
    assert second is not None
    assert first.shape == (48, 64, 3)
    assert not np.array_equal(first, second)


def test_paced_source_publishes_no_more_than_its_fps(cameras: list[Camera]) -> None:
    fps = 20.0
    camera = run(
        cameras, CameraConfig(name="paced", kind="synthetic", fps=fps, width=64, height=48)
    )
    wait_for(lambda: camera.stats().frames_captured > 0, 10, "the first frame")
    start_count, start = camera.stats().frames_captured, time.monotonic()
    time.sleep(1.0)
    count, elapsed = camera.stats().frames_captured - start_count, time.monotonic() - start
    # not flat out (a 64x48 pattern renders thousands per second), but paced at ~fps
    assert count <= fps * elapsed + 2
    assert count >= 3
    assert camera.stats().fps_measured <= fps * 1.5


def test_slow_consumer_gets_the_newest_frame_and_the_rest_are_counted_as_dropped(
    cameras: list[Camera],
) -> None:
    camera = run(cameras, CameraConfig(name="fast", kind="synthetic", fps=100, width=64, height=48))
    first = camera.latest(5.0)
    assert first is not None
    taken = [first]
    time.sleep(0.3)  # a slow consumer: many frames arrive meanwhile
    second = camera.latest(5.0)
    assert second is not None
    taken.append(second)
    assert second.seq > taken[0].seq + 1, "the consumer should skip to the newest frame"
    camera.stop()
    stats = camera.stats()
    assert stats.frames_dropped >= second.seq - taken[0].seq - 1
    # every captured frame was either taken, dropped, or is the one left in the slot
    assert stats.frames_captured - len(taken) - stats.frames_dropped in (0, 1)


def test_latest_returns_none_on_timeout_and_after_stop(cameras: list[Camera]) -> None:
    camera = Camera(CameraConfig(name="idle", kind="synthetic", fps=1, width=64, height=48))
    assert camera.latest(0.05) is None  # never started
    cameras.append(camera)
    camera.start()
    assert camera.latest(5.0) is not None
    camera.stop()
    start = time.monotonic()
    assert camera.latest(2.0) is None
    assert time.monotonic() - start < 1.0
    assert not camera.up


def test_on_state_callback_that_raises_is_counted_and_capture_goes_on(
    cameras: list[Camera],
) -> None:
    def broken(name: str, up: bool, reason: str) -> None:
        raise RuntimeError("dashboard is down")

    camera = Camera(
        CameraConfig(name="cb", kind="synthetic", fps=50, width=64, height=48), on_state=broken
    )
    cameras.append(camera)
    camera.start()
    frames = take(camera, 3)
    assert len(frames) == 3
    assert camera.stats().errors == 1
    assert camera.up


def test_starting_a_running_camera_twice_is_refused(cameras: list[Camera]) -> None:
    camera = run(cameras, CameraConfig(name="twice", kind="synthetic", width=64, height=48))
    with pytest.raises(CaptureError, match="already started"):
        camera.start()


# --- image directory ---------------------------------------------------------------------

LEVELS = [10, 60, 110, 160]


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    """Four PNGs of known flat colours (lossless), plus files that are not images."""
    directory = tmp_path / "images"
    directory.mkdir()
    # written out of order: the camera must sort them by name
    for i in (2, 0, 3, 1):
        cv2.imwrite(str(directory / f"img_{i:02d}.png"), np.full((24, 32, 3), LEVELS[i], np.uint8))
    (directory / "notes.txt").write_text("not an image")
    (directory / "img_01b.png").write_bytes(b"not really a png")  # unreadable: skipped
    return directory


def test_image_directory_once_plays_each_image_in_name_order_then_ends(
    cameras: list[Camera], image_dir: Path
) -> None:
    log = StateLog()
    config = CameraConfig(name="imgs", kind="images", uri=str(image_dir), fps=20, loop=False)
    camera = run(cameras, config, log)
    frames = take(camera, 10, timeout_s=10)
    wait_for(
        lambda: log.of("imgs")[-1:] == [(False, f"end of image directory {image_dir}")],
        10,
        "the end of the directory",
    )
    stats = camera.stats()
    assert stats.frames_captured == 4
    assert len(frames) + stats.frames_dropped == 4
    for frame in frames:
        assert frame.image.shape == (24, 32, 3)
        assert int(frame.image[0, 0, 0]) == LEVELS[frame.seq]
    assert [up for up, _ in log.of("imgs")] == [True, False]
    assert not camera.up
    assert stats.reopens == 0


def test_image_directory_looped_starts_over_in_the_same_order(
    cameras: list[Camera], image_dir: Path
) -> None:
    config = CameraConfig(name="loop", kind="images", uri=str(image_dir), fps=40, loop=True)
    camera = run(cameras, config)
    frames = take(camera, 10)
    assert len(frames) == 10
    assert frames[-1].seq >= 9
    for frame in frames:
        assert int(frame.image[0, 0, 0]) == LEVELS[frame.seq % 4]
    assert camera.up
    assert camera.stats().last_error == ""


def test_image_directory_that_disappears_is_reported_down_and_comes_back(
    cameras: list[Camera], image_dir: Path, tmp_path: Path
) -> None:
    log = StateLog()
    config = CameraConfig(
        name="moved",
        kind="images",
        uri=str(image_dir),
        fps=40,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )
    camera = run(cameras, config, log)
    wait_for(lambda: camera.up, 10, "camera up")
    parked = tmp_path / "parked"
    image_dir.rename(parked)
    wait_for(lambda: not camera.up, 10, "camera down")
    down = [reason for up, reason in log.of("moved") if not up]
    assert down
    assert "does not exist" in down[0]
    wait_for(lambda: camera.stats().reopens >= 2, 10, "reopen attempts")
    parked.rename(image_dir)
    wait_for(lambda: camera.up, 10, "camera up again")
    before = camera.stats().frames_captured
    wait_for(lambda: camera.stats().frames_captured > before + 2, 10, "frames again")
    assert [up for up, _ in log.of("moved")][:3] == [True, False, True]


# --- video file ----------------------------------------------------------------------------

VIDEO_FRAMES = 12


def level(i: int) -> int:
    return 20 + 18 * i


@pytest.fixture
def video_file(tmp_path: Path) -> Path:
    """A 12-frame MJPG .avi whose frame i is a flat grey of level(i)."""
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 10.0, (64, 48))
    assert writer.isOpened()
    for i in range(VIDEO_FRAMES):
        writer.write(np.full((48, 64, 3), level(i), np.uint8))
    writer.release()
    assert path.stat().st_size > 0
    return path


def test_video_file_once_delivers_every_frame_in_order_then_ends(
    cameras: list[Camera], video_file: Path
) -> None:
    log = StateLog()
    config = CameraConfig(name="clip", kind="file", uri=str(video_file), fps=30, loop=False)
    camera = run(cameras, config, log)
    frames = take(camera, 100, timeout_s=10)
    wait_for(
        lambda: log.of("clip")[-1:] == [(False, f"end of video file {video_file}")],
        10,
        "the end of the file",
    )
    stats = camera.stats()
    assert stats.frames_captured == VIDEO_FRAMES
    assert len(frames) + stats.frames_dropped == VIDEO_FRAMES
    for frame in frames:
        assert frame.image.shape == (48, 64, 3)
        assert abs(float(frame.image.mean()) - level(frame.seq)) < 6
    assert [f.seq for f in frames] == sorted({f.seq for f in frames})
    assert stats.reopens == 0


def test_video_file_looped_plays_again_from_the_start(
    cameras: list[Camera], video_file: Path
) -> None:
    config = CameraConfig(name="clip-loop", kind="file", uri=str(video_file), fps=60, loop=True)
    camera = run(cameras, config)
    wait_for(lambda: camera.stats().frames_captured > 2 * VIDEO_FRAMES + 2, 15, "a second loop")
    frames = take(camera, 5)
    assert len(frames) == 5
    for frame in frames:
        assert abs(float(frame.image.mean()) - level(frame.seq % VIDEO_FRAMES)) < 6
    stats = camera.stats()
    assert stats.up
    assert stats.reopens == 0
    assert stats.errors == 0


def test_missing_video_file_is_reported_down_naming_the_file(
    cameras: list[Camera], tmp_path: Path
) -> None:
    log = StateLog()
    missing = tmp_path / "nope.avi"
    config = CameraConfig(name="gone", kind="file", uri=str(missing), backoff_initial_s=0.05)
    camera = run(cameras, config, log)
    wait_for(lambda: bool(log.of("gone")), 10, "a state report")
    assert log.of("gone")[0] == (False, f"video file {missing} does not exist")
    assert camera.stats().last_error == f"video file {missing} does not exist"
    with pytest.raises(CaptureError, match="does not exist"):
        open_source(config)


# --- a source that never opens -------------------------------------------------------------


def test_camera_that_never_opens_keeps_retrying_and_does_not_disturb_another(
    cameras: list[Camera],
) -> None:
    log = StateLog()
    url = f"http://127.0.0.1:{free_port()}/none"
    dead = CameraConfig(
        name="dead",
        kind="http",
        uri=url,
        open_timeout_s=1.0,
        backoff_initial_s=0.1,
        backoff_max_s=0.4,
    )
    good = CameraConfig(name="good", kind="synthetic", fps=30, width=64, height=48)
    dead_camera = run(cameras, dead, log)  # must not raise
    good_camera = run(cameras, good, log)
    wait_for(lambda: dead_camera.stats().reopens >= 4, 15, "reopen attempts")
    # the backoff grows: four attempts take at least 0.1 + 0.2 + 0.4 + 0.4 s
    frames = take(good_camera, 5)
    assert len(frames) == 5
    assert good_camera.up
    assert not dead_camera.up
    stats = dead_camera.stats()
    assert stats.frames_captured == 0
    assert stats.errors >= 4
    assert url in stats.last_error
    assert log.of("dead") == [(False, f"can't open {url}: connection refused (refused)")]  # once
    assert log.of("good") == [(True, "capturing")]
    assert good_camera.stats().errors == 0


def test_stop_returns_promptly_while_a_camera_is_backing_off(cameras: list[Camera]) -> None:
    config = CameraConfig(
        name="backing-off",
        kind="http",
        uri=f"http://127.0.0.1:{free_port()}/x",
        backoff_initial_s=30.0,
        backoff_max_s=30.0,
    )
    camera = run(cameras, config)
    wait_for(lambda: camera.stats().errors >= 1, 10, "the first failure")
    start = time.monotonic()
    camera.stop(timeout_s=5.0)
    assert time.monotonic() - start < 2.0
