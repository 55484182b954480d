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

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

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
LIVE_SCHEMES = {
    "rtsp": "rtsp",
    "rtsps": "rtsp",
    "http": "http",
    "https": "http",
    "genicam": "genicam",
}
GENICAM_QUERY = ("pixel_format", "frame_rate", "exposure_us", "packet_size")
"""What a ``genicam://CAMERA?key=value&...`` source may set of ``[cameras.genicam]``."""
GENICAM_TRIGGERS = 50
"""Software triggers fired, one at a time, for the trigger -> frame latency."""


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
        if self.kind == "genicam":
            cam["uri"], cam["genicam"] = genicam_uri(self.uri)
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


def genicam_uri(uri: str) -> tuple[str, dict[str, Any]]:
    """``genicam://CAMERA?pixel_format=BayerRG8&frame_rate=30`` as the camera (serial,
    Aravis id or address) and its ``[cameras.genicam]`` table (validated with the camera).

    Raises:
        AgentError: a query key that is not one of :data:`GENICAM_QUERY`.
    """
    parts = urlsplit(uri)
    table: dict[str, Any] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in GENICAM_QUERY:
            raise AgentError(
                f"bench source {uri}: {key!r} is not one of {', '.join(GENICAM_QUERY)}"
            )
        table[key] = value
    return unquote(parts.netloc + parts.path), table


def _measure_live(src: BenchSource, seconds: float) -> tuple[Image, dict[str, Any]]:
    from agent.capture.sources import make_source  # noqa: PLC0415 - OpenCV's capture, lazily

    if src.kind == "genicam":
        return _measure_genicam(src, seconds)
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


def _measure_genicam(src: BenchSource, seconds: float) -> tuple[Image, dict[str, Any]]:
    """A GenICam camera free-running for ``seconds`` (read as the agent reads it: the
    decode figures, frames delivered against the frame rate it read back, conversion CPU
    per frame), then software-triggered :data:`GENICAM_TRIGGERS` times, one at a time
    (trigger -> frame latency).

    Raises:
        AgentError: the camera does not open or fails (its reason word and why).
    """
    from agent.capture.genicam.source import GenicamSource  # noqa: PLC0415

    config = src.config()
    free = GenicamSource(config)
    try:
        free.open()
        first = _first_live_frame(free.read)
        r = decode_round(free.read, max_frames=DECODE_MAX_FRAMES, max_s=seconds, stop_on_miss=False)
        state = free.state.snapshot()
    except CaptureError as e:
        raise AgentError(f"bench source {src.shown}: {failure_of(e)}: {e.reason}") from None
    finally:
        free.close()
    if not r.frames:
        raise AgentError(f"bench source {src.shown}: stalled: no frame within {seconds:g} s")
    rate = float(state["read_back"].get("AcquisitionFrameRate") or 0) or None
    figures = summarize(r, live=True, fps=rate)
    genicam: dict[str, Any] = {
        "frames_delivered": r.frames,
        "frames_expected": round(rate * r.elapsed_s) if rate else None,
        "frame_rate": rate,
        "incomplete_frames": state["incomplete_frames"],
        "convert_cpu_per_frame_ms": state["convert_cpu_per_frame_ms"],
        "pixel_format": state["read_back"].get("PixelFormat", ""),
        "clock_error_us": state["clock"]["error_us"],
    }
    genicam.update(_trigger_latency(config.model_copy(update={
        "trigger_mode": "software",
        "genicam": config.genicam_config.model_copy(update={"frame_rate": None}),
    })))  # fmt: skip
    return first, {**figures, "genicam": genicam}


def _trigger_latency(config: CameraConfig) -> dict[str, Any]:
    from agent.capture.genicam.source import GenicamSource  # noqa: PLC0415

    source = GenicamSource(config)
    lat_ms: list[float] = []
    try:
        source.open()
        for _ in range(GENICAM_TRIGGERS):
            t0 = time.perf_counter_ns()
            image = source.read()
            if image is not None:
                lat_ms.append((time.perf_counter_ns() - t0) / 1e6)
    except CaptureError as e:
        return {"trigger_error": f"{failure_of(e)}: {e.reason}"}
    finally:
        source.close()
    lat_ms.sort()
    return {
        "triggers": GENICAM_TRIGGERS,
        "triggers_answered": len(lat_ms),
        "trigger_to_frame_ms_p50": round(statistics.median(lat_ms), 3) if lat_ms else None,
        "trigger_to_frame_ms_max": round(lat_ms[-1], 3) if lat_ms else None,
    }
