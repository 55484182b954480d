"""A GenICam camera (GigE Vision, USB3 Vision) as a capture source, through Aravis.

Open: find the camera (its serial number, Aravis id or address), set each
configured feature and read it back -- a feature the camera refuses or changes is a
failure naming the feature and what the camera said (reason word ``misconfigured``) --
then receive into ``buffers`` buffers Aravis allocates once. Read: pop the next buffer
(after firing TriggerSoftware, for a software-triggered camera), convert it into an image
of the frame ring (:mod:`.pixels`) and give the buffer back. A frame that came
incomplete (missing packets past their resends, a size mismatch...) is counted and never
handed on. The frame's capture time is its camera timestamp on the host clock
(:mod:`.clock`), so a decision's capture time is when the frame was taken, not when it
arrived.

Failures carry their reason words: ``unreachable`` (no such camera answers now),
``timeout`` (a software trigger got no frame, a command got no answer), ``stalled`` (a
free-running camera sent nothing), ``misconfigured``, ``unavailable`` (libaravis is not
installed); the camera reopens with backoff like every kind.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from typing import Any

from agent.capture.config import CameraConfig
from agent.capture.genicam import aravis
from agent.capture.genicam.clock import TickClock
from agent.capture.genicam.config import GenicamConfig, feature_text
from agent.capture.genicam.pixels import CODES, FrameRing, PixelFormatError, convert, name_of
from agent.capture.rtsp import SourceFailure
from agent.capture.sources import Image, Source

logger = logging.getLogger(__name__)

FLOAT_TOLERANCE = 0.005
"""A float feature read back within this fraction of what was set is taken (cameras
round an exposure to their clock's step)."""
_IDLE_POP_S = 0.2
"""A free-running or hardware-triggered read waits this long for a buffer at most."""
_INFO_EVERY = 16
"""The stream's packet counters are read every this many frames (and at close)."""
_RANGE_CHECK_ENABLE = 1  # ArvRangeCheckPolicy
_LOST = frozenset({"timeout", "unreachable"})
_STREAM_COUNTERS = ("n_missing_packets", "n_resent_packets", "n_resend_requests")


class GenicamState:
    """A GenICam camera's counters, kept across its reopens (the camera's stats)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.clock = TickClock()
        self.incomplete: dict[str, int] = {}
        self.missed_triggers = 0
        self.triggers = 0
        self.stamps_clamped = 0
        self.frames = 0
        self.convert_cpu_ns = 0
        """CPU the capture thread spent converting the frames into BGR."""
        self.packets: dict[str, int] = dict.fromkeys(_STREAM_COUNTERS, 0)
        self._session: dict[str, int] = {}
        self.read_back: dict[str, str] = {}
        self.device = ""

    def session_packets(self, infos: dict[str, int]) -> None:
        """The open stream's counters now (they start at 0 with each stream)."""
        with self._lock:
            self._session = {k: infos.get(k, 0) for k in _STREAM_COUNTERS}

    def end_session(self) -> None:
        with self._lock:
            for k, v in self._session.items():
                self.packets[k] += v
            self._session = {}

    def count_incomplete(self, status: str) -> None:
        with self._lock:
            self.incomplete[status] = self.incomplete.get(status, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """JSON-able counters: frames, incomplete frames by buffer status, triggers fired
        and missed, packets missing/resent/asked again, the clock mapping, what each
        feature read back at the last open."""
        with self._lock:
            packets = {k: v + self._session.get(k, 0) for k, v in self.packets.items()}
            clock = asdict(self.clock.estimate())
            return {
                "device": self.device,
                "frames": self.frames,
                "convert_cpu_per_frame_ms": round(
                    self.convert_cpu_ns / 1e6 / self.frames if self.frames else 0.0, 4
                ),
                "incomplete_frames": sum(self.incomplete.values()),
                "incomplete_by_status": dict(self.incomplete),
                "software_triggers": self.triggers,
                "missed_triggers": self.missed_triggers,
                "missing_packets": packets["n_missing_packets"],
                "resent_packets": packets["n_resent_packets"],
                "resend_requests": packets["n_resend_requests"],
                "clock": {
                    "offset_ns": clock["offset_ns"],
                    "drift_ppm": round(clock["drift_ppm"], 3),
                    "error_us": round(clock["error_ns"] / 1000, 1),
                    "samples": clock["samples"],
                    "resets": self.clock.resets,
                    "stamps_clamped": self.stamps_clamped,
                },
                "read_back": dict(self.read_back),
            }


def failure_of_arv(error: aravis.ArvError) -> str:
    """The reason word of an error Aravis reported."""
    text = error.message.lower()
    if isinstance(error, aravis.AravisUnavailable):
        return "unavailable"
    if "not found" in text or "no device" in text or "can't connect" in text:
        return "unreachable"
    if "timeout" in text or "timed out" in text:
        return "timeout"
    return "unreachable" if "control" in text or "access" in text else "unknown"


class GenicamSource(Source):
    """One GenICam camera (see the module)."""

    def __init__(self, config: CameraConfig, state: GenicamState | None = None) -> None:
        super().__init__(config)
        self.state = state or GenicamState()
        g = config.genicam_config
        self.live = config.trigger_mode != "software"
        self.waits_for_trigger = config.trigger_mode == "hardware"
        self._ring = FrameRing(g.buffers + 8)
        self._camera: aravis.ArvCamera | None = None
        self._stream: aravis.ArvStream | None = None
        self._since_info = 0
        self._last_ok_ns = 0
        self._lost = False
        """The camera stopped answering: :meth:`close` does not wait on it."""

    # --- open ---------------------------------------------------------------------------

    def _fail(self, failure: str, what: str) -> SourceFailure:
        if failure in _LOST:
            self._lost = True
        return SourceFailure(self.config.name, failure, f"genicam {self.config.uri}: {what}")

    def open(self) -> None:
        c = self.config
        try:
            camera = self._find()
        except aravis.ArvError as e:
            raise self._fail(failure_of_arv(e), f"can't open: {e.message}") from None
        self._camera = camera
        try:
            self._configure(camera)
            size = camera.call("get_payload")
            self._stream = aravis.ArvStream(camera, c.genicam_config.buffers, int(size))
            camera.call("start_acquisition")
        except aravis.ArvError as e:
            self.close()
            raise self._fail(failure_of_arv(e), f"can't start: {e.message}") from None
        except SourceFailure:
            self.close()
            raise
        self._last_ok_ns = time.perf_counter_ns()
        logger.info("camera %s: genicam %s open", c.name, self.state.device)

    def _find(self) -> aravis.ArvCamera:
        """The camera by Aravis id or address (and a GigE Vision camera by its user id:
        Aravis's discovery answers carry it), else by serial number in the device list."""
        want = self.config.uri
        try:
            camera = aravis.ArvCamera(want)
        except aravis.ArvError as first:
            if isinstance(first, aravis.AravisUnavailable):
                raise
            match = [
                d for d in aravis.devices() if want in (d.serial, d.id, d.address, d.physical_id)
            ]
            if not match:
                raise aravis.ArvError(f"no camera {want!r} found ({first.message})") from None
            camera = aravis.ArvCamera(match[0].id)
        self.state.device = camera.describe()
        return camera

    def _configure(self, camera: aravis.ArvCamera) -> None:
        g = self.config.genicam_config
        if camera.ptr is not None:  # Aravis checks a value against the feature's bounds
            camera.lib.arv.arv_camera_set_range_check_policy(camera.ptr, _RANGE_CHECK_ENABLE)
        with contextlib.suppress(aravis.ArvError):  # not acquiring
            camera.call("stop_acquisition")
        read_back: dict[str, str] = {}
        if g.pixel_format is None:
            have = aravis.text(camera.call("get_pixel_format_as_string"))
            if have not in CODES:
                raise self._fail(
                    "misconfigured",
                    f"PixelFormat is {have}, which the agent does not convert: set "
                    f"genicam.pixel_format to one of {', '.join(CODES)}",
                )
            read_back["PixelFormat"] = have
        if not camera.is_gv and (g.packet_size is not None or g.packet_delay_ns is not None):
            raise self._fail(
                "misconfigured", "packet_size and packet_delay_ns apply to GigE Vision cameras"
            )
        for name, want, set_, get in _steps(camera, g):
            self._apply(read_back, name, want, set_, get)
        self._trigger(camera, read_back)
        for name, value in g.features.items():
            self._feature(camera, read_back, name, value)
        self.state.read_back = read_back

    def _trigger(self, camera: aravis.ArvCamera, read_back: dict[str, str]) -> None:
        mode = self.config.trigger_mode
        try:
            if mode == "free_run":
                camera.call("clear_triggers")
                read_back["TriggerMode"] = "Off"
                return
            source = "Software" if mode == "software" else self.config.genicam_config.trigger_source
            camera.call("set_trigger", source.encode())
        except aravis.ArvError as e:
            what = "TriggerMode" if mode == "free_run" else f"TriggerSource = {source}"
            raise self._fail("misconfigured", f"{what}: the camera said: {e.message}") from None
        said = camera.get_feature("TriggerSource")
        if said != source:
            raise self._fail(
                "misconfigured", f"TriggerSource: set {source}, the camera says {said}"
            )
        read_back["TriggerSource"] = said

    def _feature(
        self, camera: aravis.ArvCamera, read_back: dict[str, str], name: str, value: Any
    ) -> None:
        kind = camera.feature_type(name)
        if kind is None:
            raise self._fail("misconfigured", f"features.{name}: the camera has no such feature")
        if kind == "command":
            raise self._fail(
                "misconfigured", f"features.{name}: a command, not a value (nothing to set)"
            )
        if kind in ("integer", "float") and (isinstance(value, (bool, str))):
            raise self._fail(
                "misconfigured", f"features.{name}: the camera's {name} is a number, not {value!r}"
            )
        if kind == "boolean" and not isinstance(value, bool):
            raise self._fail(
                "misconfigured", f"features.{name}: the camera's {name} is true or false"
            )
        self._apply(read_back, name, value,
                    lambda: camera.set_feature(name, feature_text(value)),
                    lambda: camera.get_feature(name))  # fmt: skip

    def _apply(self, read_back: dict[str, str], name: str, want: Any, set_: Any, get: Any) -> None:
        """Set a feature and read it back.

        Raises:
            SourceFailure: ``misconfigured`` naming ``name``, the value and what the camera
                said (its error, or the value it has instead).
        """
        try:
            set_()
        except aravis.ArvError as e:
            if failure_of_arv(e) in ("unreachable", "timeout"):
                raise
            raise self._fail(
                "misconfigured",
                f"{name} = {feature_text(want)} refused: the camera said: {e.message}",
            ) from None
        got = get()
        if not _same(want, got):
            raise self._fail(
                "misconfigured",
                f"{name}: set {feature_text(want)}, the camera says {feature_text(got)}",
            )
        read_back[name] = feature_text(got)

    # --- read ---------------------------------------------------------------------------

    def read(self) -> Image | None:
        camera, stream = self._camera, self._stream
        if camera is None or stream is None:
            raise self._fail("unknown", "read before open")
        c = self.config
        fired_ns = 0
        if not self.live:
            fired_ns = time.perf_counter_ns()
            try:
                camera.call("software_trigger")
            except aravis.ArvError as e:
                raise self._fail(failure_of_arv(e), f"TriggerSoftware: {e.message}") from None
            self.state.triggers += 1
            timeout_s = c.stall_timeout_s
        else:
            timeout_s = min(_IDLE_POP_S, c.stall_timeout_s)
        buffer = stream.pop(int(timeout_s * 1e6))
        if buffer is None:
            self._nothing(camera, fired_ns)
            return None
        try:
            image = self._take(camera.lib, buffer, fired_ns)
        finally:
            stream.push(buffer)
        self._since_info += 1
        if self._since_info >= _INFO_EVERY:
            self._since_info = 0
            self.state.session_packets(stream.infos())
        return image

    def _nothing(self, camera: aravis.ArvCamera, fired_ns: int) -> None:
        c = self.config
        now = time.perf_counter_ns()
        if fired_ns:
            self.state.missed_triggers += 1
            raise self._fail(
                "timeout", f"no frame within {c.stall_timeout_s:g} s of a software trigger"
            )
        if self.waits_for_trigger and now - self._last_ok_ns > c.stall_timeout_s * 1e9 / 2:
            try:  # an idle trigger line: is the camera still there?
                camera.call("get_payload")
            except aravis.ArvError as e:
                raise self._fail(failure_of_arv(e), f"no answer: {e.message}") from None
            self._last_ok_ns = now

    def _take(self, lib: aravis.Lib, buffer: int, fired_ns: int) -> Image | None:
        f = aravis.filled(lib, buffer)
        now_ns, wall_ns = time.perf_counter_ns(), time.time_ns()
        self._last_ok_ns = now_ns
        if f.status != "success":
            self.state.count_incomplete(f.status)
            logger.debug("camera %s: frame %d %s: not handed on", self.config.name,
                         f.frame_id, f.status)  # fmt: skip
            return None
        cpu0 = time.thread_time_ns()
        out = self._ring.take(f.height, f.width)
        try:
            image = convert(f.data, f.size, f.width, f.height, f.pixel_format, out)
        except PixelFormatError as e:
            raise self._fail("misconfigured", str(e)) from None
        self.state.convert_cpu_ns += time.thread_time_ns() - cpu0
        arrival_ns = now_ns - (wall_ns - f.system_timestamp_ns) if f.system_timestamp_ns else now_ns
        clock = self.state.clock
        if f.timestamp_ns:
            clock.arrival(f.timestamp_ns, arrival_ns)
            t_ns = min(clock.to_host(f.timestamp_ns), arrival_ns)
            self.last_clock = "camera"
        else:
            t_ns = arrival_ns
            self.last_clock = "arrival"
        if fired_ns and t_ns < fired_ns:
            t_ns = fired_ns  # exposed after the trigger was sent, whatever the mapping says
            self.last_clock = "trigger"
            self.state.stamps_clamped += 1
        self.last_stamp = (t_ns, (wall_ns - (now_ns - t_ns)) / 1e9)
        self.state.frames += 1
        return image

    def close(self) -> None:
        stream, camera = self._stream, self._camera
        self._stream = self._camera = None
        if stream is not None:
            self.state.session_packets(stream.infos())
            self.state.end_session()
        lost, self._lost = self._lost, False
        if lost:  # each call to a camera that does not answer waits out Aravis's retries
            threading.Thread(
                target=_release, args=(stream, camera), name="genicam-release", daemon=True
            ).start()
            return
        if camera is not None and stream is not None:
            try:
                camera.call("stop_acquisition")
            except aravis.ArvError as e:
                logger.debug("camera %s: AcquisitionStop: %s", self.config.name, e.message)
        _release(stream, camera)


def _release(stream: aravis.ArvStream | None, camera: aravis.ArvCamera | None) -> None:
    """Let the stream and the camera go (a GigE camera's control is given back)."""
    if stream is not None:
        stream.close()
    if camera is not None:
        camera.close()


Step = tuple[str, Any, Callable[[], object], Callable[[], Any]]


def _steps(camera: aravis.ArvCamera, g: GenicamConfig) -> list[Step]:
    """The dedicated keys that are set, in the order a camera takes them (binning before
    the region it bounds; the frame rate before the trigger, which Aravis's frame rate
    call turns off): (name, value, set it, read it back)."""
    call = camera.call
    steps: list[Step] = []
    if g.pixel_format is not None:
        fmt = g.pixel_format
        steps.append(
            (
                "PixelFormat",
                fmt,
                partial(call, "set_pixel_format_from_string", fmt.encode()),
                lambda: aravis.text(call("get_pixel_format_as_string")),
            )
        )
    if g.binning is not None:
        dx, dy = g.binning
        steps.append(
            (
                "Binning",
                f"{dx}x{dy}",
                partial(call, "set_binning", dx, dy),
                lambda: "{}x{}".format(*camera.binning()),
            )
        )
    if g.roi is not None:
        x, y, w, h = g.roi
        steps.append(
            (
                "Region",
                f"{x},{y},{w}x{h}",
                partial(call, "set_region", x, y, w, h),
                lambda: "{},{},{}x{}".format(*camera.region()),
            )
        )
    numbers = (
        ("GevSCPSPacketSize", g.packet_size, "gv_set_packet_size", "gv_get_packet_size"),
        ("GevSCPD", g.packet_delay_ns, "gv_set_packet_delay", "gv_get_packet_delay"),
        ("ExposureTime", g.exposure_us, "set_exposure_time", "get_exposure_time"),
        ("Gain", g.gain, "set_gain", "get_gain"),
        ("AcquisitionFrameRate", g.frame_rate, "set_frame_rate", "get_frame_rate"),
    )
    for name, value, setter, getter in numbers:
        if value is not None:
            steps.append((name, value, partial(call, setter, value), partial(call, getter)))
    return steps


def _same(want: Any, got: Any) -> bool:
    """Whether a feature read back as ``got`` is what was set (``want``)."""
    if isinstance(want, bool) or isinstance(got, bool):
        return feature_text(want).lower() == feature_text(got).lower()
    if isinstance(want, (int, float)):
        try:
            have = float(got)
        except (TypeError, ValueError):
            return False
        if isinstance(want, int):
            return have == want
        return abs(have - want) <= FLOAT_TOLERANCE * max(abs(want), 1e-9)
    return str(want) == str(got)


__all__ = ["GenicamSource", "GenicamState", "name_of"]
