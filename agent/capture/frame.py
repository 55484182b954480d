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
        t_capture_ns: ``time.perf_counter_ns()`` when the frame was taken: right after
            the read returned, or the camera's own timestamp on the host clock (see
            ``clock``); latency is measured from it.
        wall_time: ``time.time()`` at the same moment.
        clock: where ``t_capture_ns`` comes from: ``host`` (the read returned), ``camera``
            (the camera's timestamp mapped to the host clock: when it exposed),
            ``arrival`` (when the camera's buffer arrived: it gave no timestamp),
            ``trigger`` (the mapping put it before the software trigger that asked for
            it, so the trigger's time is used).
    """

    camera: str
    seq: int
    image: npt.NDArray[np.uint8]
    t_capture_ns: int
    wall_time: float
    clock: str = "host"
