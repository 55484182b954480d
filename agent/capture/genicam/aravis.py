"""Aravis 0.8 (``libaravis-0.8.so.0``, Debian's libaravis-0.8-0) through ctypes: the calls
the agent's GenICam cameras make, each error Aravis reports raised as :class:`ArvError`.

Why ctypes and not PyGObject or the ``aravissrc`` element: docs/adr/0025-genicam-through-
aravis.md. The calls are Aravis's own C API (``arv_camera_*`` picks the SFNC or the older
feature names a camera has, ``ExposureTime`` or ``ExposureTimeAbs``, ``Gain`` or
``GainRaw``). ctypes lets go of the GIL during each call, so a capture thread waiting in
:meth:`Stream.pop` holds no other thread up. Objects are owned by the Python wrapper that
made them and unreferenced in its ``close``; nothing here is shared between threads.

The library is loaded when first used (:func:`library`); a machine without it gets
:class:`AravisUnavailable` naming the package to install.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from ctypes import (
    POINTER,
    Structure,
    byref,
    c_bool,
    c_char_p,
    c_double,
    c_int,
    c_int64,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)
from dataclasses import dataclass
from typing import Any

LIBRARY = "libaravis-0.8.so.0"
PACKAGE = "libaravis-0.8-0"

# ArvBufferStatus (arvbuffer.h)
BUFFER_STATUS = {
    -1: "unknown",
    0: "success",
    1: "cleared",
    2: "timeout",
    3: "missing_packets",
    4: "wrong_packet_id",
    5: "size_mismatch",
    6: "filling",
    7: "aborted",
    8: "payload_not_supported",
}


class ArvError(Exception):
    """An error Aravis reported (its ``GError``).

    Attributes:
        message: Aravis's text, as it said it.
        domain: the error's domain (``arv-device-error-quark``...).
        code: the error's code in that domain.
    """

    def __init__(self, message: str, domain: str = "", code: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.domain = domain
        self.code = code


class AravisUnavailable(ArvError):
    """libaravis can't be loaded on this machine."""


class _GError(Structure):
    _fields_ = (("domain", c_uint32), ("code", c_int), ("message", c_char_p))


_GErrorP = POINTER(_GError)


class Lib:
    """The loaded libraries with every function's signature declared."""

    def __init__(self) -> None:
        try:
            self.arv = ctypes.CDLL(LIBRARY)
        except OSError as e:
            raise AravisUnavailable(
                f"{LIBRARY} can't be loaded ({e}); install Debian's {PACKAGE}"
            ) from None
        self.glib = ctypes.CDLL("libglib-2.0.so.0")
        self.gobject = ctypes.CDLL("libgobject-2.0.so.0")
        self._declare()
        self.lock = threading.Lock()
        """Held around the device list (a process-wide table in Aravis)."""

    def _declare(self) -> None:
        a, g, o = self.arv, self.glib, self.gobject
        err = POINTER(_GErrorP)
        sigs: dict[str, tuple[Any, list[Any]]] = {
            # the device list
            "arv_enable_interface": (None, [c_char_p]),
            "arv_update_device_list": (None, []),
            "arv_get_n_devices": (c_uint, []),
            "arv_get_device_id": (c_char_p, [c_uint]),
            "arv_get_device_physical_id": (c_char_p, [c_uint]),
            "arv_get_device_address": (c_char_p, [c_uint]),
            "arv_get_device_vendor": (c_char_p, [c_uint]),
            "arv_get_device_model": (c_char_p, [c_uint]),
            "arv_get_device_serial_nbr": (c_char_p, [c_uint]),
            "arv_get_device_protocol": (c_char_p, [c_uint]),
            "arv_get_major_version": (c_uint, []),
            "arv_get_minor_version": (c_uint, []),
            "arv_get_micro_version": (c_uint, []),
            # the camera
            "arv_camera_new": (c_void_p, [c_char_p, err]),
            "arv_camera_get_device": (c_void_p, [c_void_p]),
            "arv_camera_is_gv_device": (c_bool, [c_void_p]),
            "arv_camera_get_vendor_name": (c_char_p, [c_void_p, err]),
            "arv_camera_get_model_name": (c_char_p, [c_void_p, err]),
            "arv_camera_get_device_serial_number": (c_char_p, [c_void_p, err]),
            "arv_camera_get_payload": (c_uint, [c_void_p, err]),
            "arv_camera_set_range_check_policy": (None, [c_void_p, c_int]),
            "arv_camera_set_pixel_format_from_string": (None, [c_void_p, c_char_p, err]),
            "arv_camera_get_pixel_format_as_string": (c_char_p, [c_void_p, err]),
            "arv_camera_set_exposure_time": (None, [c_void_p, c_double, err]),
            "arv_camera_get_exposure_time": (c_double, [c_void_p, err]),
            "arv_camera_set_gain": (None, [c_void_p, c_double, err]),
            "arv_camera_get_gain": (c_double, [c_void_p, err]),
            "arv_camera_set_frame_rate": (None, [c_void_p, c_double, err]),
            "arv_camera_get_frame_rate": (c_double, [c_void_p, err]),
            "arv_camera_set_region": (None, [c_void_p, c_int, c_int, c_int, c_int, err]),
            "arv_camera_get_region": (None, [c_void_p, *[POINTER(c_int)] * 4, err]),
            "arv_camera_get_sensor_size": (None, [c_void_p, POINTER(c_int), POINTER(c_int), err]),
            "arv_camera_set_binning": (None, [c_void_p, c_int, c_int, err]),
            "arv_camera_get_binning": (None, [c_void_p, POINTER(c_int), POINTER(c_int), err]),
            "arv_camera_gv_set_packet_size": (None, [c_void_p, c_int, err]),
            "arv_camera_gv_get_packet_size": (c_uint, [c_void_p, err]),
            "arv_camera_gv_set_packet_delay": (None, [c_void_p, c_int64, err]),
            "arv_camera_gv_get_packet_delay": (c_int64, [c_void_p, err]),
            "arv_camera_set_acquisition_mode": (None, [c_void_p, c_int, err]),
            "arv_camera_set_trigger": (None, [c_void_p, c_char_p, err]),
            "arv_camera_clear_triggers": (None, [c_void_p, err]),
            "arv_camera_software_trigger": (None, [c_void_p, err]),
            "arv_camera_start_acquisition": (None, [c_void_p, err]),
            "arv_camera_stop_acquisition": (None, [c_void_p, err]),
            "arv_camera_create_stream": (c_void_p, [c_void_p, c_void_p, c_void_p, err]),
            # features by name
            "arv_device_get_feature": (c_void_p, [c_void_p, c_char_p]),
            "arv_device_execute_command": (None, [c_void_p, c_char_p, err]),
            "arv_device_get_integer_feature_value": (c_int64, [c_void_p, c_char_p, err]),
            "arv_device_get_string_feature_value": (c_char_p, [c_void_p, c_char_p, err]),
            "arv_gc_feature_node_set_value_from_string": (None, [c_void_p, c_char_p, err]),
            "arv_gc_feature_node_get_value_as_string": (c_char_p, [c_void_p, err]),
            "arv_gc_feature_node_is_available": (c_bool, [c_void_p, err]),
            "arv_gc_feature_node_is_implemented": (c_bool, [c_void_p, err]),
            "arv_gc_integer_get_type": (c_size_t, []),
            "arv_gc_float_get_type": (c_size_t, []),
            "arv_gc_boolean_get_type": (c_size_t, []),
            "arv_gc_enumeration_get_type": (c_size_t, []),
            "arv_gc_string_get_type": (c_size_t, []),
            "arv_gc_command_get_type": (c_size_t, []),
            # the stream and its buffers
            "arv_stream_push_buffer": (None, [c_void_p, c_void_p]),
            "arv_stream_timeout_pop_buffer": (c_void_p, [c_void_p, c_uint64]),
            "arv_stream_try_pop_buffer": (c_void_p, [c_void_p]),
            "arv_stream_get_n_infos": (c_uint, [c_void_p]),
            "arv_stream_get_info_name": (c_char_p, [c_void_p, c_uint]),
            "arv_stream_get_info_type": (c_size_t, [c_void_p, c_uint]),
            "arv_stream_get_info_uint64": (c_uint64, [c_void_p, c_uint]),
            "arv_buffer_new": (c_void_p, [c_size_t, c_void_p]),
            "arv_buffer_get_status": (c_int, [c_void_p]),
            "arv_buffer_get_image_data": (c_void_p, [c_void_p, POINTER(c_size_t)]),
            "arv_buffer_get_image_width": (c_int, [c_void_p]),
            "arv_buffer_get_image_height": (c_int, [c_void_p]),
            "arv_buffer_get_image_pixel_format": (c_uint32, [c_void_p]),
            "arv_buffer_get_payload_type": (c_int, [c_void_p]),
            "arv_buffer_get_timestamp": (c_uint64, [c_void_p]),
            "arv_buffer_get_system_timestamp": (c_uint64, [c_void_p]),
            "arv_buffer_get_frame_id": (c_uint64, [c_void_p]),
        }
        for name, (res, args) in sigs.items():
            fn = getattr(a, name)
            fn.restype, fn.argtypes = res, args
        g.g_error_free.restype, g.g_error_free.argtypes = None, [_GErrorP]
        g.g_quark_to_string.restype, g.g_quark_to_string.argtypes = c_char_p, [c_uint32]
        o.g_object_unref.restype, o.g_object_unref.argtypes = None, [c_void_p]
        o.g_type_check_instance_is_a.restype = c_bool
        o.g_type_check_instance_is_a.argtypes = [c_void_p, c_size_t]
        g.g_free.restype, g.g_free.argtypes = None, [c_void_p]

    def call(self, name: str, *args: Any) -> Any:
        """Call ``arv_<name>`` with a ``GError`` out-argument last.

        Raises:
            ArvError: Aravis set the error (its text, domain and code).
        """
        error = _GErrorP()
        result = getattr(self.arv, f"arv_{name}")(*args, byref(error))
        if error:
            e = error.contents
            text = (e.message or b"").decode("utf-8", "replace")
            domain = (self.glib.g_quark_to_string(e.domain) or b"").decode("ascii", "replace")
            code = int(e.code)
            self.glib.g_error_free(error)
            raise ArvError(text, domain, code)
        return result

    def version(self) -> str:
        a = self.arv
        return (
            f"{a.arv_get_major_version()}.{a.arv_get_minor_version()}.{a.arv_get_micro_version()}"
        )


@functools.cache
def library() -> Lib:
    """The loaded library (once per process).

    Raises:
        AravisUnavailable: libaravis-0.8 is not installed.
    """
    return Lib()


def text(value: bytes | None) -> str:
    return (value or b"").decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One camera Aravis found (what its discovery said; nothing opened)."""

    id: str
    vendor: str
    model: str
    serial: str
    protocol: str
    address: str
    physical_id: str


def devices(interfaces: tuple[str, ...] = ()) -> list[DeviceInfo]:
    """The cameras Aravis finds now (GigE Vision by broadcast on every interface, USB3
    Vision on the bus; ``interfaces`` adds others, such as ``Fake``).

    Raises:
        AravisUnavailable: libaravis-0.8 is not installed.
    """
    lib = library()
    a = lib.arv
    with lib.lock:
        for name in interfaces:
            a.arv_enable_interface(name.encode())
        a.arv_update_device_list()
        return [
            DeviceInfo(
                id=text(a.arv_get_device_id(i)),
                vendor=text(a.arv_get_device_vendor(i)),
                model=text(a.arv_get_device_model(i)),
                serial=text(a.arv_get_device_serial_nbr(i)),
                protocol=text(a.arv_get_device_protocol(i)),
                address=text(a.arv_get_device_address(i)),
                physical_id=text(a.arv_get_device_physical_id(i)),
            )
            for i in range(a.arv_get_n_devices())
        ]


FEATURE_TYPES = ("command", "boolean", "enumeration", "string", "float", "integer")
"""In the order they are told apart: an enumeration is an integer too."""


class ArvCamera:
    """An open camera (``arv_camera_new``); :meth:`close` lets it go."""

    def __init__(self, device_id: str) -> None:
        """Raises: ArvError: no such camera, or it can't be opened (Aravis's text)."""
        self.lib = library()
        with self.lib.lock:
            self.ptr: int | None = self.lib.call("camera_new", device_id.encode() or None)
        self.device = self.lib.arv.arv_camera_get_device(self.ptr)

    def describe(self) -> str:
        """Vendor, model and serial number, as the camera says them."""
        parts = []
        for what in ("vendor_name", "model_name", "device_serial_number"):
            try:
                parts.append(text(self.call(f"get_{what}")))
            except ArvError:
                parts.append("?")
        return " ".join(parts)

    def call(self, name: str, *args: Any) -> Any:
        """``arv_camera_<name>(camera, *args, &error)``."""
        if self.ptr is None:
            raise ArvError("camera closed")
        return self.lib.call(f"camera_{name}", self.ptr, *args)

    @property
    def is_gv(self) -> bool:
        return bool(self.ptr is not None and self.lib.arv.arv_camera_is_gv_device(self.ptr))

    def region(self) -> tuple[int, int, int, int]:
        x, y, w, h = c_int(), c_int(), c_int(), c_int()
        self.call("get_region", byref(x), byref(y), byref(w), byref(h))
        return x.value, y.value, w.value, h.value

    def binning(self) -> tuple[int, int]:
        dx, dy = c_int(), c_int()
        self.call("get_binning", byref(dx), byref(dy))
        return dx.value, dy.value

    def sensor_size(self) -> tuple[int, int]:
        w, h = c_int(), c_int()
        self.call("get_sensor_size", byref(w), byref(h))
        return w.value, h.value

    def feature_type(self, name: str) -> str | None:
        """``integer``, ``float``, ``boolean``, ``enumeration``, ``string``, ``command``,
        ``other``; None when the camera has no feature of that name."""
        node = self.lib.arv.arv_device_get_feature(self.device, name.encode())
        if not node:
            return None
        check = self.lib.gobject.g_type_check_instance_is_a
        for kind in FEATURE_TYPES:
            if check(node, getattr(self.lib.arv, f"arv_gc_{kind}_get_type")()):
                return kind
        return "other"

    def _node(self, name: str) -> int:
        node = self.lib.arv.arv_device_get_feature(self.device, name.encode())
        if not node:
            raise ArvError(f"[{name}] Not found")
        return int(node)

    def set_feature(self, name: str, value: str) -> None:
        """Set a feature from its text (an enumeration's entry, a number, true/false).

        Raises:
            ArvError: no such feature, or the camera refused the value (Aravis's text).
        """
        self.lib.call("gc_feature_node_set_value_from_string", self._node(name), value.encode())

    def get_feature(self, name: str) -> str:
        """A feature's value as the camera says it now (text)."""
        return text(self.lib.call("gc_feature_node_get_value_as_string", self._node(name)))

    def feature_available(self, name: str) -> bool:
        node = self.lib.arv.arv_device_get_feature(self.device, name.encode())
        if not node:
            return False
        try:
            return bool(self.lib.call("gc_feature_node_is_available", node))
        except ArvError:
            return False

    def execute(self, name: str) -> None:
        self.lib.call("device_execute_command", self.device, name.encode())

    def integer(self, name: str) -> int:
        return int(self.lib.call("device_get_integer_feature_value", self.device, name.encode()))

    def string(self, name: str) -> str:
        return text(self.lib.call("device_get_string_feature_value", self.device, name.encode()))

    def close(self) -> None:
        if self.ptr is not None:
            self.lib.gobject.g_object_unref(self.ptr)
            self.ptr = None


class ArvStream:
    """The camera's stream with ``n`` buffers of ``size`` bytes pushed to it (Aravis
    allocates them once; the agent converts out of them and pushes each one back)."""

    def __init__(self, camera: ArvCamera, n: int, size: int) -> None:
        """Raises: ArvError: the stream can't be made (Aravis's text)."""
        self.lib = camera.lib
        self.ptr: int | None = camera.call("create_stream", None, None)
        if not self.ptr:
            raise ArvError("the camera gave no stream")
        for _ in range(n):
            self.lib.arv.arv_stream_push_buffer(self.ptr, self.lib.arv.arv_buffer_new(size, None))

    def pop(self, timeout_us: int) -> int | None:
        """The next filled buffer (complete or not), None after ``timeout_us``."""
        if self.ptr is None:
            return None
        buf = self.lib.arv.arv_stream_timeout_pop_buffer(self.ptr, timeout_us)
        return int(buf) if buf else None

    def push(self, buffer: int) -> None:
        if self.ptr is not None:
            self.lib.arv.arv_stream_push_buffer(self.ptr, buffer)

    def infos(self) -> dict[str, int]:
        """The stream's counters (``n_completed_buffers``, ``n_missing_packets``,
        ``n_resent_packets``...: as many as this transport has; guint64 ones only)."""
        if self.ptr is None:
            return {}
        a = self.lib.arv
        out: dict[str, int] = {}
        for i in range(a.arv_stream_get_n_infos(self.ptr)):
            if a.arv_stream_get_info_type(self.ptr, i) != _G_TYPE_UINT64:
                continue
            out[text(a.arv_stream_get_info_name(self.ptr, i))] = int(
                a.arv_stream_get_info_uint64(self.ptr, i)
            )
        return out

    def close(self) -> None:
        """Unreference the stream (its thread ends, its buffers are freed)."""
        if self.ptr is not None:
            self.lib.gobject.g_object_unref(self.ptr)
            self.ptr = None


_G_TYPE_UINT64 = 11 << 2
"""GType of guint64 (``G_TYPE_MAKE_FUNDAMENTAL (11)``, gtype.h)."""


@dataclass(frozen=True, slots=True)
class Filled:
    """What a popped buffer holds (the data stays in Aravis's buffer until it is pushed)."""

    status: str
    data: int
    size: int
    width: int
    height: int
    pixel_format: int
    timestamp_ns: int
    system_timestamp_ns: int
    frame_id: int


def filled(lib: Lib, buffer: int) -> Filled:
    a = lib.arv
    size = c_size_t()
    status = BUFFER_STATUS.get(a.arv_buffer_get_status(buffer), "unknown")
    data = a.arv_buffer_get_image_data(buffer, byref(size)) if status == "success" else None
    return Filled(
        status=status,
        data=int(data or 0),
        size=int(size.value),
        width=int(a.arv_buffer_get_image_width(buffer)),
        height=int(a.arv_buffer_get_image_height(buffer)),
        pixel_format=int(a.arv_buffer_get_image_pixel_format(buffer)),
        timestamp_ns=int(a.arv_buffer_get_timestamp(buffer)),
        system_timestamp_ns=int(a.arv_buffer_get_system_timestamp(buffer)),
        frame_id=int(a.arv_buffer_get_frame_id(buffer)),
    )
