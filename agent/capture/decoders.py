"""Which decoder an RTSP camera's video goes through, with software as the last resort.

The firmware profile's ``[video] decoders`` (or the camera's ``decoder``) lists them best
first:

- ``v4l2m2m``: the SoC's V4L2 memory-to-memory decoder, through OpenCV's own FFmpeg
  (``h264_v4l2m2m``, ``hevc_v4l2m2m``, which the opencv-python wheel has), in process;
- ``vaapi``: an ``ffmpeg -hwaccel vaapi`` child on the profile's render node
  (:mod:`agent.capture.pipe`);
- ``gstreamer``: a ``gst-launch-1.0`` child with the profile's decoder element
  (``nvv4l2decoder`` on Jetson); for a camera with a password, fed by an ``ffmpeg`` child
  that reads the camera (no secret on a command line: :mod:`agent.capture.pipe`);
- ``software``: OpenCV's FFmpeg in process (with ``keyframes_only``: an ``ffmpeg
  -skip_frame nokey`` child; for a camera whose damage is counted, UDP or
  ``damaged_frames = "skip"``: an ``ffmpeg`` child, :mod:`agent.capture.damage`).

A decoder whose program or device is missing is passed over before anything is started.
One that fails to open is tried against software: if the camera opens in software, the
decoder is what failed; it is passed over for this camera's life (a warning says why)
and software runs. If the camera does not open in software either, the camera failed
(with its reason word), and the decoder is tried again on the next reopen. Each change of
the decoder that runs is logged at INFO, and the stats name it.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading

import cv2

from agent.capture.config import CameraConfig, counts_damage
from agent.capture.damage import Damage
from agent.capture.pipe import PipeSource, StreamInfo, ffmpeg_argv, gst_argv, printable
from agent.capture.rtsp import failure_of
from agent.capture.sources import Image, Source, VideoCaptureSource
from agent.errors import CaptureError
from runtime.profiles import VideoConfig

logger = logging.getLogger(__name__)

SOFTWARE = "software"
TIMEOUT_STRIKES = 3
"""Sessions in a row a decoder may give no first frame in, while the camera opens in
software, before it is passed over for the camera's life."""
KEYFRAMES = "keyframes_only"
"""Passed over when key frames alone can't be decoded (no ffmpeg, or its child failed)."""
_CODECS = {"h264": "h264", "avc1": "h264", "x264": "h264", "hevc": "h265", "hev1": "h265"}
_CODECS |= {"hvc1": "h265", "h265": "h265"}
_V4L2M2M = {"h264": "h264_v4l2m2m", "h265": "hevc_v4l2m2m"}


def _fourcc(cap: cv2.VideoCapture) -> str:
    code = int(cap.get(cv2.CAP_PROP_FOURCC))
    return "".join(chr((code >> (8 * i)) & 0xFF) for i in range(4)).strip("\0 ").lower()


class Decoding:
    """One camera's decoder choice, kept across its reopens.

    Attributes:
        chain: the decoders to try, best first, ending with software.
        passed_over: decoders that can't run for this camera, with why.
        running: what decodes now ("" before the first open), e.g. ``vaapi`` or
            ``software (key frames)``.
        info: the stream's size and codec, learned at the first open that needed them.
    """

    def __init__(self, config: CameraConfig, video: VideoConfig) -> None:
        self.camera = config.name
        self.video = video
        wanted = video.decoders if config.decoder == "auto" else (config.decoder,)
        self.chain: tuple[str, ...] = tuple(dict.fromkeys([*wanted, SOFTWARE]))
        self.passed_over: dict[str, str] = {}
        self.running = ""
        self.info: StreamInfo | None = None
        self.damage = Damage()
        self._strikes: dict[str, int] = {}
        self._lock = threading.Lock()

    def candidates(self) -> list[str]:
        """The decoders still to try, best first (software always)."""
        with self._lock:
            return [d for d in self.chain if d == SOFTWARE or d not in self.passed_over]

    def pass_over(self, decoder: str, why: str, *, tried: bool = True) -> None:
        """Don't try ``decoder`` again for this camera; says so once: a warning when it
        was tried and failed, INFO when this device simply lacks it (no GPU node)."""
        with self._lock:
            if decoder in self.passed_over:
                return
            self.passed_over[decoder] = why
        level = logging.WARNING if tried else logging.INFO
        logger.log(level, "camera %s: decoder %s can't run: %s", self.camera, decoder, why)

    def strike(self, decoder: str, *, clear: bool = False) -> int:
        """Count a session ``decoder`` gave no first frame in (``clear``: it delivered);
        the count in a row."""
        with self._lock:
            n = 0 if clear else self._strikes.get(decoder, 0) + 1
            self._strikes[decoder] = n
            return n

    def now_running(self, label: str, how: str) -> None:
        """Record (and log, when it changed) the decoder that runs."""
        with self._lock:
            changed, self.running = self.running != label, label
        if changed:
            logger.info("camera %s: decoding with %s (%s)", self.camera, label, how)


def missing(decoder: str, config: CameraConfig, video: VideoConfig) -> str | None:
    """Why ``decoder`` can't run here at all (None when it may): a program or device node."""
    if decoder == "vaapi":
        if shutil.which("ffmpeg") is None:
            return "no ffmpeg program (Debian package ffmpeg)"
        if not os.path.exists(video.vaapi_device):
            return f"no {video.vaapi_device} (no GPU render node here, or not allowed to it)"
    if decoder == "gstreamer" and (why := _gst_missing(config)):
        return why
    if decoder in ("v4l2m2m", "gstreamer") and config.keyframes_only:
        return "keyframes_only decodes with ffmpeg (vaapi or software)"
    return None


def _gst_missing(config: CameraConfig) -> str | None:
    if config.kind != "rtsp":
        return "gstreamer decodes RTSP cameras only"
    if shutil.which("gst-launch-1.0") is None:
        return "no gst-launch-1.0 program (Debian package gstreamer1.0-tools)"
    if config.password_env and shutil.which("ffmpeg") is None:
        return "no ffmpeg program, which reads a camera with a password for gstreamer"
    return None


def learn(config: CameraConfig) -> StreamInfo:
    """The stream's size and codec, from one frame read in software.

    Raises:
        CaptureError: the camera can't be opened or gave no frame (its reason word kept).
    """
    source = VideoCaptureSource(config)
    source.open()
    try:
        image = source.read()
        if image is None:
            raise CaptureError(config.name, "no frame to learn the stream's size from")
        cap = source.capture
        codec = _CODECS.get(_fourcc(cap), "") if cap is not None else ""
        return StreamInfo(width=image.shape[1], height=image.shape[0], codec=codec)
    finally:
        source.close()


class DecodedSource(Source):
    """An RTSP camera read through the first decoder of its :class:`Decoding` that runs."""

    live = True

    def __init__(self, config: CameraConfig, decoding: Decoding) -> None:
        super().__init__(config)
        self.decoding = decoding
        self._inner: Source | None = None

    def open(self) -> None:
        c, d = self.config, self.decoding
        for decoder in d.candidates():
            if decoder == SOFTWARE:
                break
            why = missing(decoder, c, d.video)
            if why is not None:
                d.pass_over(decoder, why, tried=False)
            elif self._try(decoder):
                return
        child = c.keyframes_only or counts_damage(c)
        if child and KEYFRAMES not in d.passed_over:
            if shutil.which("ffmpeg") is None:
                why = "every frame is decoded" if c.keyframes_only else "damage is not counted"
                d.pass_over(KEYFRAMES, f"no ffmpeg program: {why}")
            elif self._try(KEYFRAMES):
                return
        self._inner = VideoCaptureSource(c)
        self._inner.open()
        d.damage.counted = False
        d.now_running(SOFTWARE, "OpenCV FFmpeg, in process")

    def _try(self, decoder: str, *, again: bool = False) -> bool:
        """Open through ``decoder``; False when the decoder failed (software runs).

        A decoder that gave an error is passed over at once. One that gave no frame within
        ``open_timeout_s`` while the camera opens in software may have met the camera
        coming back: it is tried once more, then this session runs in software, and only
        after :data:`TIMEOUT_STRIKES` such sessions in a row is it passed over.

        Raises:
            CaptureError: the camera itself failed (it does not open in software either).
        """
        c, d = self.config, self.decoding
        if d.info is None:
            d.info = learn(c)  # the camera's own failure ends the open here
        source: Source | None = None
        how = decoder
        try:
            source, label, how = self._build(decoder, d.info)
            source.open()
        except CaptureError as e:
            if source is not None:
                source.close()
            learn(c)  # does the camera still open in software? if not, it failed
            if failure_of(e) == "timeout":
                if not again:
                    return self._try(decoder, again=True)
                if d.strike(decoder) < TIMEOUT_STRIKES:
                    logger.warning(
                        "camera %s: decoder %s gave no frame in %g s, twice, while the "
                        "camera opens in software; software until the next reopen",
                        c.name, decoder, c.open_timeout_s,
                    )  # fmt: skip
                    return False
            why = e.reason
            if isinstance(source, VideoCaptureSource):  # OpenCV only says "can't open"
                why = f"OpenCV's FFmpeg did not open the stream with {how}"
            d.pass_over(decoder, why)
            return False
        self._inner = source
        d.damage.counted = isinstance(source, PipeSource) and source.damage is not None
        d.strike(decoder, clear=True)
        d.now_running(label, how)
        return True

    def _build(self, decoder: str, info: StreamInfo) -> tuple[Source, str, str]:
        c, video = self.config, self.decoding.video
        keyframes = " (key frames)" if c.keyframes_only else ""
        if decoder == "v4l2m2m":
            codec = _V4L2M2M.get(info.codec)
            if codec is None:
                raise CaptureError(c.name, f"v4l2m2m decodes H.264 and H.265, not {info.codec!r}")
            source = VideoCaptureSource(c, extra_options=f"video_codec;{codec}")
            return source, "v4l2m2m", f"OpenCV FFmpeg {codec}, in process"
        if decoder == "gstreamer":
            stages = gst_argv(c, info, video.gst_decoder, video.gst_convert)
            label = f"gstreamer ({video.gst_decoder})"
            return PipeSource(c, stages, info), label, printable(stages)  # GStreamer: -q
        device = video.vaapi_device if decoder == "vaapi" else None
        stages = ffmpeg_argv(c, info, vaapi_device=device, keyframes_only=c.keyframes_only)
        label = "software" if decoder == KEYFRAMES else decoder
        if decoder == KEYFRAMES and not c.keyframes_only:
            keyframes = " (ffmpeg)"
        child = PipeSource(c, stages, info, self.decoding.damage)
        return child, label + keyframes, printable(stages)

    def read(self) -> Image | None:
        if self._inner is None:
            raise CaptureError(self.config.name, "read before open")
        image = self._inner.read()
        self.last_damaged = self._inner.last_damaged
        return image

    def close(self) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.close()
