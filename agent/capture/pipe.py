"""Video decoded in a child process that writes raw BGR frames of a known size to a pipe.

For what OpenCV's in-process FFmpeg can't do: VAAPI (Debian's ``ffmpeg -hwaccel vaapi``;
the FFmpeg inside the opencv-python wheel is built without it), NVDEC on Jetson
(GStreamer's ``nvv4l2decoder`` through ``gst-launch-1.0``; the wheel has no GStreamer),
and decoding only the key frames (``ffmpeg -skip_frame nokey``; OpenCV passes no decoder
options). The child scales every frame to the size the stream first had, so a resolution
change mid-stream keeps each frame whole on the pipe.

The URL with its password is on the child's command line, which other users can read in
``/proc`` unless the service hides it: the agent's systemd unit sets
``ProtectProc=invisible``.
"""

from __future__ import annotations

import io
import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from agent.capture.config import CameraConfig
from agent.capture.rtsp import SourceFailure, password, plain_zone, stream_url
from agent.capture.sources import Image, Source, redact

logger = logging.getLogger(__name__)

_STDERR_LINES = 20
_STOP_WAIT_S = 2.0
_REASONS = (
    # (words in the child's error output, reason word) -- first match wins
    (("401", "unauthorized"), "unauthorized"),
    (("404", "not found"), "not_found"),
    (("connection refused",), "refused"),
    (("no route to host", "network is unreachable"), "unreachable"),
    (("timed out", "timeout"), "timeout"),
)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What the stream was when first opened: the pipe's frame size and the codec."""

    width: int
    height: int
    codec: str  # "h264", "h265" or "" when OpenCV did not say


def _socket_timeout_us(config: CameraConfig) -> int:
    """The child's own socket timeout: past the open and stall timeouts, so that the
    agent's (which give the reason word) fire first."""
    return int((config.open_timeout_s + config.stall_timeout_s) * 1e6)


def failure_from(stderr: str) -> str:
    """The reason word of a child's error output (``ended`` when nothing says more)."""
    text = stderr.lower()
    for words, reason in _REASONS:
        if any(w in text for w in words):
            return reason
    return "ended"


def ffmpeg_argv(
    config: CameraConfig,
    info: StreamInfo,
    *,
    vaapi_device: str | None,
    keyframes_only: bool,
) -> list[str]:
    """``ffmpeg`` reading the camera and writing BGR frames of ``info``'s size to stdout.

    Raises:
        SourceFailure: the password's secret is missing.
    """
    argv = ["ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error"]
    if config.transport != "auto":
        argv += ["-rtsp_transport", config.transport]
    argv += ["-timeout", str(_socket_timeout_us(config))]
    if vaapi_device is not None:
        argv += ["-hwaccel", "vaapi", "-hwaccel_device", vaapi_device]
    if keyframes_only:
        argv += ["-skip_frame", "nokey"]
    argv += ["-i", stream_url(config), "-an", "-sn", "-dn"]
    argv += ["-vf", f"scale={info.width}:{info.height}", "-pix_fmt", "bgr24"]
    return [*argv, "-f", "rawvideo", "pipe:1"]


def gst_argv(config: CameraConfig, info: StreamInfo, decoder: str, convert: str) -> list[str]:
    """``gst-launch-1.0`` reading the RTSP camera through ``decoder`` (and ``convert``, the
    element that copies frames out of device memory) and writing BGR frames to stdout.

    Raises:
        SourceFailure: the stream's codec is not H.264 or H.265, or the password's secret
            is missing.
    """
    if info.codec not in ("h264", "h265"):
        raise SourceFailure(
            config.name, "unknown", f"gstreamer decodes H.264 and H.265, not {info.codec!r}"
        )
    parts = urlsplit(plain_zone(config.stream_uri))
    location = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    protocols = {"tcp": "tcp", "udp": "udp", "auto": "udp+tcp"}[config.transport]
    src = [
        "rtspsrc",
        f"location={location}",
        f"protocols={protocols}",
        "latency=200",
        f"tcp-timeout={_socket_timeout_us(config)}",
    ]
    if config.username:
        src.append(f"user-id={config.username}")
        secret = password(config)
        if secret:
            src.append(f"user-pw={secret}")
    chain = [f"rtp{info.codec}depay", f"{info.codec}parse", decoder]
    if convert:
        chain += convert.split(" ! ")
    caps = f"video/x-raw,format=BGR,width={info.width},height={info.height}"
    chain += ["videoconvert", "videoscale", caps, "fdsink fd=1 sync=false"]
    argv = ["gst-launch-1.0", "-q", *src]
    for element in chain:
        argv += ["!", *element.split(" ")]
    return argv


def printable(argv: list[str]) -> str:
    """``argv`` for a log line: URLs and ``user-pw`` without the password."""
    out = []
    for arg in argv:
        if arg.startswith("user-pw="):
            out.append("user-pw=***")
        elif "://" in arg:
            out.append(redact(arg))
        else:
            out.append(arg)
    return " ".join(out)


class PipeSource(Source):
    """Frames from a decoder child process (see the module docstring).

    ``open`` starts the child and waits up to ``open_timeout_s`` for the first frame;
    ``read`` waits up to ``stall_timeout_s`` for each next one. A child that exits or
    stalls raises :class:`SourceFailure` with the reason word its error output gives.
    """

    live = True

    def __init__(self, config: CameraConfig, argv: list[str], info: StreamInfo) -> None:
        super().__init__(config)
        self.argv = argv
        self.info = info
        self._frame_bytes = info.width * info.height * 3
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: deque[str] = deque(maxlen=_STDERR_LINES)
        self._pending: Image | None = None

    def open(self) -> None:
        c = self.config
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
            )
        except OSError as e:
            raise SourceFailure(c.name, "unknown", f"can't start {self.argv[0]}: {e}") from e
        threading.Thread(
            target=self._drain_stderr, name=f"camera-{c.name}-stderr", daemon=True
        ).start()
        self._pending = self._frame(c.open_timeout_s, opening=True)

    def _drain_stderr(self) -> None:
        proc = self._proc
        if proc is None or proc.stderr is None:
            return
        with proc.stderr:  # closed here, once the child closed its end (exited)
            for raw in proc.stderr:
                line = raw.decode("utf-8", "replace").strip()
                if line:
                    self._stderr.append(line)

    def _why(self) -> str:
        return " | ".join(redact(line) for line in self._stderr) or "no error output"

    def _frame(self, timeout_s: float, *, opening: bool = False) -> Image:
        c = self.config
        proc = self._proc
        if proc is None or proc.stdout is None:
            raise SourceFailure(c.name, "unknown", "read before open")
        image = np.empty((self.info.height, self.info.width, 3), np.uint8)
        view = image.data.cast("B")
        stream = cast("io.RawIOBase", proc.stdout)
        got = 0
        deadline = time.monotonic() + timeout_s
        while got < self._frame_bytes:
            left = deadline - time.monotonic()
            ready = select.select([proc.stdout], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                failure = "timeout" if opening else "stalled"
                raise SourceFailure(
                    c.name, failure, f"{self.argv[0]}: no frame for {timeout_s:g} s"
                )
            n = stream.readinto(view[got:])
            if not n:  # the child closed its output: it exited
                try:
                    rc = proc.wait(timeout=_STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    rc = None
                time.sleep(0.05)  # its last words may still be on their way to the log
                why = self._why()
                raise SourceFailure(
                    c.name, failure_from(why), f"{self.argv[0]} exited ({rc}): {why}"
                )
            got += n
        return image

    def read(self) -> Image | None:
        if self._pending is not None:
            image, self._pending = self._pending, None
            return image
        return self._frame(self.config.stall_timeout_s)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        self._pending = None
        if proc is None:
            return
        if proc.stdout is not None:
            proc.stdout.close()  # first: a child blocked writing a frame gets EPIPE
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=_STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=_STOP_WAIT_S)
        except ProcessLookupError:
            logger.debug("camera %s: %s exited before its stop", self.config.name, self.argv[0])
