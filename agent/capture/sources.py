"""Per-kind frame readers behind one small interface: ``open``, ``read``, ``close``.

OpenCV reads devices (``CAP_V4L2``) and URLs and files (``CAP_FFMPEG``); network streams
get open and read timeouts so a dead server can't hang the capture thread.
"""

from __future__ import annotations

import functools
import logging
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import cv2
import numpy as np
import numpy.typing as npt

from agent.capture.config import CameraConfig
from agent.capture.rtsp import FfmpegOptions, SourceFailure, ffmpeg_options, probe, stream_url
from agent.capture.synthetic import Pattern
from agent.errors import CaptureError

logger = logging.getLogger(__name__)

Image = npt.NDArray[np.uint8]

IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pnm"}
)
_LIVE_KINDS = frozenset({"v4l2", "rtsp", "http"})
_PROBED_KINDS = frozenset({"rtsp", "http"})  # failures with a reason word


@functools.cache
def _ffmpeg_options() -> FfmpegOptions:
    return FfmpegOptions()


class EndOfStream(CaptureError):
    """A video file or image directory that is not looped has been played to its end."""


def redact(uri: str) -> str:
    """``uri`` without the password of any ``user:password@`` part, for logs and errors."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if "@" not in parts.netloc:
        return uri
    user, _, host = parts.netloc.rpartition("@")
    name = user.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))


def as_bgr(image: npt.NDArray[Any], camera: str) -> Image:
    """``image`` as HxWx3 uint8 BGR (gray and BGRA are converted)."""
    if image.dtype != np.uint8:
        raise CaptureError(camera, f"frame has dtype {image.dtype}, expected uint8")
    if image.ndim == 2:
        return np.asarray(cv2.cvtColor(image, cv2.COLOR_GRAY2BGR), np.uint8)
    if image.ndim == 3 and image.shape[2] == 4:
        return np.asarray(cv2.cvtColor(image, cv2.COLOR_BGRA2BGR), np.uint8)
    if image.ndim == 3 and image.shape[2] == 3:
        return np.asarray(image, np.uint8)
    raise CaptureError(camera, f"frame has shape {image.shape}, expected HxWx3")


class Source(ABC):
    """One capture source. ``read`` blocks at most about the configured timeouts.

    Attributes:
        last_damaged: see below.
        live: True for sources that deliver at their own pace (devices, streams); the
            camera reads them as fast as they come. False for files, images and
            patterns, which the camera reads at its target fps.
    """

    live: bool = False
    last_damaged: bool = False
    """The frame ``read`` returned last was decoded with damage its decoder reported
    (:mod:`agent.capture.damage`; only sources that count damage set it)."""
    last_stamp: tuple[int, float] | None = None
    """When the frame ``read`` returned last was taken, as ``(perf_counter_ns, time.time())``,
    for a source that knows it better than the moment ``read`` returned (a GenICam
    camera's own timestamp); None: the moment ``read`` returned."""
    last_clock: str = "host"
    """Where ``last_stamp`` came from (:attr:`agent.capture.frame.Frame.clock`)."""
    waits_for_trigger: bool = False
    """``read`` returning None is a trigger line that is idle, not a stall: the source
    checks its own link (a hardware-triggered GenICam camera)."""

    def __init__(self, config: CameraConfig) -> None:
        self.config = config

    @abstractmethod
    def open(self) -> None:
        """Open (or reopen) the source.

        Raises:
            CaptureError: it can't be opened; the message says why.
        """

    @abstractmethod
    def read(self) -> Image | None:
        """The next frame, or None when there is none this time (try again).

        Raises:
            EndOfStream: a file or directory played once is over.
            CaptureError: the source failed (disconnected, timed out, unreadable).
        """

    @abstractmethod
    def close(self) -> None:
        """Release the source; safe to call more than once."""


class SyntheticSource(Source):
    """A generated pattern; every read is a new frame."""

    def __init__(self, config: CameraConfig) -> None:
        super().__init__(config)
        self._pattern: Pattern | None = None
        self._n = 0

    def open(self) -> None:
        c = self.config
        self._pattern = Pattern(c.width, c.height, c.pattern)

    def read(self) -> Image | None:
        if self._pattern is None:
            raise CaptureError(self.config.name, "synthetic source read before open")
        image = self._pattern.render(self._n)
        self._n += 1
        return image

    def close(self) -> None:
        self._pattern = None


class VideoCaptureSource(Source):
    """An OpenCV ``VideoCapture``: a V4L2 device, an RTSP or HTTP stream, a video file.

    Streams open with ``CAP_PROP_OPEN_TIMEOUT_MSEC`` (``open_timeout_s``) and read with
    ``CAP_PROP_READ_TIMEOUT_MSEC`` (``stall_timeout_s``); OpenCV honours these for FFmpeg
    only, so a V4L2 read is bounded by OpenCV's own device timeout (10 s by default).
    A stream failure carries its reason word (:class:`SourceFailure`): a failed RTSP open
    is probed for it; a read that ran into the read timeout is ``stalled`` (OpenCV then
    still hands out the frames its decoder held back, one per timeout), a read that
    found the stream over is ``ended``.
    """

    def __init__(self, config: CameraConfig, *, extra_options: str = "") -> None:
        super().__init__(config)
        self.live = config.kind in _LIVE_KINDS
        self.extra_options = extra_options
        self._cap: cv2.VideoCapture | None = None
        self._frames_since_open = 0

    @property
    def capture(self) -> cv2.VideoCapture | None:
        """The open OpenCV capture (None when closed), for its properties."""
        return self._cap

    def open(self) -> None:
        c = self.config
        if c.kind == "file" and not Path(c.uri).is_file():
            raise CaptureError(c.name, f"video file {c.uri} does not exist")
        t0 = time.monotonic()
        try:
            cap = self._create()
        except cv2.error as e:
            raise CaptureError(c.name, f"can't open {redact(c.stream_uri)}: {e}") from e
        if not cap.isOpened():
            cap.release()
            if c.kind in _PROBED_KINDS:
                raise self._open_failure(time.monotonic() - t0)
            raise CaptureError(c.name, f"can't open {c.kind} source {redact(c.uri)}")
        if c.kind == "v4l2":
            cap.set(cv2.CAP_PROP_FRAME_WIDTH, c.width)
            cap.set(cv2.CAP_PROP_FRAME_HEIGHT, c.height)
        self._cap = cap
        self._frames_since_open = 0

    def _open_failure(self, elapsed_s: float) -> SourceFailure:
        c = self.config
        if elapsed_s >= c.open_timeout_s * 0.95:
            failure, detail = "timeout", f"no stream within {c.open_timeout_s:g} s"
        else:
            failure, detail = probe(c, c.open_timeout_s)
        where = redact(c.stream_uri)
        return SourceFailure(c.name, failure, f"can't open {where}: {detail} ({failure})")

    def _create(self) -> cv2.VideoCapture:
        c = self.config
        if c.kind == "v4l2":
            device: int | str = int(c.uri) if c.uri.isdigit() else c.uri
            return cv2.VideoCapture(device, cv2.CAP_V4L2)
        if c.kind == "file":
            return cv2.VideoCapture(c.uri, cv2.CAP_FFMPEG)
        params = [
            cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
            int(c.open_timeout_s * 1000),
            cv2.CAP_PROP_READ_TIMEOUT_MSEC,
            int(c.stall_timeout_s * 1000),
        ]
        url = stream_url(c)
        if c.kind != "rtsp":
            return cv2.VideoCapture(url, cv2.CAP_FFMPEG, params)
        options = "|".join(o for o in (ffmpeg_options(c), self.extra_options) if o)
        with _ffmpeg_options().use(options, c.open_timeout_s + 5):
            return cv2.VideoCapture(url, cv2.CAP_FFMPEG, params)

    def _read_once(self) -> Image | None:
        if self._cap is None:
            raise CaptureError(self.config.name, "read before open")
        ok, image = self._cap.read()
        if not ok or image is None:
            return None
        self._frames_since_open += 1
        return as_bgr(image, self.config.name)

    def read(self) -> Image | None:
        c = self.config
        t0 = time.monotonic()
        image = self._read_once()
        if c.kind in _PROBED_KINDS and time.monotonic() - t0 >= c.stall_timeout_s * 0.95:
            raise SourceFailure(
                c.name,
                "stalled",
                f"no data from {redact(c.stream_uri)} for {c.stall_timeout_s:g} s",
            )
        if image is not None:
            return image
        if c.kind in _PROBED_KINDS:
            raise SourceFailure(c.name, "ended", f"stream {redact(c.stream_uri)} ended or dropped")
        if c.kind != "file":
            raise CaptureError(
                c.name, f"no frame from {redact(c.uri)} (disconnected, ended or timed out)"
            )
        if self._frames_since_open == 0:
            raise CaptureError(c.name, f"video file {c.uri} has no readable frame")
        if not c.loop:
            raise EndOfStream(c.name, f"end of video file {c.uri}")
        self.close()
        self.open()
        image = self._read_once()
        if image is None:
            raise CaptureError(c.name, f"video file {c.uri} has no readable frame")
        return image

    def close(self) -> None:
        if self._cap is not None:
            self._cap.release()
            self._cap = None


class ImageDirSource(Source):
    """The images of a directory in name order; an unreadable one is logged and skipped."""

    def __init__(self, config: CameraConfig) -> None:
        super().__init__(config)
        self._files: list[Path] = []
        self._index = 0
        self.unreadable = 0

    def _list(self) -> list[Path]:
        c = self.config
        directory = Path(c.uri)
        if not directory.is_dir():
            raise CaptureError(c.name, f"image directory {c.uri} does not exist")
        files = sorted(
            p for p in directory.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
        )
        if not files:
            raise CaptureError(c.name, f"no images in {c.uri}")
        return files

    def open(self) -> None:
        self._files = self._list()
        self._index = 0

    def read(self) -> Image | None:
        c = self.config
        if not self._files:
            raise CaptureError(c.name, "read before open")
        if self._index >= len(self._files):
            if not c.loop:
                raise EndOfStream(c.name, f"end of image directory {c.uri}")
            self._files = self._list()
            self._index = 0
        path = self._files[self._index]
        self._index += 1
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            self.unreadable += 1
            logger.warning("camera %s: skipping unreadable image %s", c.name, path)
            return None
        return as_bgr(image, c.name)

    def close(self) -> None:
        self._files = []
        self._index = 0


def make_source(config: CameraConfig) -> Source:
    """The reader for ``config.kind``, not yet opened."""
    if config.kind == "synthetic":
        return SyntheticSource(config)
    if config.kind == "images":
        return ImageDirSource(config)
    return VideoCaptureSource(config)


def open_source(config: CameraConfig) -> Source:
    """The reader for ``config.kind``, opened.

    Raises:
        CaptureError: the source can't be opened; the message says why.
    """
    source = make_source(config)
    source.open()
    return source
