"""The source ``edge-agent bench`` captures from: a video file or a live stream (``rtsp://``,
``rtsps://``, ``http(s)://`` MJPEG), opened the way the agent opens its cameras, and what
decoding it costs (:mod:`agent.decodecost`).

A file is decoded as fast as it goes for at most :data:`DECODE_MAX_S` (and
:data:`DECODE_MAX_FRAMES`); a live stream is read at its own rate for the bench's decode
window, through the agent's own capture source (:class:`~agent.capture.sources.
VideoCaptureSource`: same transport option, same credentials from ``password_env``, same
timeouts). A stream that does not open is an :class:`~agent.errors.AgentError` naming the
URL (password redacted) and the failure's reason word (``refused``, ``unauthorized``,
``not_found``, ``timeout``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from pydantic import ValidationError

from agent.capture.config import CameraConfig
from agent.capture.rtsp import failure_of
from agent.capture.sources import redact
from agent.decodecost import Image, decode_round, summarize
from agent.errors import AgentError, CaptureError

DECODE_MAX_S = 3.0
"""Longest decode measurement of a file (and, at most, of a live stream)."""
DECODE_MIN_S = 1.0
"""Shortest decode measurement of a live stream (a stream gives only its fps)."""
DECODE_MAX_FRAMES = 600
"""Bound on the frames one decode measurement reads."""
OPEN_TIMEOUT_S = 10.0
STALL_TIMEOUT_S = 5.0
LIVE_SCHEMES = {"rtsp": "rtsp", "rtsps": "rtsp", "http": "http", "https": "http"}


@dataclass(frozen=True)
class BenchSource:
    """What the bench captures from.

    Attributes:
        uri: a video file path or a stream URL (no password in it).
        transport: RTSP transport (tcp, udp, auto).
        username: stream user name; the password comes from the secret ``password_env``.
        password_env: the secret's name ($CREDENTIALS_DIRECTORY file or environment).
    """

    uri: str
    transport: str = "tcp"
    username: str = ""
    password_env: str = ""

    @property
    def kind(self) -> str:
        """``file``, ``rtsp`` or ``http``."""
        scheme = self.uri.split("://", 1)[0].lower() if "://" in self.uri else ""
        return LIVE_SCHEMES.get(scheme, "file")

    @property
    def live(self) -> bool:
        """True for a stream, which delivers at its own rate."""
        return self.kind != "file"

    @property
    def shown(self) -> str:
        """The URI as reports and errors show it (any password redacted)."""
        return redact(self.uri)

    def camera(self, name: str, fps: float, phase: float = 0.0) -> dict[str, Any]:
        """A ``[[cameras]]`` entry reading this source (a file looped at ``fps``; a stream
        publishing every frame it delivers, ``fps`` being only a cap)."""
        if not self.live:
            return {
                "name": name,
                "kind": "file",
                "uri": self.uri,
                "fps": fps,
                "loop": True,
                "phase": phase,
            }
        cam: dict[str, Any] = {
            "name": name,
            "kind": self.kind,
            "uri": self.uri,
            "fps": fps,
            "open_timeout_s": OPEN_TIMEOUT_S,
            "stall_timeout_s": STALL_TIMEOUT_S,
        }
        if self.kind == "rtsp":
            cam["transport"] = self.transport
        if self.username:
            cam["username"] = self.username
        if self.password_env:
            cam["password_env"] = self.password_env
        return cam

    def config(self) -> CameraConfig:
        """This source as the agent's camera configuration.

        Raises:
            AgentError: the URI, transport or credentials are not a valid camera.
        """
        try:
            return CameraConfig.model_validate(self.camera("bench", 1000.0))
        except ValidationError as e:  # its text repeats the input: give the reasons only
            why = "; ".join(str(err["msg"]) for err in e.errors())
            raise AgentError(f"bench source {self.shown}: {why}") from None


def measure_source(src: BenchSource, seconds: float) -> tuple[Image, dict[str, Any]]:
    """Open ``src`` as the agent would, read it for a bounded time and give its first frame
    and its decode figures (:func:`agent.decodecost.summarize`; a file for at most
    :data:`DECODE_MAX_S`, a stream for ``seconds`` clamped to
    [:data:`DECODE_MIN_S`, :data:`DECODE_MAX_S`]).

    Raises:
        AgentError: the file is missing or unreadable, or the stream does not open or
            fails while being read (the message names the URL, password redacted, and the
            failure's reason word).
    """
    if src.live:
        return _measure_live(src, min(DECODE_MAX_S, max(DECODE_MIN_S, seconds)))
    if not Path(src.uri).is_file():
        raise AgentError(f"bench source {src.uri}: no such file")
    cap = cv2.VideoCapture(src.uri, cv2.CAP_FFMPEG)
    try:
        ok, first = cap.read()
        if not ok or first is None:
            raise AgentError(f"bench source {src.uri}: no frame could be read")
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)

        def read() -> Image | None:
            ok, frame = cap.read()
            return np.asarray(frame, np.uint8) if ok and frame is not None else None

        r = decode_round(read, max_frames=DECODE_MAX_FRAMES, max_s=DECODE_MAX_S)
    finally:
        cap.release()
    if not r.frames:  # a one-frame file: its first read is all there is
        r.walls_ms, r.shape = [0.0], tuple(first.shape)
    return np.asarray(first, np.uint8), summarize(r, live=False, fps=fps or None)


def _measure_live(src: BenchSource, seconds: float) -> tuple[Image, dict[str, Any]]:
    from agent.capture.sources import make_source  # noqa: PLC0415 - OpenCV's capture, lazily

    source = make_source(src.config())
    try:
        source.open()
        first = _first_live_frame(source.read)
        r = decode_round(
            source.read, max_frames=DECODE_MAX_FRAMES, max_s=seconds, stop_on_miss=False
        )
    except CaptureError as e:
        reason = getattr(e, "reason", str(e))
        raise AgentError(f"bench source {src.shown}: {failure_of(e)}: {reason}") from None
    finally:
        source.close()
    if not r.frames:
        raise AgentError(f"bench source {src.shown}: ended: no frame within {seconds:g} s")
    return first, summarize(r, live=True)


def _first_live_frame(read: Any) -> Image:
    """The first frame of a just opened stream (a few reads may come back empty).

    Raises:
        CaptureError: as the source's ``read``.
    """
    for _ in range(50):
        frame = read()
        if frame is not None:
            return np.asarray(frame, np.uint8)
    raise CaptureError("bench", "no frame in 50 reads")
