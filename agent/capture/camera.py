"""A camera: one capture thread that keeps its source open and hands over the newest frame.

The thread paces reads (file, images, synthetic) or publishes at most ``fps`` frames
(live sources), keeps only the latest frame, and reopens a failed source with exponential
backoff, forever. Nothing a source does can raise out of ``start`` or into another camera.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.capture.backoff import Backoff
from agent.capture.config import CameraConfig
from agent.capture.damage import DamageCounts
from agent.capture.decoders import DecodedSource, Decoding
from agent.capture.frame import Frame
from agent.capture.latest import LatestSlot
from agent.capture.rtsp import SourceFailure, failure_of
from agent.capture.sources import EndOfStream, Image, Source, make_source
from agent.errors import CaptureError
from runtime.profiles import VideoConfig

if TYPE_CHECKING:
    from agent.capture.genicam.source import GenicamState

logger = logging.getLogger(__name__)

StateCallback = Callable[[str, bool, str], None]

_IDLE_WAIT_S = 0.05  # after a read that gave no frame
_FPS_WINDOW = 32  # frames the measured fps and the drop ratio are taken over
STARVED_AFTER_S = 1.0
"""A camera that delivers frames is *starved* when no consumer took one for this long
(or ten frame periods, whichever is longer)."""


@dataclass(frozen=True, slots=True)
class CameraStats:
    """A snapshot of a camera's counters.

    Attributes:
        frames_captured: frames published (each got a ``seq``).
        frames_dropped: published frames replaced before anyone took them.
        reopens: attempts to open the source again after a failure.
        up: the source is delivering frames.
        last_error: why the source last failed ("" if it never did).
        fps_measured: publish rate over the last frames (0 when none lately).
        frames_skipped: live frames read but not published, to hold ``fps``.
        errors: failures (open, read, stall, unexpected exceptions, callback errors).
        frames_taken: frames a consumer (its pipeline) took.
        drop_ratio: of the last frames published, the fraction replaced before anyone
            took them: above 0 the pipeline can't keep up with the camera.
        starved: the camera delivers frames but no consumer took one for
            :data:`STARVED_AFTER_S` (or ten frame periods): it is not served at all.
        failure: the reason word of the failure the camera is down for now
            (:data:`agent.capture.rtsp.FAILURES`: refused, unauthorized, not_found,
            timeout, stalled, ended...); "" while it delivers frames (or before any).
        last_failure: the reason word of the last failure, kept after the camera
            recovered ("" if it never failed).
        last_failure_at: when that was (``time.time()``; 0 if never).
        failures: failures counted by reason word.
        decoder: what decodes an RTSP camera's video (``software``, ``vaapi``,
            ``software (key frames)``...; "" for other kinds or before the first open).
        decoders_passed_over: decoders that could not run for this camera, with why.
        damage: lost packets, decode errors, concealed, damaged and skipped frames
            (:mod:`agent.capture.damage`; ``counted`` is false where the decoder that
            runs reports none).
        genicam: a GenICam camera's own counters (incomplete frames, missed triggers,
            missing and resent packets, the clock mapping, features read back:
            :meth:`agent.capture.genicam.source.GenicamState.snapshot`); empty for other
            kinds.
    """

    frames_captured: int
    frames_dropped: int
    reopens: int
    up: bool
    last_error: str
    fps_measured: float
    frames_skipped: int = 0
    errors: int = 0
    frames_taken: int = 0
    drop_ratio: float = 0.0
    starved: bool = False
    failure: str = ""
    failures: Mapping[str, int] = field(default_factory=dict)
    last_failure: str = ""
    last_failure_at: float = 0.0
    decoder: str = ""
    decoders_passed_over: Mapping[str, str] = field(default_factory=dict)
    damage: DamageCounts = field(default_factory=DamageCounts)
    genicam: Mapping[str, Any] = field(default_factory=dict)


class Camera:
    """Captures from one source in its own thread; consumers take the newest frame.

    ``on_state(name, up, reason)`` is called from the capture thread when the camera goes
    up or down (including the first failure of a source that never opens).
    An RTSP camera's video goes through ``video``'s decoders (the firmware profile's
    ``[video]``; default: software), see :mod:`agent.capture.decoders`.
    """

    def __init__(
        self,
        config: CameraConfig,
        *,
        on_state: StateCallback | None = None,
        video: VideoConfig | None = None,
    ) -> None:
        self._config = config
        self._decoding = Decoding(config, video or VideoConfig()) if config.kind == "rtsp" else None
        self._genicam: GenicamState | None = None
        if config.kind == "genicam":
            from agent.capture.genicam.source import GenicamState  # noqa: PLC0415

            self._genicam = GenicamState()
        self._on_state = on_state
        self._slot: LatestSlot[Frame] = LatestSlot()
        self._stop = threading.Event()
        self._fire = threading.Event()
        self._fired = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._up = False
        self._reported: bool | None = None
        self._last_error = ""
        self._failure = ""
        self._last_failure = ""
        self._last_failure_at = 0.0
        self._failures: dict[str, int] = {}
        self._captured = 0
        self._skipped = 0
        self._reopens = 0
        self._errors = 0
        self._recent: deque[int] = deque(maxlen=_FPS_WINDOW)
        self._recent_drops: deque[bool] = deque(maxlen=_FPS_WINDOW)
        self._since_ns = 0  # when frames started coming (up), for "starved"

    @property
    def name(self) -> str:
        """The camera's configured name."""
        return self._config.name

    @property
    def config(self) -> CameraConfig:
        """The camera's configuration."""
        return self._config

    @property
    def up(self) -> bool:
        """True while the source delivers frames."""
        return self._up

    def start(self) -> None:
        """Start the capture thread; never fails because of the source.

        Raises:
            CaptureError: the camera is already running.
        """
        if self._thread is not None and self._thread.is_alive():
            raise CaptureError(self.name, "already started")
        self._stop.clear()
        self._slot.reopen()
        self._thread = threading.Thread(target=self._run, name=f"camera-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop capturing and wake waiting consumers; waits up to ``timeout_s`` for the thread."""
        self._stop.set()
        self._slot.close()
        thread = self._thread
        if thread is None:
            return
        thread.join(max(0.0, timeout_s))
        if thread.is_alive():
            logger.warning(
                "camera %s: capture thread still inside a source call after %.1f s; "
                "it ends when that call returns",
                self.name,
                timeout_s,
            )

    @property
    def software_triggered(self) -> bool:
        """The camera reads a frame only when :meth:`software_trigger` fires it."""
        return self._config.trigger_mode == "software"

    def software_trigger(self) -> bool:
        """Read one frame now (``trigger_mode = "software"``); False for a free-running
        camera. Triggers fired faster than the source reads are folded into one."""
        if not self.software_triggered:
            return False
        with self._lock:
            self._fired += 1
        self._fire.set()
        return True

    def latest(self, timeout_s: float) -> Frame | None:
        """The newest frame not yet taken, waiting up to ``timeout_s``; None on timeout or stop."""
        return self._slot.take(timeout_s)

    def stats(self) -> CameraStats:
        """A snapshot of the counters."""
        with self._lock:
            return CameraStats(
                frames_captured=self._captured,
                frames_dropped=self._slot.dropped,
                reopens=self._reopens,
                up=self._up,
                last_error=self._last_error,
                fps_measured=self._fps(),
                frames_skipped=self._skipped,
                errors=self._errors,
                frames_taken=self._slot.taken,
                drop_ratio=self._drop_ratio(),
                starved=self._starved(),
                failure=self._failure,
                failures=dict(self._failures),
                last_failure=self._last_failure,
                last_failure_at=self._last_failure_at,
                decoder=self._decoding.running if self._decoding else "",
                decoders_passed_over=dict(self._decoding.passed_over) if self._decoding else {},
                damage=self._damage(),
                genicam=self._genicam.snapshot() if self._genicam else {},
            )

    def _damage(self) -> DamageCounts:
        if self._decoding:
            return self._decoding.damage.snapshot()
        if self._genicam:  # incomplete frames are never handed on: damaged and skipped
            g = self._genicam.snapshot()
            n = g["incomplete_frames"]
            return DamageCounts(
                counted=True, lost_packets=g["missing_packets"], damaged_frames=n, skipped_frames=n
            )
        return DamageCounts()

    def _drop_ratio(self) -> float:
        drops = self._recent_drops
        return sum(drops) / len(drops) if drops else 0.0

    def _starved(self) -> bool:
        if not self._up or not self._recent:
            return False
        now = time.perf_counter_ns()
        window_ns = max(STARVED_AFTER_S * 1e9, 10e9 / self._config.fps)
        served_ns = max(self._slot.last_take_ns, self._since_ns)
        return now - served_ns > window_ns and now - self._recent[-1] < window_ns

    def _fps(self) -> float:
        if len(self._recent) < 2:
            return 0.0
        idle_ns = time.perf_counter_ns() - self._recent[-1]
        if idle_ns > self._config.stall_timeout_s * 1e9:
            return 0.0
        span_ns = self._recent[-1] - self._recent[0]
        return (len(self._recent) - 1) * 1e9 / span_ns if span_ns > 0 else 0.0

    # --- the capture thread -------------------------------------------------------------

    def _run(self) -> None:
        c = self._config
        backoff = Backoff(c.backoff_initial_s, c.backoff_max_s)
        attempt = 0
        while not self._stop.is_set():
            if attempt:
                with self._lock:
                    self._reopens += 1
            attempt += 1
            try:
                if self._session(backoff):
                    return
            except CaptureError as e:
                self._failed(e.reason, failure_of(e), backoff)
            except Exception as e:  # a bug in one source must not end its camera
                logger.exception("camera %s: unexpected error in capture", self.name)
                self._failed(f"{type(e).__name__}: {e}", "unknown", backoff)
        self._set_state(up=False, reason="stopped")

    def _failed(self, reason: str, failure: str, backoff: Backoff) -> None:
        delay = backoff.next()
        with self._lock:
            self._errors += 1
            self._last_error = reason
            self._failure = self._last_failure = failure
            self._last_failure_at = time.time()
            self._failures[failure] = self._failures.get(failure, 0) + 1
        logger.warning("camera %s: %s; reopening in %.1f s", self.name, reason, delay)
        self._set_state(up=False, reason=reason)
        self._stop.wait(delay)

    def _make_source(self) -> Source:
        if self._decoding is not None:
            return DecodedSource(self._config, self._decoding)
        if self._genicam is not None:
            from agent.capture.genicam.source import GenicamSource  # noqa: PLC0415

            return GenicamSource(self._config, self._genicam)
        return make_source(self._config)

    def _session(self, backoff: Backoff) -> bool:
        """Open the source and pump it until it fails or we stop; True when it ended."""
        source = self._make_source()
        try:
            source.open()
            self._pump(source, backoff)
        except EndOfStream as e:
            with self._lock:
                self._last_error = e.reason
                self._failure = self._last_failure = "ended"
                self._last_failure_at = time.time()
            logger.info("camera %s: %s", self.name, e.reason)
            self._set_state(up=False, reason=e.reason)
            return True
        finally:
            try:
                source.close()
            except Exception:
                logger.exception("camera %s: closing the source failed", self.name)
                with self._lock:
                    self._errors += 1
        return False

    def _pump(self, source: Source, backoff: Backoff) -> None:
        c = self._config
        period_ns = int(1e9 / c.fps)
        stall_ns = int(c.stall_timeout_s * 1e9)
        if c.phase and not source.live:  # a trigger offset: take turns with other cameras
            self._stop.wait(c.phase * period_ns / 1e9)
        last_frame_ns = time.perf_counter_ns()
        next_ns = last_frame_ns  # paced: when to read next; live: earliest next publish
        triggered = self.software_triggered
        while not self._stop.is_set():
            if triggered:  # one frame per software trigger; idle is not a stall
                if not self._fire.wait(_IDLE_WAIT_S):
                    last_frame_ns = time.perf_counter_ns()
                    continue
                self._fire.clear()
            image = source.read()
            t_ns = time.perf_counter_ns()
            wall = time.time()
            if image is None:
                if source.waits_for_trigger:  # an idle trigger line is not a stall
                    last_frame_ns = t_ns
                    continue
                if t_ns - last_frame_ns > stall_ns:
                    raise SourceFailure(
                        self.name, "stalled", f"no frame for {c.stall_timeout_s:g} s"
                    )
                self._stop.wait(min(_IDLE_WAIT_S, period_ns / 1e9))
                continue
            last_frame_ns = t_ns
            clock = "host"
            if source.last_stamp is not None:  # taken earlier than it was read
                t_ns, wall = source.last_stamp
                clock = source.last_clock
            if source.last_damaged and c.damaged_frames == "skip" and self._decoding:
                self._decoding.damage.skipped()  # decoded with damage: not decided on
                continue
            if source.live:
                if t_ns + period_ns // 20 < next_ns:
                    with self._lock:
                        self._skipped += 1
                    continue
                next_ns = max(next_ns + period_ns, t_ns + period_ns // 2)
                self._publish(image, t_ns, wall, backoff, clock)
                continue
            self._publish(image, t_ns, wall, backoff, clock)
            if triggered:
                continue
            next_ns += period_ns
            now = time.perf_counter_ns()
            if next_ns < now - period_ns:
                next_ns = now  # fell behind by more than a frame: no burst to catch up
            if next_ns > now:
                self._stop.wait((next_ns - now) / 1e9)

    def _publish(
        self, image: Image, t_ns: int, wall: float, backoff: Backoff, clock: str = "host"
    ) -> None:
        image.flags.writeable = False
        with self._lock:
            seq = self._captured
            self._captured += 1
            self._recent.append(t_ns)
            was_up = self._up
            if not was_up:
                self._since_ns = t_ns
                self._failure = ""  # recovered: the last failure is past
        replaced = self._slot.put(Frame(self.name, seq, image, t_ns, wall, clock))
        with self._lock:
            self._recent_drops.append(replaced)
        if not was_up:
            backoff.reset()
            self._set_state(up=True, reason="capturing")

    def _set_state(self, *, up: bool, reason: str) -> None:
        with self._lock:
            self._up = up
            if self._reported is up:
                return
            self._reported = up
        if up:
            logger.info("camera %s: up", self.name)
        if self._on_state is None:
            return
        try:
            self._on_state(self.name, up, reason)
        except Exception:
            logger.exception("camera %s: on_state callback failed", self.name)
            with self._lock:
                self._errors += 1
