"""RTSP cameras against a real RTSP server (GStreamer's, on loopback) read by the real
OpenCV: the rate, the transports and codecs, a server restart, a stall with the socket
open, a wrong password, a wrong path, a refused connection, a stream that ends; and a
password in the configuration file refused by ``check-config``."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agent.capture import Camera, CameraConfig
from agent.status import camera_health
from tests.agent.capture.camera_watch import StateLog, wait_for
from tests.support.broker import free_port

if TYPE_CHECKING:
    from tests.support.rtsp import RtspServer

pytest_plugins = ["tests.support.rtsp"]

pytestmark = pytest.mark.timeout(240)

PASSWORD_SECRET = "EDGEFLEET_TEST_CAMERA_PASSWORD"  # noqa: S105 - the secret's name


def start(cameras: list[Camera], log: StateLog | None = None, **fields: object) -> Camera:
    config = CameraConfig.model_validate({"name": "dock", "kind": "rtsp", **fields})
    camera = Camera(config, on_state=log)
    cameras.append(camera)
    camera.start()
    return camera


@pytest.mark.parametrize(
    ("mount", "transport"),
    [("/h264", "tcp"), ("/h264", "udp"), ("/h265", "tcp"), ("/h265", "auto")],
)
def test_rtsp_camera_delivers_frames_at_its_configured_rate_over_each_transport_and_codec(
    rtsp_server: RtspServer, cameras: list[Camera], mount: str, transport: str
) -> None:
    camera = start(cameras, uri=rtsp_server.url(mount), fps=5, transport=transport)
    wait_for(lambda: camera.stats().frames_captured >= 10, 20, "10 frames")
    frame = camera.latest(5.0)
    assert frame is not None
    assert frame.image.shape == (360, 640, 3)
    stats = camera.stats()
    assert stats.up
    assert stats.failures == {}
    # the server sends 15 frames a second, the camera publishes 5: two of three are skipped
    assert stats.frames_skipped > stats.frames_captured


def test_rtsp_camera_captures_again_after_its_server_is_killed_and_restarted_on_the_same_port(
    rtsp_server: RtspServer, cameras: list[Camera]
) -> None:
    log = StateLog()
    camera = start(cameras, log, uri=rtsp_server.url("/h264"), backoff_max_s=2.0)
    wait_for(lambda: camera.up, 15, "the camera to come up")

    rtsp_server.kill()  # the camera crashes: its connection is reset
    wait_for(lambda: not camera.up, 10, "the camera to go down")
    wait_for(lambda: "refused" in camera.stats().failures, 10, "a refused reopen")
    assert camera.stats().failures["ended"] == 1
    captured = camera.stats().frames_captured
    down = camera_health(camera.stats())
    assert down["failure"] == "refused"  # current: the camera is down for it
    assert down["last_failure"]["reason"] == "refused"

    rtsp_server.start()  # back, same port
    recovery_s = wait_for(lambda: camera.up, 10, "the camera to capture again")
    wait_for(lambda: camera.stats().frames_captured > captured, 5, "new frames")
    assert log.ups() == [True, False, True]
    print(f"capturing again {recovery_s:.2f} s after the server's restart")
    # /healthz: the failure is past (no current one), the last one kept with when and why
    health = camera_health(camera.stats())
    assert health["up"] is True
    assert health["failure"] == ""
    last = health["last_failure"]
    assert last["reason"] == "refused"
    assert "connection refused" in last["error"]
    assert datetime.fromisoformat(last["at"]) <= datetime.now(timezone.utc)
    assert health["failures"]["refused"] >= 1


def test_rtsp_camera_that_stalls_with_its_socket_open_is_reported_stalled_and_recovers(
    rtsp_server: RtspServer, cameras: list[Camera]
) -> None:
    log = StateLog()
    camera = start(
        cameras,
        log,
        uri=rtsp_server.url("/h264"),
        stall_timeout_s=2.0,
        open_timeout_s=3.0,
        backoff_max_s=1.0,
    )
    wait_for(lambda: camera.up, 15, "the camera to come up")

    rtsp_server.pause()
    down_s = wait_for(lambda: not camera.up, 8, "the stalled camera to go down")
    stats = camera.stats()
    assert stats.failure == "stalled"
    assert "no data" in log.events[-1][1]
    # reopening a paused server opens a session that never sends a frame: timeout
    wait_for(lambda: "timeout" in camera.stats().failures, 10, "a reopen that times out")

    rtsp_server.resume()
    up_s = wait_for(lambda: camera.up, 15, "the camera to capture again after the stall")
    assert log.ups() == [True, False, True]
    print(f"reported down {down_s:.2f} s after the stall began; up {up_s:.2f} s after resume")


def test_rtsp_camera_with_a_wrong_password_is_unauthorized_and_retries_with_a_growing_wait(
    make_rtsp_server: Callable[..., RtspServer],
    cameras: list[Camera],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = make_rtsp_server(user="op", password="right")  # noqa: S106 - the test's server
    monkeypatch.setenv(PASSWORD_SECRET, "wrong-secret")
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    camera = start(
        cameras, uri=server.url("/h264"), username="op", password_env=PASSWORD_SECRET,
        backoff_initial_s=0.2,
    )  # fmt: skip
    wait_for(lambda: camera.stats().errors >= 1, 10, "the first failure")
    time.sleep(3.0)  # backoff 0.2, 0.4, 0.8, 1.6 s: at most 5 attempts in this window
    stats = camera.stats()
    assert stats.failure == "unauthorized"
    assert set(stats.failures) == {"unauthorized"}
    assert 2 <= stats.errors <= 6  # no tight retry loop
    assert "wrong-secret" not in stats.last_error
    assert not stats.up


def test_rtsp_camera_reads_its_password_from_the_credentials_directory(
    make_rtsp_server: Callable[..., RtspServer],
    cameras: list[Camera],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    server = make_rtsp_server(user="op", password="p@ss:w/rd")  # noqa: S106 - the test's server
    (tmp_path / f"edgefleet_{PASSWORD_SECRET}").write_text("p@ss:w/rd\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.setenv(PASSWORD_SECRET, "not-this-one")
    camera = start(cameras, uri=server.url("/h264"), username="op", password_env=PASSWORD_SECRET)
    wait_for(lambda: camera.up, 15, "the camera to come up with the right password")
    assert camera.stats().failures == {}


def test_rtsp_camera_on_a_wrong_path_is_not_found(
    rtsp_server: RtspServer, cameras: list[Camera]
) -> None:
    camera = start(cameras, uri=rtsp_server.url("/no-such-stream"))
    wait_for(lambda: camera.stats().errors >= 1, 10, "the first failure")
    stats = camera.stats()
    assert stats.failure == "not_found"
    assert "RTSP 404" in stats.last_error


def test_rtsp_camera_without_a_server_is_refused(cameras: list[Camera]) -> None:
    camera = start(cameras, uri=f"rtsp://127.0.0.1:{free_port()}/cam")
    wait_for(lambda: camera.stats().errors >= 1, 10, "the first failure")
    assert camera.stats().failure == "refused"


def test_rtsp_camera_at_an_ipv6_address_captures_and_its_failures_are_probed(
    make_rtsp_server: Callable[..., RtspServer], cameras: list[Camera]
) -> None:
    """``rtsp://[::1]:PORT/...``: OpenCV's FFmpeg opens the bracketed address, and the
    probe of a failed open reaches the camera over IPv6 (404 there, not ``unknown``)."""
    server = make_rtsp_server(address="::1")
    assert server.url("/h264").startswith("rtsp://[::1]:")
    camera = start(cameras, uri=server.url("/h264"), fps=5)
    wait_for(lambda: camera.stats().frames_captured >= 5, 20, "5 frames over IPv6")
    missing = start(cameras, uri=server.url("/no-such-stream"))
    wait_for(lambda: missing.stats().errors >= 1, 10, "the first failure")
    assert missing.stats().failure == "not_found", missing.stats().last_error
    assert "RTSP 404" in missing.stats().last_error


def test_rtsp_stream_that_ends_is_reported_ended_and_reopened(
    rtsp_server: RtspServer, cameras: list[Camera]
) -> None:
    log = StateLog()
    camera = start(cameras, log, uri=rtsp_server.url("/short"))  # 2 s of video, then EOS
    wait_for(lambda: camera.stats().failures.get("ended", 0) >= 1, 15, "the stream to end")
    wait_for(lambda: camera.stats().reopens >= 1 and camera.up, 15, "a reopened stream")
    assert log.ups()[:3] == [True, False, True]


def test_rtsp_camera_keeps_capturing_through_a_resolution_change_without_a_reopen(
    rtsp_server: RtspServer, cameras: list[Camera]
) -> None:
    # 3 s at 640x360, then 320x180: OpenCV's FFmpeg backend goes on decoding and hands out
    # frames at the resolution the stream opened with (scaled); the next open takes the new
    camera = start(cameras, uri=rtsp_server.url("/change"), fps=15)
    wait_for(lambda: camera.up, 15, "the camera to come up")
    shapes = set()
    start_s = time.monotonic()
    while time.monotonic() - start_s < 20 and camera.stats().frames_captured < 75:
        frame = camera.latest(1.0)
        if frame is not None:
            shapes.add(frame.image.shape)
    stats = camera.stats()
    assert stats.frames_captured >= 75  # 5 s of frames: well past the change at 3 s
    assert stats.up
    assert stats.errors == 0
    assert stats.reopens == 0
    assert shapes == {(360, 640, 3)}

    camera.stop()
    cameras.remove(camera)
    camera = start(cameras, uri=rtsp_server.url("/small"))
    frame = camera.latest(15.0)
    assert frame is not None
    assert frame.image.shape == (180, 320, 3)


def test_rtsp_camera_with_a_detect_sub_stream_reads_the_sub_stream(
    rtsp_server: RtspServer, cameras: list[Camera]
) -> None:
    camera = start(cameras, uri=rtsp_server.url("/h264"), detect_uri=rtsp_server.url("/small"))
    frame = camera.latest(15.0)
    assert frame is not None
    assert frame.image.shape == (180, 320, 3)  # the main stream is 640x360


def test_camera_config_refuses_a_password_in_the_detect_uri_and_a_sub_stream_on_http() -> None:
    with pytest.raises(ValueError, match="password_env"):
        CameraConfig(
            name="dock", kind="rtsp", uri="rtsp://10.0.0.5/main",
            detect_uri="rtsp://admin:hunter2@10.0.0.5/sub",
        )  # fmt: skip
    with pytest.raises(ValueError, match="rtsp cameras only"):
        CameraConfig(
            name="dock", kind="http", uri="http://10.0.0.5/mjpg", detect_uri="rtsp://10.0.0.5/s"
        )


def test_check_config_refuses_a_camera_password_in_the_uri_and_says_where_it_goes(
    tmp_path: Path,
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        '[[cameras]]\nname = "dock"\nkind = "rtsp"\n'
        'uri = "rtsp://admin:hunter2@10.0.0.5:554/stream1"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "check-config", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"{config}: cameras[0].uri" in done.stderr
    assert "password_env" in done.stderr
    assert "hunter2" not in done.stderr


def test_camera_credentials_are_put_in_the_url_only_at_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agent.capture.rtsp import stream_url

    monkeypatch.setenv(PASSWORD_SECRET, "p@ss:w/rd")
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config = CameraConfig(
        name="dock", kind="rtsp", uri="rtsp://10.0.0.5/s1", username="op",
        password_env=PASSWORD_SECRET,
    )  # fmt: skip
    assert "p@ss" not in config.model_dump_json()
    assert stream_url(config) == "rtsp://op:p%40ss%3Aw%2Frd@10.0.0.5/s1"
