"""Cameras on network streams served by a real ffmpeg (HTTP/MJPEG on loopback): a
server that dies and comes back, one that freezes, one that accepts and never answers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.capture import Camera, CameraConfig
from tests.agent.capture.camera_watch import StateLog, wait_for
from tests.support.streams import MjpegServer

RECOVERY_BOUND_S = 5.0  # the issue: capturing again within 5 s of the server's restart


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MjpegServer]:
    srv = MjpegServer(tmp_path, size="320x240", rate=15)
    srv.start()
    yield srv
    srv.resume()
    srv.stop()


@pytest.fixture
def cameras() -> Iterator[list[Camera]]:
    started: list[Camera] = []
    yield started
    for camera in started:
        camera.stop(timeout_s=5.0)


def test_http_camera_captures_again_within_5s_after_its_server_is_killed_and_restarted(
    server: MjpegServer, cameras: list[Camera]
) -> None:
    log = StateLog()
    # default stall timeout and backoff (0.5 s doubling to 30 s): what a site runs
    camera = Camera(CameraConfig(name="line1", kind="http", uri=server.url, fps=30), on_state=log)
    cameras.append(camera)
    camera.start()
    wait_for(lambda: camera.up, 15, "the camera to come up")
    frame = camera.latest(5.0)
    assert frame is not None
    assert frame.image.shape == (240, 320, 3)

    server.stop()  # the camera server crashes
    wait_for(lambda: not camera.up, 10, "the camera to go down")
    assert log.ups() == [True, False]
    assert "ended or dropped" in log.events[1][1]  # the stream went away mid-read
    assert camera.stats().failures.get("ended", 0) >= 1
    time.sleep(1.0)  # stays away a while: reopen attempts fail meanwhile
    before = camera.stats()
    assert before.frames_captured > 0
    last_seq = before.frames_captured - 1

    restarted = time.monotonic()
    server.start()
    wait_for(lambda: camera.up, 15, "the camera to come up again")
    fresh = camera.latest(5.0)
    while fresh is not None and fresh.seq <= last_seq:  # bounded: latest() times out
        fresh = camera.latest(5.0)
    recovered_s = time.monotonic() - restarted
    assert fresh is not None
    assert recovered_s <= RECOVERY_BOUND_S, f"capturing again {recovered_s:.2f} s after restart"
    assert fresh.t_capture_ns > frame.t_capture_ns
    assert log.ups() == [True, False, True]
    after = camera.stats()
    assert after.reopens >= 1
    assert after.up


def test_live_stream_is_read_as_it_comes_but_published_at_most_at_fps(
    server: MjpegServer, cameras: list[Camera]
) -> None:
    fps = 5.0  # the server sends 15 per second
    camera = Camera(CameraConfig(name="slowpub", kind="http", uri=server.url, fps=fps))
    cameras.append(camera)
    camera.start()
    wait_for(lambda: camera.stats().frames_captured > 0, 15, "the first frame")
    start_stats, start = camera.stats(), time.monotonic()
    time.sleep(2.0)
    stats, elapsed = camera.stats(), time.monotonic() - start
    published = stats.frames_captured - start_stats.frames_captured
    assert published <= fps * elapsed + 2
    assert published >= 2
    assert stats.frames_skipped > start_stats.frames_skipped


def test_frozen_stream_server_is_detected_by_the_read_timeout_and_reported_down(
    server: MjpegServer, cameras: list[Camera]
) -> None:
    log = StateLog()
    config = CameraConfig(
        name="frozen",
        kind="http",
        uri=server.url,
        fps=30,
        stall_timeout_s=1.0,
        open_timeout_s=1.0,
        backoff_initial_s=0.2,
        backoff_max_s=1.0,
    )
    camera = Camera(config, on_state=log)
    cameras.append(camera)
    camera.start()
    wait_for(lambda: camera.up, 15, "the camera to come up")
    server.pause()  # the connection stays open but no byte comes
    wait_for(lambda: not camera.up, 10, "the read timeout to fire")
    assert log.ups() == [True, False]
    server.resume()
    server.stop()
    server.start()
    wait_for(lambda: camera.up, 10, "the camera to come up again")
    assert log.ups() == [True, False, True]


def test_server_that_accepts_but_never_answers_cannot_hang_the_camera(
    cameras: list[Camera],
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = listener.accept()
                held.append(conn)
            except TimeoutError:
                continue

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        log = StateLog()
        config = CameraConfig(
            name="silent",
            kind="http",
            uri=f"http://127.0.0.1:{port}/stream",
            open_timeout_s=0.5,
            stall_timeout_s=0.5,
            backoff_initial_s=0.1,
            backoff_max_s=0.2,
        )
        camera = Camera(config, on_state=log)
        cameras.append(camera)
        camera.start()
        wait_for(lambda: camera.stats().reopens >= 2, 15, "open timeouts and reopens")
        assert log.ups() == [False]
        assert len(held) >= 2  # it did connect, each time
        start = time.monotonic()
        camera.stop(timeout_s=5.0)
        assert time.monotonic() - start < 3.0
    finally:
        done.set()
        acceptor.join(5)
        for conn in held:
            conn.close()
        listener.close()
