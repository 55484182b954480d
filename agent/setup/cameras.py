"""The V4L2 cameras of this device: the devices ``/sys/class/video4linux`` lists, each asked
with the kernel's ioctls (stdlib ``fcntl``; no v4l2-ctl) what it is, which pixel formats
it delivers and in which frame sizes.

Layouts from ``<linux/videodev2.h>`` (every field a ``__u8`` array or a ``__u32``, no
padding)::

    struct v4l2_capability   driver[16] card[32] bus_info[32] version capabilities
                             device_caps reserved[3]                       104 bytes
    struct v4l2_fmtdesc      index type flags description[32] pixelformat mbus_code
                             reserved[3]                                    64 bytes
    struct v4l2_frmsizeenum  index pixel_format type union{discrete: width height |
                             stepwise: min_w max_w step_w min_h max_h step_h}
                             reserved[2]                                    44 bytes

A device node that is not a capture device (a UVC camera's metadata node, a codec) is
listed with ``capture = False`` and no formats; one that can't be opened carries the
reason in ``error``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.discovery.safetext import one_line

SYSFS_ROOT = Path("/sys")
DEV_DIR = Path("/dev")
_CLASS = "class/video4linux"

# _IOC(dir, type, nr, size) of asm-generic/ioctl.h: dir << 30 | size << 16 | type << 8 | nr.
_IOC_READ = 2
_IOC_WRITE = 1

CAPABILITY = struct.Struct("=16s32s32sIII12x")
FMTDESC = struct.Struct("=III32sII12x")
FRMSIZEENUM = struct.Struct("=III24s8x")
_DISCRETE = struct.Struct("=II")
_STEPWISE = struct.Struct("=IIIIII")

CAP_VIDEO_CAPTURE = 0x00000001
CAP_VIDEO_CAPTURE_MPLANE = 0x00001000
CAP_DEVICE_CAPS = 0x80000000
BUF_TYPE_VIDEO_CAPTURE = 1
BUF_TYPE_VIDEO_CAPTURE_MPLANE = 9
FRMSIZE_TYPE_DISCRETE = 1
FRMSIZE_TYPE_CONTINUOUS = 2
FRMSIZE_TYPE_STEPWISE = 3

MAX_DEVICES = 64
"""At most this many video4linux entries are looked at."""
MAX_FORMATS = 64
MAX_SIZES = 64
"""Enumeration bounds: a driver that never answers EINVAL can't loop us forever."""


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (ord("V") << 8) | nr


VIDIOC_QUERYCAP = _ioc(_IOC_READ, 0, CAPABILITY.size)
VIDIOC_ENUM_FMT = _ioc(_IOC_READ | _IOC_WRITE, 2, FMTDESC.size)
VIDIOC_ENUM_FRAMESIZES = _ioc(_IOC_READ | _IOC_WRITE, 74, FRMSIZEENUM.size)


class CameraProbeError(OSError):
    """A device node could not be opened or asked (errno and the device in the message)."""


@dataclass(frozen=True)
class FrameSize:
    """One frame size: ``discrete`` (width x height), or a ``stepwise``/``continuous``
    range from min to max."""

    kind: str
    width: int
    height: int
    max_width: int = 0
    max_height: int = 0
    step_width: int = 0
    step_height: int = 0

    def __str__(self) -> str:
        if self.kind == "discrete":
            return f"{self.width}x{self.height}"
        return f"{self.width}x{self.height}-{self.max_width}x{self.max_height}"

    def fits(self, width: int, height: int) -> bool:
        """Whether the device can deliver ``width`` x ``height`` in this size entry."""
        if self.kind == "discrete":
            return (self.width, self.height) == (width, height)
        sw, sh = max(self.step_width, 1), max(self.step_height, 1)
        return (
            self.width <= width <= self.max_width
            and self.height <= height <= self.max_height
            and (width - self.width) % sw == 0
            and (height - self.height) % sh == 0
        )


@dataclass(frozen=True)
class PixelFormat:
    """One pixel format: its fourcc (``YUYV``, ``MJPG``), the driver's description, and
    the frame sizes it comes in."""

    fourcc: str
    description: str
    compressed: bool
    sizes: tuple[FrameSize, ...] = ()


@dataclass(frozen=True)
class Camera:
    """One video4linux device node."""

    device: str
    name: str
    driver: str = ""
    card: str = ""
    bus_info: str = ""
    capture: bool = False
    formats: tuple[PixelFormat, ...] = ()
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for fmt in data["formats"]:
            fmt["sizes"] = [str(FrameSize(**s)) for s in fmt["sizes"]]
        return data


@dataclass(frozen=True)
class Capability:
    """What VIDIOC_QUERYCAP answered."""

    driver: str
    card: str
    bus_info: str
    version: int
    capabilities: int
    device_caps: int

    @property
    def caps(self) -> int:
        """The capabilities of this node (``device_caps`` when the driver sets it)."""
        return self.device_caps if self.capabilities & CAP_DEVICE_CAPS else self.capabilities

    @property
    def buffer_type(self) -> int | None:
        """The capture buffer type of this node, or None when it captures no video."""
        if self.caps & CAP_VIDEO_CAPTURE:
            return BUF_TYPE_VIDEO_CAPTURE
        if self.caps & CAP_VIDEO_CAPTURE_MPLANE:
            return BUF_TYPE_VIDEO_CAPTURE_MPLANE
        return None


def _text(raw: bytes) -> str:
    return one_line(raw.split(b"\0", 1)[0].decode("utf-8", errors="replace"))


def fourcc(code: int) -> str:
    """The four characters of a V4L2 pixel format code (``0x56595559`` -> ``YUYV``)."""
    return one_line("".join(chr((code >> (8 * i)) & 0xFF) for i in range(4)).rstrip("\0 "))


def parse_capability(raw: bytes) -> Capability:
    """A ``struct v4l2_capability`` as the kernel filled it in."""
    driver, card, bus, version, caps, device_caps = CAPABILITY.unpack(raw)
    return Capability(_text(driver), _text(card), _text(bus), version, caps, device_caps)


def pack_fmtdesc(index: int, buf_type: int) -> bytes:
    """A ``struct v4l2_fmtdesc`` asking for format ``index`` of ``buf_type``."""
    return FMTDESC.pack(index, buf_type, 0, b"", 0, 0)


def parse_fmtdesc(raw: bytes) -> tuple[str, str, bool]:
    """(fourcc, description, compressed) of a filled ``struct v4l2_fmtdesc``."""
    _, _, flags, desc, pixfmt, _ = FMTDESC.unpack(raw)
    return fourcc(pixfmt), _text(desc), bool(flags & 0x0001)


def pack_frmsizeenum(index: int, pixel_format: int) -> bytes:
    """A ``struct v4l2_frmsizeenum`` asking for size ``index`` of ``pixel_format``."""
    return FRMSIZEENUM.pack(index, pixel_format, 0, b"")


def parse_frmsizeenum(raw: bytes) -> FrameSize | None:
    """The frame size in a filled ``struct v4l2_frmsizeenum`` (None: an unknown type)."""
    _, _, kind, union = FRMSIZEENUM.unpack(raw)
    if kind == FRMSIZE_TYPE_DISCRETE:
        width, height = _DISCRETE.unpack_from(union)
        return FrameSize("discrete", width, height)
    if kind in (FRMSIZE_TYPE_STEPWISE, FRMSIZE_TYPE_CONTINUOUS):
        min_w, max_w, step_w, min_h, max_h, step_h = _STEPWISE.unpack(union)
        name = "stepwise" if kind == FRMSIZE_TYPE_STEPWISE else "continuous"
        return FrameSize(name, min_w, min_h, max_w, max_h, step_w, step_h)
    return None


def _ioctl(fd: int, request: int, arg: bytes) -> bytes | None:
    """The ioctl's answer, or None at the end of an enumeration (EINVAL)."""
    buf = bytearray(arg)
    try:
        fcntl.ioctl(fd, request, buf, True)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
    return bytes(buf)


def query_capability(fd: int) -> Capability:
    """VIDIOC_QUERYCAP on an open device.

    Raises:
        OSError: the ioctl failed (ENOTTY: not a V4L2 device).
    """
    raw = _ioctl(fd, VIDIOC_QUERYCAP, bytes(CAPABILITY.size))
    if raw is None:
        raise OSError(errno.EINVAL, "VIDIOC_QUERYCAP: invalid argument")
    return parse_capability(raw)


def enum_formats(fd: int, buf_type: int) -> list[PixelFormat]:
    """Every pixel format (VIDIOC_ENUM_FMT) with its frame sizes (VIDIOC_ENUM_FRAMESIZES).

    Raises:
        OSError: an ioctl failed with something else than the end of the list.
    """
    formats = []
    for index in range(MAX_FORMATS):
        raw = _ioctl(fd, VIDIOC_ENUM_FMT, pack_fmtdesc(index, buf_type))
        if raw is None:
            break
        code = FMTDESC.unpack(raw)[4]
        name, desc, compressed = parse_fmtdesc(raw)
        formats.append(PixelFormat(name, desc, compressed, tuple(_sizes(fd, code))))
    return formats


def _sizes(fd: int, pixel_format: int) -> list[FrameSize]:
    sizes = []
    for index in range(MAX_SIZES):
        raw = _ioctl(fd, VIDIOC_ENUM_FRAMESIZES, pack_frmsizeenum(index, pixel_format))
        if raw is None:
            break
        size = parse_frmsizeenum(raw)
        if size is not None:
            sizes.append(size)
        if size is None or size.kind != "discrete":
            break  # a range is the only entry
    return sizes


def probe(device: Path, name: str = "") -> Camera:
    """Ask ``device`` (a /dev/videoN node) what it is and what it captures.

    Raises:
        CameraProbeError: it can't be opened, or it is not a V4L2 device (ENOTTY).
    """
    try:
        fd = os.open(device, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise CameraProbeError(exc.errno, f"{device}: cannot open: {exc.strerror}") from exc
    try:
        try:
            cap = query_capability(fd)
        except OSError as exc:
            why = "not a V4L2 device" if exc.errno == errno.ENOTTY else exc.strerror
            raise CameraProbeError(exc.errno, f"{device}: {why}") from exc
        buf_type = cap.buffer_type
        try:
            formats = enum_formats(fd, buf_type) if buf_type is not None else []
        except OSError as exc:
            raise CameraProbeError(exc.errno, f"{device}: VIDIOC_ENUM_FMT: {exc.strerror}") from exc
    finally:
        os.close(fd)
    return Camera(
        str(device),
        name or cap.card,
        cap.driver,
        cap.card,
        cap.bus_info,
        buf_type is not None,
        tuple(formats),
    )


def _uevent_devname(entry: Path) -> str | None:
    try:
        text = (entry / "uevent").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines()[:64]:
        key, _, value = line.partition("=")
        if key == "DEVNAME" and value and ".." not in value:
            return value
    return None


def _index(name: str) -> tuple[int, str]:
    digits = name.removeprefix("video")
    return (int(digits), name) if digits.isdigit() else (1 << 30, name)


def list_cameras(sysfs_root: Path = SYSFS_ROOT, dev_dir: Path = DEV_DIR) -> list[Camera]:
    """Every video4linux device under ``sysfs_root``, probed through its node in
    ``dev_dir`` (named by the entry's ``DEVNAME``, else the entry's name). An empty list
    when there is none (no ``class/video4linux`` at all included). Never raises for one
    device: its problem is in its ``error``."""
    where = sysfs_root / _CLASS
    try:
        entries = sorted(where.iterdir(), key=lambda p: _index(p.name))[:MAX_DEVICES]
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [Camera(str(where), "", error=f"cannot list {where}: {exc.strerror}")]
    cameras = []
    for entry in entries:
        try:
            name = (entry / "name").read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            name = ""
        node = dev_dir / (_uevent_devname(entry) or entry.name)
        try:
            cameras.append(probe(node, name))
        except CameraProbeError as exc:
            cameras.append(Camera(str(node), name, error=str(exc.strerror or exc)))
    return cameras


def format_cameras(cameras: list[Camera]) -> str:
    """The cameras as lines for a terminal; "no cameras found" when there is none."""
    if not cameras:
        return "no cameras found (no V4L2 device in /sys/class/video4linux)\n"
    lines = []
    for cam in cameras:
        head = f"{cam.device}  {cam.name or '?'}"
        if cam.error:
            lines.append(f"{head}  ({cam.error})")
            continue
        if not cam.capture:
            lines.append(f"{head}  (not a video capture node: {cam.driver})")
            continue
        lines.append(f"{head}  [{cam.driver}, {cam.bus_info}]")
        for fmt in cam.formats:
            sizes = " ".join(str(s) for s in fmt.sizes) or "sizes not listed"
            lines.append(f"    {fmt.fourcc:<4} {fmt.description}: {sizes}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Choice:
    """The frame size setup asks a camera for, and why."""

    width: int
    height: int
    reason: str = field(default="")


PREFERRED = (640, 480)


def choose_size(camera: Camera) -> Choice:
    """640 x 480 when the camera offers it (the agent's default), else the smallest size
    at least 640 wide, else the largest it offers; the default when it lists none."""
    sizes = [s for f in camera.formats for s in f.sizes]
    if not sizes or any(s.fits(*PREFERRED) for s in sizes):
        return Choice(*PREFERRED, "the default")
    discrete = sorted({(s.width, s.height) for s in sizes if s.kind == "discrete"})
    wide = [wh for wh in discrete if wh[0] >= PREFERRED[0]]
    if wide:
        return Choice(*wide[0], "the smallest it offers at least 640 wide")
    if discrete:
        return Choice(*discrete[-1], "the largest it offers")
    return Choice(*PREFERRED, "the default")
