"""A triggered pipeline's source: the frame that belongs to each trigger.

The station arms the source with each trigger (:meth:`TriggeredSource.arm`); the
pipeline's feeder, which calls :meth:`latest`, gets nothing until then. Armed, the source
fires the camera's software trigger (a station with ``capture = "software_trigger"``) or
waits for the free-running camera's next frame, passes over frames captured before the
trigger, and hands the first one at or after it to the pipeline with the trigger attached
(:class:`TriggeredFrame`). A frame that comes after the deadline is still decided and
logged (marked ``deadline_missed``; the station wrote the fail-safe result): nothing is
lost. A trigger whose frame does not come within :data:`FRAME_WAIT_S` (or its deadline,
when longer) gets none (``no_frame``, counted here).

A hardware-triggered camera (``trigger_mode = "hardware"``: a photo-eye on its input line)
exposes before the PLC's trigger reaches the agent, so its frame is paired by time
instead (``window``, the station's ``hardware_trigger_window_ms``): the newest frame the
camera has delivered whose capture time (the camera's own timestamp on the host clock)
lies from ``before`` ms before to ``after`` ms after the moment the station saw the
trigger; when none has come yet, the first one that does. Frames captured before the
window are passed over (``stale_frames``); a frame captured after it means the camera
took none for this trigger (``no_frame``, and ``after_window``): it is kept for the next
trigger, whose window it may be in, and this trigger gets the fail-safe result at its
deadline. A frame is never decided twice.

While no trigger is armed, a free-running (or hardware-triggered) camera's frames are
replaced in its latest-only slot and counted as dropped by the camera: only triggered
frames are decided.
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
    clock: str = "host"
    """Where ``t_capture_ns`` comes from (:attr:`agent.capture.frame.Frame.clock`)."""


class TriggeredSource:
    """The source of a station's pipeline (see the module's docstring)."""

    def __init__(
        self,
        camera: Camera | None = None,
        *,
        software_trigger: bool,
        window_ms: tuple[float, float] | None = None,
    ) -> None:
        self.camera = camera
        """None until the pipeline starts (:meth:`bind`): armed triggers then get no
        frame, and the station answers them with the fail-safe result at the deadline."""
        self.software_trigger = software_trigger
        self.window_ns = (
            None if window_ms is None else (int(window_ms[0] * 1e6), int(window_ms[1] * 1e6))
        )
        """A hardware-triggered camera's pairing window (before, after the trigger), in
        ns; None: the first frame captured at or after the trigger."""
        self._spare: Any = None
        """A frame captured after its trigger's window: the next trigger's, perhaps."""
        self._cond = threading.Condition()
        self._armed: Trigger | None = None
        self._held: TriggeredFrame | None = None
        """A triggered frame a stopping pipeline gave back (a reload): the next one
        decides it."""
        self.no_frame = 0
        """Triggers whose frame did not come before their deadline."""
        self.stale_frames = 0
        """Frames passed over because they were captured before the trigger (before its
        window)."""
        self.after_window = 0
        """Triggers whose camera's next frame was captured after their window."""

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
        window = self.window_ns
        first_ns = trigger.t_ns if window is None else trigger.t_ns - window[0]
        last_ns = None if window is None else trigger.t_ns + window[1]
        while True:
            left_s = (give_up_ns - time.perf_counter_ns()) / 1e9
            if left_s <= 0:
                self.no_frame += 1
                return None
            frame = self._next_frame(camera, min(left_s, timeout_s), last_ns)
            if frame is None:
                if not camera.up:  # stopped or failing: latest() returns at once
                    time.sleep(min(left_s, 0.005))
                continue
            if frame.t_capture_ns < first_ns:
                self.stale_frames += 1
                continue
            if last_ns is not None and frame.t_capture_ns > last_ns:
                self._spare = frame  # taken after this trigger's window
                self.after_window += 1
                self.no_frame += 1
                return None
            return TriggeredFrame(
                frame.camera,
                frame.seq,
                frame.image,
                frame.t_capture_ns,
                frame.wall_time,
                trigger,
                getattr(frame, "clock", "host"),
            )

    def _next_frame(self, camera: Camera, wait_s: float, last_ns: int | None) -> Any:
        """The next frame to look at: a spare one (captured after the last trigger's
        window) unless the camera has a newer one at hand that is not past this trigger's
        window; else the camera's next, waiting up to ``wait_s``."""
        spare, self._spare = self._spare, None
        if spare is None:
            return camera.latest(wait_s)
        newer = camera.latest(0.0)
        if newer is None:
            return spare
        if last_ns is not None and newer.t_capture_ns > last_ns:
            self._spare = newer
            return spare
        self.stale_frames += 1  # the spare: a newer frame is at hand
        return newer

    def stats(self) -> dict[str, int]:
        return {
            "no_frame": self.no_frame,
            "stale_frames": self.stale_frames,
            "after_window": self.after_window,
        }
