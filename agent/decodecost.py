"""What decoding a camera stream costs: wall time per read, process CPU per frame, and how
many such cameras fill the machine's cores.

Shared by ``edge-agent bench`` and ``hil bench decode``. The CPU figure is the whole
process's CPU time (``CLOCK_PROCESS_CPUTIME_ID``: every thread, FFmpeg's decoder threads
included) over the frames read, so measure while nothing else in the process works.

A file is read as fast as it decodes, so the wall time of one read is its decode time. A
live stream (a camera) delivers at its own rate and a read mostly waits for the next frame:
its wall time is the frame interval, not the decode. For a live stream the per-read figure
that says what decoding costs is therefore the process CPU spent in that read
(:attr:`DecodeRound.cpu_ms`); :func:`summarize` takes it as ``decode_ms_p50`` and says so in
``decode_ms_basis``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

Image = npt.NDArray[np.uint8]


def cpu_s() -> float:
    """CPU seconds this process has used, every thread counted."""
    return time.process_time()


def cameras_full(cpu_ms_per_frame: float, fps: float, cores: int | None = None) -> float:
    """Cameras at ``fps`` whose decoding alone takes every core:
    ``cores x 1000 / (cpu_ms_per_frame x fps)`` (0 for a figure that can't be had)."""
    n = cores or os.cpu_count() or 1
    if cpu_ms_per_frame <= 0 or fps <= 0:
        return 0.0
    return round(n * 1000 / (cpu_ms_per_frame * fps), 1)


@dataclass
class DecodeRound:
    """One bounded run of reads.

    Attributes:
        walls_ms: wall ms of each read that gave a frame.
        cpu_ms: process CPU ms of each read that gave a frame.
        cpu_total_s: process CPU seconds over the whole round (reads without a frame too).
        elapsed_s: wall seconds of the whole round.
        shape: the last frame's shape (height, width, channels).
        misses: reads that gave no frame.
    """

    walls_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    cpu_total_s: float = 0.0
    elapsed_s: float = 0.0
    shape: tuple[int, ...] = ()
    misses: int = 0

    @property
    def frames(self) -> int:
        """Frames read."""
        return len(self.walls_ms)


def decode_round(
    read: Callable[[], Image | None],
    *,
    max_frames: int,
    max_s: float,
    stop_on_miss: bool = True,
) -> DecodeRound:
    """Call ``read`` until it gives ``max_frames`` frames or ``max_s`` seconds pass (and, with
    ``stop_on_miss``, until the first read that gives no frame: the end of a file).
    Exceptions of ``read`` pass through."""
    r = DecodeRound()
    t_start = time.perf_counter()
    cpu_start = cpu_s()
    try:
        while r.frames < max_frames and time.perf_counter() - t_start < max_s:
            t0, c0 = time.perf_counter(), cpu_s()
            frame = read()
            t1, c1 = time.perf_counter(), cpu_s()
            if frame is None:
                r.misses += 1
                if stop_on_miss:
                    break
                continue
            r.walls_ms.append((t1 - t0) * 1000)
            r.cpu_ms.append((c1 - c0) * 1000)
            r.shape = tuple(frame.shape)
    finally:
        r.cpu_total_s = cpu_s() - cpu_start
        r.elapsed_s = time.perf_counter() - t_start
    return r


def percentile(values: list[float], q: float) -> float:
    """The ``q`` (0..1) quantile of ``values`` by rank (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def summarize(r: DecodeRound, *, live: bool, fps: float | None = None) -> dict[str, Any]:
    """The figures of a round: ``frames_decoded``, ``decode_ms_p50``/``p99`` (wall per read
    for a file, process CPU per read for a live stream: ``decode_ms_basis``),
    ``read_ms_p50`` (wall per read), ``decode_cpu_per_frame_ms``, ``stream_fps`` (``fps``
    when given; a live stream: 1000 / ``read_ms_p50``, its frame interval, since a stream
    first sends what it buffered in a burst; a file: frames over the round's seconds),
    ``frame_width``/``frame_height`` and ``cameras_full_at_stream_fps``."""
    per_read = r.cpu_ms if live else r.walls_ms
    cpu_ms = r.cpu_total_s * 1000 / r.frames if r.frames else 0.0
    read_p50 = statistics.median(r.walls_ms) if r.walls_ms else 0.0
    if fps:
        stream_fps = fps
    elif live:  # a stream sends what it buffered at once first: its median interval counts
        stream_fps = 1000 / read_p50 if read_p50 > 0 else 0.0
    else:
        stream_fps = r.frames / r.elapsed_s if r.elapsed_s > 0 else 0.0
    return {
        "frames_decoded": r.frames,
        "decode_seconds": round(r.elapsed_s, 3),
        "decode_ms_p50": round(statistics.median(per_read), 3) if per_read else 0.0,
        "decode_ms_p99": round(percentile(per_read, 0.99), 3),
        "decode_ms_basis": "process CPU per read" if live else "wall per read",
        "read_ms_p50": round(read_p50, 3),
        "decode_cpu_per_frame_ms": round(cpu_ms, 3),
        "stream_fps": round(stream_fps, 2),
        "frame_width": r.shape[1] if len(r.shape) > 1 else 0,
        "frame_height": r.shape[0] if r.shape else 0,
        "cameras_full_at_stream_fps": cameras_full(cpu_ms, stream_fps),
        "cores": os.cpu_count() or 1,
    }
