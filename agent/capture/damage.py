"""Damage in a camera's video, counted from what its ffmpeg decoder child says.

Over RTSP with UDP a lost packet leaves a hole in a frame; FFmpeg's H.264 and H.265
decoders then conceal it (they paint the hole from the frames around it) and hand out the
frame as if it were whole. OpenCV's FFmpeg in the agent's process says none of this (no
per-frame error flag, no log callback in ``cv2``), so a camera whose damage is counted is
decoded by an ``ffmpeg`` child (:mod:`agent.capture.pipe`) run with ``-loglevel warning``,
whose error output is read line by line here (ADR 0018):

- ``RTP: missed N packets``: ``N`` lost packets (the RTP sequence numbers' gap);
- ``URL: corrupt decoded frame in stream 0``: ffmpeg's own line for a frame the decoder
  flagged (``decode_error_flags``: a hole it concealed), written when that frame leaves
  the decoder, before it is written to the pipe;
- any other warning or error of the video decoder (``error while decoding MB ...``,
  ``Invalid NAL unit size``, ``no frame!`` ...): a decode error.

A frame read after one of these lines and before the next frame is *damaged*: the camera
counts it, and with ``damaged_frames = "skip"`` does not publish it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

_MISSED = re.compile(r"RTP: missed (\d+) packets")
_CONCEALED = re.compile(r": corrupt decoded frame in stream \d+$|concealing \d+ DC, \d+ AC, \d+ MV")
_DECODER = re.compile(r"^\[(?:h264|hevc|h265|mpeg4|mjpeg|vp8|vp9|av1)[^\]@]*@ [^\]]*\]")
_NOT_DAMAGE = ("deprecated pixel format", "thread_type", "reinit context")


@dataclass(frozen=True, slots=True)
class DamageCounts:
    """A snapshot of a camera's damage counters (running totals since it started).

    Attributes:
        counted: whether its decoder reports damage (an ffmpeg child does; OpenCV's FFmpeg
            in process and GStreamer do not, and then every count stays 0).
        lost_packets: RTP packets that never came.
        decode_errors: the decoder's warnings and errors (concealment not included).
        concealed_frames: frames decoded with a concealed hole.
        damaged_frames: frames read while any of the above was reported for them.
        skipped_frames: damaged frames not published (``damaged_frames = "skip"``).
    """

    counted: bool = False
    lost_packets: int = 0
    decode_errors: int = 0
    concealed_frames: int = 0
    damaged_frames: int = 0
    skipped_frames: int = 0


def classify(line: str) -> tuple[str, int] | None:
    """What a line of ffmpeg's error output says of damage: ``("lost_packets", N)``,
    ``("concealed_frames", 1)``, ``("decode_errors", 1)``, or None."""
    missed = _MISSED.search(line)
    if missed:
        return "lost_packets", int(missed.group(1))
    if _CONCEALED.search(line):
        return "concealed_frames", 1
    if _DECODER.match(line) and not any(n in line for n in _NOT_DAMAGE):
        return "decode_errors", 1
    return None


class Damage:
    """One camera's damage counters, kept across its sessions; thread-safe.

    The decoder child's error-output reader calls :meth:`line`; the capture thread calls
    :meth:`frame` for each frame read, which tells whether damage was reported since the
    frame before.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {
            "lost_packets": 0, "decode_errors": 0, "concealed_frames": 0,
            "damaged_frames": 0, "skipped_frames": 0,
        }  # fmt: skip
        self._pending = False
        self.counted = False

    def line(self, text: str) -> bool:
        """Count what ``text`` (one line of the child's error output) says; True when it
        said damage."""
        found = classify(text)
        if found is None:
            return False
        kind, n = found
        with self._lock:
            self._counts[kind] += n
            self._pending = True
        return True

    def frame(self) -> bool:
        """A frame was read: whether it is damaged (damage reported since the last one)."""
        with self._lock:
            damaged, self._pending = self._pending, False
            if damaged:
                self._counts["damaged_frames"] += 1
            return damaged

    def skipped(self) -> None:
        """A damaged frame was not published."""
        with self._lock:
            self._counts["skipped_frames"] += 1

    def snapshot(self) -> DamageCounts:
        with self._lock:
            return DamageCounts(counted=self.counted, **self._counts)
