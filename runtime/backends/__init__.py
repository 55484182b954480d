"""Backend registry.

Each backend module declares ``KEY`` and a backend class. The registry imports them
lazily: a backend whose package can't be imported on this device (not installed, built
against another NumPy, ...) is reported as unavailable with the reason, never a crash.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from runtime.backends.base import Backend, BackendOptions, TensorSpec
from runtime.errors import BackendUnavailable, ModelLoadError

__all__ = [
    "Backend",
    "BackendInfo",
    "BackendOptions",
    "TensorSpec",
    "available_backends",
    "backend_class",
    "detect_backend",
    "open_model",
]

# key -> (module, class name)
_BACKENDS: dict[str, tuple[str, str]] = {
    "onnx": ("runtime.backends.onnx", "OnnxBackend"),
    "litert": ("runtime.backends.litert", "LiteRTBackend"),
}

_TFLITE_MAGIC = b"TFL3"


@dataclass(frozen=True)
class BackendInfo:
    key: str
    available: bool
    reason: str  # why not, or the package that provides it


def backend_class(key: str) -> type[Backend]:
    """Import and return a backend class.

    Raises:
        BackendUnavailable: unknown key, or its package can't be imported here.
    """
    try:
        module_name, class_name = _BACKENDS[key]
    except KeyError:
        raise BackendUnavailable(key, f"unknown backend (known: {', '.join(_BACKENDS)})") from None
    try:
        module = importlib.import_module(module_name)
    except BackendUnavailable:
        raise
    except Exception as exc:  # ImportError, NumPy ABI errors, ... all mean "unavailable"
        raise BackendUnavailable(key, f"{type(exc).__name__}: {exc}") from exc
    cls: type[Backend] = getattr(module, class_name)
    return cls


def available_backends() -> list[BackendInfo]:
    """Every known backend, with whether it imports here and why not."""
    infos = []
    for key in _BACKENDS:
        try:
            backend_class(key)
        except BackendUnavailable as exc:
            infos.append(BackendInfo(key, False, exc.reason))
        else:
            infos.append(BackendInfo(key, True, "ok"))
    return infos


def detect_backend(path: str) -> str:
    """Pick the backend for a model file from its content (then its extension).

    Raises:
        ModelLoadError: the file is missing, empty or of no known format.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise ModelLoadError(path, exc.strerror or str(exc)) from exc
    if not head:
        raise ModelLoadError(path, "file is empty")
    if head[4:8] == _TFLITE_MAGIC:
        return "litert"
    ext = os.path.splitext(path)[1].lower()
    if ext == ".onnx":
        return "onnx"
    if ext in (".tflite", ".lite"):
        raise ModelLoadError(path, "not a TFLite flatbuffer (no 'TFL3' identifier)")
    raise ModelLoadError(path, f"unknown model format '{ext}' (expected .onnx or .tflite)")


def open_model(path: str, options: BackendOptions, backend: str | None = None) -> Backend:
    """Load ``path`` on ``backend`` (detected from the file when ``None``).

    Raises:
        ModelLoadError: the file can't be loaded.
        BackendUnavailable: the backend can't be imported on this device.
    """
    key = backend or detect_backend(path)
    return backend_class(key)(path, options)
