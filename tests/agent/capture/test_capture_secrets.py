"""A camera's password is in no decoder child's command line or environment, nor in what
the agent keeps of a child's error output: ``edge-agent run`` with an RTSP camera whose
key frames an ffmpeg child decodes, and cameras read in process through an ffmpeg child
and through the GStreamer pipeline Jetson uses (fed by ffmpeg for a camera with a
password), against the real RTSP server asking for that password."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest

from agent.capture import Camera, CameraConfig
from agent.capture.pipe import child_env, ffconcat, scrub
from hil.procs import descendants
from runtime.profiles import VideoConfig
from tests.agent.capture.camera_watch import wait_for
from tests.agent.installer.installer_helpers import make_bundle
from tests.support.broker import free_port

if TYPE_CHECKING:
    from tests.support.rtsp import RtspServer

pytest_plugins = ["tests.support.rtsp"]

pytestmark = pytest.mark.timeout(240)

BIN = Path(sys.executable).parent
USER = "operator"
SECRET = "Pa55'w@rd:/x y%41"  # noqa: S105 - a test camera's password, with URL and quote bytes
SECRET_NAME = "GST_CAMERA_PASSWORD"  # noqa: S105 - a name a decoder child's allowlist would keep


def forms(secret: str) -> list[bytes]:
    """The secret as it is and as a URL writes it."""
    return [f.encode() for f in {secret, quote(secret, safe=""), quote(secret)}]


def child_processes(root: int, exclude: int | None) -> dict[int, tuple[bytes, bytes]]:
    """Every process below ``root`` (but the RTSP server's tree): its cmdline and environ."""
    skip = {exclude, *descendants(exclude)} if exclude is not None else set()
    found: dict[int, tuple[bytes, bytes]] = {}
    for pid in descendants(root) - skip:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue  # it ended
        found[pid] = (cmdline, environ)
    return found


def assert_no_secret(procs: dict[int, tuple[bytes, bytes]], secret: str) -> None:
    for pid, (cmdline, environ) in procs.items():
        for form in forms(secret):
            where = cmdline.replace(b"\0", b" ").decode(errors="replace")
            assert form not in cmdline, f"pid {pid}'s command line has the secret: {where}"
            assert form not in environ, f"pid {pid}'s environment has the secret ({where})"


def programs(procs: dict[int, tuple[bytes, bytes]]) -> set[str]:
    return {Path(cmd.split(b"\0")[0].decode()).name for cmd, _ in procs.values()}


@pytest.fixture
def secure_server(make_rtsp_server: Callable[..., RtspServer]) -> RtspServer:
    return make_rtsp_server(user=USER, password=SECRET)


@pytest.mark.parametrize(
    ("decoder", "child"),
    [("keyframes", "ffmpeg"), ("gstreamer", "gst-launch-1.0")],
)
def test_a_decoder_childs_command_line_and_environment_hold_no_password(
    secure_server: RtspServer,
    cameras: list[Camera],
    monkeypatch: pytest.MonkeyPatch,
    decoder: str,
    child: str,
) -> None:
    monkeypatch.setenv(SECRET_NAME, SECRET)
    monkeypatch.setenv("LC_COPY_OF_IT", f"x{SECRET}x")  # kept by name, dropped by value
    fields: dict[str, object] = {"keyframes_only": True} if decoder == "keyframes" else {}
    video = (
        VideoConfig(decoders=("gstreamer",), gst_decoder="openh264dec", gst_convert="")
        if decoder == "gstreamer"
        else VideoConfig()
    )
    config = CameraConfig.model_validate(
        {
            "name": "gate", "kind": "rtsp", "uri": secure_server.url("/h264"), "fps": 15,
            "username": USER, "password_env": SECRET_NAME, **fields,
        }
    )  # fmt: skip
    camera = Camera(config, video=video)
    cameras.append(camera)
    camera.start()
    wait_for(lambda: camera.stats().frames_captured >= 3, 30, "3 frames")
    stats = camera.stats()
    assert stats.decoder in ("software (key frames)", "gstreamer (openh264dec)"), stats
    frame = camera.latest(5.0)
    assert frame is not None
    assert 40 < float(frame.image.mean()) < 220  # a picture: the password opened the stream
    assert secure_server.proc is not None
    procs = child_processes(os.getpid(), exclude=secure_server.proc.pid)
    assert child in programs(procs), procs
    assert_no_secret(procs, SECRET)


@pytest.mark.parametrize("given", ["credentials", "environment"])
def test_the_agent_runs_its_decoder_children_without_the_password_in_view(
    secure_server: RtspServer, tmp_path: Path, given: str
) -> None:
    """Every process below ``edge-agent run`` (hot path, companion, runtime workers, the
    ffmpeg child) is read: with the password in ``$CREDENTIALS_DIRECTORY``, and with it
    in the agent's environment, which the agent's own processes then get through a pipe
    (the camera opening with it shows it arrived)."""
    credentials = tmp_path / "credentials"
    credentials.mkdir(mode=0o700)
    if given == "credentials":
        (credentials / "CAM_PASSWORD").write_text(SECRET + "\n")
    bundle = make_bundle(tmp_path).path
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\ndevice_id = "gate-1"\nstate_dir = "state"\nprofile = "x86-gateway"\n'
        "[runtime]\nworkers = 1\npin = false\n"
        f"[http]\nport = {free_port()}\n"
        '[decision_log]\nthumbnails = "none"\n'
        f'[[cameras]]\nname = "gate"\nkind = "rtsp"\nuri = "{secure_server.url("/h264")}"\n'
        f'fps = 5\nkeyframes_only = true\nusername = "{USER}"\npassword_env = "CAM_PASSWORD"\n'
        f'[[pipelines]]\nname = "p"\nsource = "gate"\nbundle = "{bundle}"\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    env["CREDENTIALS_DIRECTORY"] = str(credentials)
    if given == "environment":
        env["CAM_PASSWORD"] = SECRET
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "edge-agent"), "run", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        procs: dict[int, tuple[bytes, bytes]] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            procs = child_processes(proc.pid, exclude=None)
            if "ffmpeg" in programs(procs):
                break
            time.sleep(0.2)
        assert "ffmpeg" in programs(procs), log.read_text(errors="replace")[-3000:]
        wait_for(lambda: "decoding with software (key frames" in log.read_text(), 30, "ffmpeg")
        procs = child_processes(proc.pid, exclude=None)
        assert {"ffmpeg"} <= programs(procs)
        assert len(procs) >= 3, procs  # hot path, companion, ffmpeg at least
        assert_no_secret(procs, SECRET)
        text = log.read_text(errors="replace")
        assert all(form.decode() not in text for form in forms(SECRET))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_a_childs_error_output_keeps_no_password() -> None:
    line = f"[concat @ 0x5596] Impossible to open 'rtsp://{USER}:{quote(SECRET, safe='')}@h/x'"
    assert scrub(line, [SECRET]) == f"[concat @ 0x5596] Impossible to open 'rtsp://{USER}:***@h/x'"
    assert "hunter2" not in scrub("rtsp://a:hunter2@10.0.0.1/s: 401 Unauthorized", [])
    assert SECRET not in scrub(f"auth failed with {SECRET}", [SECRET])


def test_a_url_cannot_add_a_line_to_ffmpegs_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_NAME, SECRET)
    config = CameraConfig(
        name="c", kind="rtsp", uri="rtsp://10.0.0.1/a'\noption protocol_whitelist file\n\\b",
        username=USER, password_env=SECRET_NAME, transport="udp",
    )  # fmt: skip
    lines = ffconcat(config).decode().splitlines()
    assert lines[0] == "ffconcat version 1.0"
    assert lines[1].startswith("file 'rtsp://")
    assert lines[1].count("'") == 2
    assert lines[2:] == ["option rtsp_transport udp", "option timeout 15000000"]
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/lib")
    assert child_env([SECRET], [SECRET_NAME]).get("LD_LIBRARY_PATH") == "/opt/lib"
    assert SECRET_NAME not in child_env([SECRET], [SECRET_NAME])
