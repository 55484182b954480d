"""An RTSP server for tests: :mod:`tests.support.rtsp_server` run by Debian's python3.

``make_video`` encodes short test videos with ffmpeg (H.264 or H.265, in MP4);
:class:`RtspServer` starts the server as a subprocess on a free loopback port, waits
(bounded) until it listens, and can pause and resume its streams (a stall with the socket
open), be killed and started again on the same port, and is always stopped at the end.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.broker import free_port

SYSTEM_PYTHON = "/usr/bin/python3"
SERVER_SCRIPT = Path(__file__).with_name("rtsp_server.py")
START_TIMEOUT_S = 15.0
COMMAND_TIMEOUT_S = 5.0


def make_video(
    path: Path,
    codec: str = "h264",
    *,
    width: int = 640,
    height: int = 360,
    fps: int = 15,
    seconds: float = 60.0,
) -> Path:
    """Encode ``seconds`` of ffmpeg's ``testsrc2`` into ``path`` (MP4, a key frame every
    second); kept if it is already there.

    Raises:
        subprocess.CalledProcessError: ffmpeg failed.
    """
    if path.is_file():
        return path
    encoder = (
        ["-c:v", "libx264", "-preset", "ultrafast", "-g", str(fps)]
        if codec == "h264"
        else [
            "-c:v", "libx265", "-preset", "ultrafast", "-tag:v", "hvc1",
            "-x265-params", f"log-level=error:keyint={fps}",
        ]
    )  # fmt: skip
    tmp = path.with_suffix(".part.mp4")
    subprocess.run(
        ["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-f", "lavfi",
         "-i", f"testsrc2=size={width}x{height}:rate={fps}", "-t", str(seconds),
         "-pix_fmt", "yuv420p", *encoder, str(tmp)],
        check=True, timeout=120,
    )  # fmt: skip
    tmp.rename(path)
    return path


def make_resolution_change(path: Path, fps: int = 15) -> Path:
    """An H.264 MPEG-TS file that changes resolution midway: 3 s at 640x360, then 30 s at
    320x180 (new SPS in band, as a camera sends after its resolution is changed); kept if
    it is already there.

    Raises:
        subprocess.CalledProcessError: ffmpeg failed.
    """
    if path.is_file():
        return path
    parts = []
    for size, seconds in (("640x360", 3), ("320x180", 30)):
        part = path.with_name(f"{path.stem}-{size}.ts")
        subprocess.run(
            ["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-f", "lavfi",
             "-i", f"testsrc2=size={size}:rate={fps}", "-t", str(seconds),
             "-pix_fmt", "yuv420p", "-c:v", "libx264", "-preset", "ultrafast", "-g", str(fps),
             "-f", "mpegts", str(part)],
            check=True, timeout=120,
        )  # fmt: skip
        parts.append(part.read_bytes())
    tmp = path.with_suffix(".part")
    tmp.write_bytes(b"".join(parts))  # MPEG-TS streams concatenate
    tmp.rename(path)
    return path


@dataclass
class RtspServer:
    """One RTSP server process; ``mounts`` maps a path (``/cam``) to (file, codec)."""

    mounts: dict[str, tuple[Path, str]]
    user: str = ""
    password: str = ""
    port: int = field(default_factory=free_port)
    address: str = "127.0.0.1"
    """where it listens: 127.0.0.1, or ::1 for an IPv6 camera"""
    proc: subprocess.Popen[str] | None = None

    def url(self, mount: str, *, user: str = "", password: str = "") -> str:
        """``rtsp://[user:password@]ADDRESS:PORT/MOUNT`` (an IPv6 address in brackets)."""
        cred = f"{user}:{password}@" if user else ""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"rtsp://{cred}{host}:{self.port}{mount}"

    def start(self) -> None:
        """Start the server and wait until it listens.

        Raises:
            RuntimeError: it did not say ready within :data:`START_TIMEOUT_S`.
        """
        cmd = [SYSTEM_PYTHON, str(SERVER_SCRIPT), "--port", str(self.port)]
        cmd += ["--address", self.address]
        for path, (file, codec) in self.mounts.items():
            cmd += ["--mount", f"{path}={file}:{codec}"]
        if self.user:
            cmd += ["--user", self.user, "--password", self.password]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        line = self._line(START_TIMEOUT_S)
        if line != f"ready {self.port}":
            err = self._stop_and_stderr()
            raise RuntimeError(f"RTSP server did not start: {line!r} {err}")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:  # it said ready; the port must answer too
            try:
                socket.create_connection((self.address, self.port), timeout=1).close()
            except OSError:
                time.sleep(0.05)
            else:
                return
        raise RuntimeError(f"RTSP server on port {self.port} does not accept connections")

    def _line(self, timeout_s: float) -> str:
        assert self.proc is not None
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            return ""
        return self.proc.stdout.readline().strip()

    def command(self, command: str) -> None:
        """Send ``pause``/``resume`` and wait (bounded) for the server's ``ok``.

        Raises:
            RuntimeError: no answer within :data:`COMMAND_TIMEOUT_S`.
        """
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self._line(COMMAND_TIMEOUT_S)
        if answer != f"ok {command}":
            raise RuntimeError(f"RTSP server answered {answer!r} to {command!r}")

    def pause(self) -> None:
        """Stall every stream: sessions and sockets open, no data."""
        self.command("pause")

    def resume(self) -> None:
        """Let the streams flow again."""
        self.command("resume")

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crashed camera would go."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        self.proc = None

    def _stop_and_stderr(self) -> str:
        proc = self.proc
        err = ""
        if proc is not None and proc.stderr is not None:
            self.kill_quietly()
            err = proc.stderr.read() if not proc.stderr.closed else ""
        return err

    def kill_quietly(self) -> None:
        """Kill the process without closing its pipes."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop(self) -> None:
        """Ask the server to quit; kill it if it does not within a few seconds."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None and proc.stdin is not None:
            try:
                proc.stdin.write("quit\n")
                proc.stdin.flush()
                proc.wait(timeout=3)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def restart(self) -> None:
        """Start again on the same port (after :meth:`kill` or :meth:`stop`)."""
        self.kill()
        self.start()


@pytest.fixture(scope="session")
def rtsp_videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Test videos, made once a session: ``h264`` and ``h265`` (640x360, 15 fps, 60 s),
    ``short`` (H.264, 2 s), ``small`` (H.264, 320x180) and ``change`` (H.264 MPEG-TS,
    640x360 then 320x180)."""
    d = tmp_path_factory.mktemp("rtsp-videos")
    return {
        "h264": make_video(d / "h264.mp4", "h264"),
        "h265": make_video(d / "h265.mp4", "h265", seconds=30),
        "short": make_video(d / "short.mp4", "h264", seconds=2),
        "small": make_video(d / "small.mp4", "h264", width=320, height=180, seconds=30),
        "change": make_resolution_change(d / "change.ts"),
    }


@pytest.fixture
def rtsp_server(rtsp_videos: dict[str, Path]) -> Iterator[RtspServer]:
    """A started server with mounts ``/h264``, ``/h265``, ``/short``, ``/small`` and
    ``/change`` (see :func:`rtsp_videos`), no authentication; stopped after the test."""
    server = RtspServer(
        {f"/{k}": (v, "h265" if k == "h265" else "h264") for k, v in rtsp_videos.items()}
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_rtsp_server(
    rtsp_videos: dict[str, Path],
) -> Iterator[Callable[..., RtspServer]]:
    """``make_rtsp_server(user=..., password=...)``: a started server with mount ``/h264``
    (and any other options of :class:`RtspServer`); every one is stopped after the test."""
    started: list[RtspServer] = []

    def make(**options: str) -> RtspServer:
        server = RtspServer({"/h264": (rtsp_videos["h264"], "h264")}, **options)  # type: ignore[arg-type]
        started.append(server)
        server.start()
        return server

    try:
        yield make
    finally:
        for server in started:
            server.stop()
