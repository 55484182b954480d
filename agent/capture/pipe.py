"""Video decoded in a child process that writes raw BGR frames of a known size to a pipe.

For what OpenCV's in-process FFmpeg can't do: VAAPI (Debian's ``ffmpeg -hwaccel vaapi``;
the FFmpeg inside the opencv-python wheel is built without it), NVDEC on Jetson
(GStreamer's ``nvv4l2decoder`` through ``gst-launch-1.0``; the wheel has no GStreamer),
and decoding only the key frames (``ffmpeg -skip_frame nokey``; OpenCV passes no decoder
options). The child scales every frame to the size the stream first had, so a resolution
change mid-stream keeps each frame whole on the pipe.

No secret is on a child's command line (``/proc/<pid>/cmdline``, which any local user can
read) or in its environment: ffmpeg reads the camera's URL, with its user and password,
from a two-line ``ffconcat`` list written to its stdin (``-f concat -i pipe:0``); a
GStreamer pipeline for a camera with a password reads the stream from such an ffmpeg
child (``-c:v copy``) through ``fdsrc`` instead of ``rtspsrc user-pw=``. Each child gets
only the environment variables a decoder needs (:func:`child_env`), none that holds a
camera's secret. Its error output is scrubbed of the secret before it is logged or kept.
"""

from __future__ import annotations

import io
import logging
import os
import re
import select
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote, urlsplit, urlunsplit

import numpy as np

from agent.capture.config import CameraConfig
from agent.capture.damage import Damage
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


_PROTOCOLS = "pipe,tcp,udp,rtp,tls,crypto,data"
"""What ffmpeg may open: the list on its stdin, then the camera's RTSP (or RTSPS) stream."""
_ENV_KEEP = frozenset(
    {"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "XDG_RUNTIME_DIR"}
)
_ENV_KEEP_PREFIXES = ("LC_", "GST_", "LIBVA_", "CUDA_", "NVIDIA_", "ORC_")
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/@:'\"]*):[^\s/@'\"]*@")


@dataclass(frozen=True, slots=True)
class Stage:
    """One decoder child: its command line (never a secret) and what is written to its
    stdin before that is closed (``None``: its stdin is the previous stage's output, or
    nothing for the first)."""

    argv: list[str]
    stdin: bytes | None = None


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


def ffconcat(config: CameraConfig) -> bytes:
    """The ``ffconcat`` list that gives ffmpeg the camera's URL, with its user and password,
    and the RTSP options, on its stdin.

    Every byte of the URL that could end the quoted string or the line (a quote, a
    backslash, a space, a control character, anything beyond ASCII) is percent-encoded, so
    that nothing in the configured URL can add a line (an option) to the list.

    Raises:
        SourceFailure: the password's secret is missing.
    """
    url = "".join(
        ch if 0x21 <= ord(ch) < 0x7F and ch not in "'\\" else quote(ch, safe="")
        for ch in stream_url(config)
    )
    lines = ["ffconcat version 1.0", f"file '{url}'"]
    if config.transport != "auto":
        lines.append(f"option rtsp_transport {config.transport}")
    lines.append(f"option timeout {_socket_timeout_us(config)}")
    return ("\n".join(lines) + "\n").encode("ascii")


def _ffmpeg_input(config: CameraConfig) -> list[str]:
    """ffmpeg's options that read the camera through the list on its stdin."""
    return ["-protocol_whitelist", _PROTOCOLS, "-f", "concat", "-safe", "0", "-i", "pipe:0"]


def ffmpeg_argv(
    config: CameraConfig,
    info: StreamInfo,
    *,
    vaapi_device: str | None,
    keyframes_only: bool,
) -> list[Stage]:
    """``ffmpeg`` reading the camera (its URL on stdin: :func:`ffconcat`) and writing BGR
    frames of ``info``'s size to stdout.

    Raises:
        SourceFailure: the password's secret is missing.
    """
    argv = ["ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "warning"]
    if vaapi_device is not None:
        argv += ["-hwaccel", "vaapi", "-hwaccel_device", vaapi_device]
    if keyframes_only:
        argv += ["-skip_frame", "nokey"]
    argv += [*_ffmpeg_input(config), "-an", "-sn", "-dn"]
    argv += ["-vf", f"scale={info.width}:{info.height}", "-pix_fmt", "bgr24"]
    return [Stage([*argv, "-f", "rawvideo", "pipe:1"], ffconcat(config))]


def gst_argv(config: CameraConfig, info: StreamInfo, decoder: str, convert: str) -> list[Stage]:
    """``gst-launch-1.0`` decoding the RTSP camera through ``decoder`` (and ``convert``, the
    element that copies frames out of device memory) and writing BGR frames to stdout.

    The stream comes from ``rtspsrc``; for a camera with a password, from an ``ffmpeg``
    child that reads the camera (its URL on stdin, :func:`ffconcat`) and copies the video
    to ``fdsrc``, since ``rtspsrc`` takes the password only on the command line.

    Raises:
        SourceFailure: the stream's codec is not H.264 or H.265, or the password's secret
            is missing.
    """
    if info.codec not in ("h264", "h265"):
        raise SourceFailure(
            config.name, "unknown", f"gstreamer decodes H.264 and H.265, not {info.codec!r}"
        )
    chain = [f"{info.codec}parse", decoder]
    if convert:
        chain += convert.split(" ! ")
    caps = f"video/x-raw,format=BGR,width={info.width},height={info.height}"
    chain += ["videoconvert", "videoscale", caps, "fdsink fd=1 sync=false"]
    stages: list[Stage] = []
    if password(config):
        muxer = {"h264": "h264", "h265": "hevc"}[info.codec]
        copy = ["ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error"]
        copy += [*_ffmpeg_input(config), "-map", "0:v:0", "-c:v", "copy"]
        copy += ["-bsf:v", "dump_extra", "-f", muxer, "pipe:1"]
        stages.append(Stage(copy, ffconcat(config)))
        src = ["fdsrc", "fd=0"]
    else:
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
        chain.insert(0, f"rtp{info.codec}depay")
    argv = ["gst-launch-1.0", "-q", *src]
    for element in chain:
        argv += ["!", *element.split(" ")]
    return [*stages, Stage(argv)]


def printable(stages: Iterable[Stage]) -> str:
    """The children's command lines for a log line, joined by ``|`` (they hold no secret)."""
    return " | ".join(" ".join(stage.argv) for stage in stages)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` (a child's error output) without the ``secrets`` (as they are and as they
    are written in a URL) and without the password of any ``scheme://user:password@``."""
    for secret in secrets:
        if secret:
            for form in {secret, quote(secret, safe=""), quote(secret)}:
                text = text.replace(form, "***")
    return _URL_PASSWORD.sub(r"\1:***@", text)


def child_env(secrets: Iterable[str] = (), names: Iterable[str] = ()) -> dict[str, str]:
    """The environment a decoder child gets: the locale, the paths and the variables of
    GStreamer, VA-API and CUDA, and nothing else (the agent's own variables, which may
    hold secrets, stay with it); no variable named in ``names`` (the camera's
    ``password_env``) and none whose value holds one of ``secrets``."""
    drop = set(names)
    held = [s for s in secrets if s]
    return {
        key: value
        for key, value in os.environ.items()
        if (key in _ENV_KEEP or key.startswith(_ENV_KEEP_PREFIXES))
        and key not in drop
        and not any(s in value for s in held)
    }


class PipeSource(Source):
    """Frames from decoder child processes (see the module docstring): ``stages``, each
    one's output the next one's input, the last one's output BGR frames.

    ``open`` starts the children and waits up to ``open_timeout_s`` for the first frame;
    ``read`` waits up to ``stall_timeout_s`` for each next one. A child that exits or
    stalls raises :class:`SourceFailure` with the reason word its error output gives.
    """

    live = True

    def __init__(
        self,
        config: CameraConfig,
        stages: list[Stage],
        info: StreamInfo,
        damage: Damage | None = None,
    ) -> None:
        super().__init__(config)
        self.stages = stages
        self.damage = damage
        """Counts what the last child says of damage (an ffmpeg child), read with the frames."""
        self._err_buf = b""
        self.info = info
        self.program = " | ".join(stage.argv[0] for stage in stages)
        self._frame_bytes = info.width * info.height * 3
        self._procs: list[subprocess.Popen[bytes]] = []
        self._stderr: deque[str] = deque(maxlen=_STDERR_LINES)
        self._pending: Image | None = None
        self._secrets: tuple[str, ...] = ()

    @property
    def _proc(self) -> subprocess.Popen[bytes] | None:
        """The last child: the one whose output is the frames."""
        return self._procs[-1] if self._procs else None

    def open(self) -> None:
        c = self.config
        self._secrets = (password(c),)
        env = child_env(self._secrets, (c.password_env,) if c.password_env else ())
        previous: subprocess.Popen[bytes] | None = None
        try:
            for stage in self.stages:
                stdin: int | io.BufferedReader | None = subprocess.DEVNULL
                if stage.stdin is not None:
                    stdin = subprocess.PIPE
                elif previous is not None:
                    stdin = cast("io.BufferedReader", previous.stdout)
                proc = subprocess.Popen(
                    stage.argv,
                    stdin=stdin,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    bufsize=0,
                    start_new_session=True,
                )
                self._procs.append(proc)
                if previous is not None and previous.stdout is not None:
                    previous.stdout.close()  # the next child holds it now
                if stage.stdin is not None and proc.stdin is not None:
                    with proc.stdin:  # a few hundred bytes: within the pipe's buffer
                        proc.stdin.write(stage.stdin)
                if self.damage is None or stage is not self.stages[-1]:
                    threading.Thread(
                        target=self._drain_stderr, args=(proc,), name=f"camera-{c.name}-stderr",
                        daemon=True,
                    ).start()  # fmt: skip
                previous = proc
        except OSError as e:
            self.close()
            raise SourceFailure(c.name, "unknown", f"can't start {self.program}: {e}") from e
        self._pending = self._frame(c.open_timeout_s, opening=True)

    def _drain_stderr(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.stderr is None:
            return
        with proc.stderr:  # closed here, once the child closed its end (exited)
            for raw in proc.stderr:
                line = raw.decode("utf-8", "replace").strip()
                if line:
                    self._stderr.append(scrub(line, self._secrets))

    def _keep(self, line: str) -> None:
        line = scrub(line, self._secrets)
        self._stderr.append(line)
        if self.damage is not None:
            self.damage.line(line)

    def _read_errors(self, proc: subprocess.Popen[bytes], wait_s: float = 0.0) -> bool:
        """Read what the last child wrote to its error output (when its damage is counted,
        in the capture thread, so that damage reported before a frame is seen with it);
        False at its end."""
        err = proc.stderr
        if self.damage is None or err is None or err.closed:
            return False
        for _ in range(64):  # bounded: 4 MiB at most per call
            if not select.select([err], [], [], wait_s)[0]:
                break
            chunk = os.read(err.fileno(), 65536)
            if not chunk:
                if self._err_buf:
                    self._keep(self._err_buf.decode("utf-8", "replace").strip())
                    self._err_buf = b""
                err.close()
                return False
            *lines, self._err_buf = (self._err_buf + chunk).split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").strip()
                if line:
                    self._keep(line)
            if len(self._err_buf) > 65536:  # a line without end: keep its start
                self._keep(self._err_buf[:512].decode("utf-8", "replace"))
                self._err_buf = b""
        return True

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
        watch: list[io.BufferedReader] = [cast("io.BufferedReader", proc.stdout)]
        if self.damage is not None and proc.stderr is not None and not proc.stderr.closed:
            watch.append(cast("io.BufferedReader", proc.stderr))
        while got < self._frame_bytes:
            left = deadline - time.monotonic()
            ready = select.select(watch, [], [], max(0.0, left))[0] if left > 0 else []
            if proc.stderr is not None and proc.stderr in ready:
                if not self._read_errors(proc):
                    watch = watch[:1]
                if proc.stdout not in ready:
                    continue
            if not ready:
                failure = "timeout" if opening else "stalled"
                raise SourceFailure(
                    c.name, failure, f"{self.program}: no frame for {timeout_s:g} s"
                )
            n = stream.readinto(view[got:])
            if not n:  # the child closed its output: it exited
                try:
                    rc = proc.wait(timeout=_STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    rc = None
                time.sleep(0.05)  # its last words may still be on their way to the log
                self._read_errors(proc, wait_s=0.2)
                why = self._why()
                raise SourceFailure(
                    c.name, failure_from(why), f"{self.program} exited ({rc}): {why}"
                )
            got += n
        if self.damage is not None:
            self._read_errors(proc)  # what it said before this frame was written
            self.last_damaged = self.damage.frame()
        return image

    def read(self) -> Image | None:
        if self._pending is not None:
            image, self._pending = self._pending, None
            return image
        return self._frame(self.config.stall_timeout_s)

    def close(self) -> None:
        procs, self._procs = self._procs, []
        self._pending = None
        for proc in reversed(procs):  # the reader first: a child blocked writing gets EPIPE
            if proc.stdout is not None:
                proc.stdout.close()
        for proc in reversed(procs):
            self._stop(proc)

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=_STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=_STOP_WAIT_S)
        except ProcessLookupError:
            logger.debug("camera %s: %s exited before its stop", self.config.name, proc.args)
