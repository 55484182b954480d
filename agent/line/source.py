"""A triggered pipeline's source: the first frame captured at or after the trigger.

The station arms the source with each trigger (:meth:`TriggeredSource.arm`); the
pipeline's feeder, which calls :meth:`latest`, gets nothing until then. Armed, the source
fires the camera's software trigger (a station with ``capture = "software_trigger"``) or
waits for the free-running camera's next frame, passes over frames captured before the
trigger, and hands the first one at or after it to the pipeline with the trigger attached
(:class:`TriggeredFrame`). A frame that comes after the deadline is still decided and
logged (marked ``deadline_missed``; the station wrote the fail-safe result): nothing is
lost. A trigger whose frame does not come within :data:`FRAME_WAIT_S` (or its deadline,
when longer) gets none (``no_frame``, counted here).

While no trigger is armed, a free-running camera's frames are replaced in its latest-only
slot and counted as dropped by the camera: only triggered frames are decided.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.capture import Camera
from agent.line.handshake import Trigger

FRAME_WAIT_S = 2.0
"""How long past the trigger a frame is waited for at least (a late decision is still
logged)."""


@dataclass(frozen=True, slots=True)
class TriggeredFrame:
    """A camera frame taken for a trigger (what the pipeline decides)."""

    camera: str
    seq: int
    image: npt.NDArray[np.uint8]
    t_capture_ns: int
    wall_time: float
    trigger: Trigger


class TriggeredSource:
    """The source of a station's pipeline (see the module's docstring)."""

    def __init__(self, camera: Camera | None = None, *, software_trigger: bool) -> None:
        self.camera = camera
        """None until the pipeline starts (:meth:`bind`): armed triggers then get no
        frame, and the station answers them with the fail-safe result at the deadline."""
        self.software_trigger = software_trigger
        self._cond = threading.Condition()
        self._armed: Trigger | None = None
        self._held: TriggeredFrame | None = None
        """A triggered frame a stopping pipeline gave back (a reload): the next one
        decides it."""
        self.no_frame = 0
        """Triggers whose frame did not come before their deadline."""
        self.stale_frames = 0
        """Frames passed over because they were captured before the trigger."""

    def bind(self, camera: Camera) -> TriggeredSource:
        """Read ``camera`` (the pipeline's source, once it started)."""
        self.camera = camera
        return self

    def arm(self, trigger: Trigger) -> None:
        """Take a frame for ``trigger`` (replaces one armed and not yet taken)."""
        with self._cond:
            self._armed = trigger
            self._cond.notify_all()
        camera = self.camera
        if self.software_trigger and camera is not None:
            camera.software_trigger()

    def give_back(self, item: TriggeredFrame) -> None:
        """A pipeline that stopped (a reload) took ``item`` and did not decide it: the
        next :meth:`latest` returns it, so its trigger still gets its decision (late, it
        is logged marked deadline_missed) instead of none."""
        with self._cond:
            self._held = item
            self._cond.notify_all()

    def latest(self, timeout_s: float) -> Any:
        """The frame for the armed trigger, waiting up to ``timeout_s`` for a trigger (and
        then for its frame, see :data:`FRAME_WAIT_S`); None when none came."""
        with self._cond:
            held, self._held = self._held, None
            if held is not None:
                return held
            if self._armed is None:
                self._cond.wait(timeout_s)
            trigger, self._armed = self._armed, None
        camera = self.camera
        if trigger is None or camera is None:
            return None
        give_up_ns = max(trigger.deadline_ns, trigger.t_ns + int(FRAME_WAIT_S * 1e9))
        while True:
            left_s = (give_up_ns - time.perf_counter_ns()) / 1e9
            if left_s <= 0:
                self.no_frame += 1
                return None
            frame = camera.latest(min(left_s, timeout_s))
            if frame is None:
                if not camera.up:  # stopped or failing: latest() returns at once
                    time.sleep(min(left_s, 0.005))
                continue
            if frame.t_capture_ns < trigger.t_ns:
                self.stale_frames += 1
                continue
            return TriggeredFrame(
                frame.camera, frame.seq, frame.image, frame.t_capture_ns, frame.wall_time, trigger
            )

    def stats(self) -> dict[str, int]:
        return {"no_frame": self.no_frame, "stale_frames": self.stale_frames}
