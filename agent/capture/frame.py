"""A captured frame and when it was captured."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame from a camera.

    Attributes:
        camera: the camera's name.
        seq: per-camera number of the frame, counting every published frame (a gap
            seen by a consumer is the frames it missed).
        image: HxWx3 uint8 BGR, read-only.
        t_capture_ns: ``time.perf_counter_ns()`` right after the read returned;
            latency is measured from it.
        wall_time: ``time.time()`` at the same moment.
    """

    camera: str
    seq: int
    image: npt.NDArray[np.uint8]
    t_capture_ns: int
    wall_time: float
