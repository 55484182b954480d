"""Image preprocessing that writes straight into a model's input tensor.

A :class:`Preprocessor` is built once per (worker, model) with every intermediate
buffer preallocated; :meth:`Preprocessor.run` turns a raw uint8 frame (H x W x C, BGR as
OpenCV delivers it, or grey) into the model's input (resize, colour order, mean/std
normalisation, NCHW or NHWC layout, dtype) with no allocation of tensor data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import cv2
import numpy as np

from runtime.backends.base import Array
from runtime.errors import InputShapeError


@dataclass(frozen=True)
class PreprocessSpec:
    """How a frame becomes the model input.

    Attributes:
        color: channel order the model expects ("rgb", "bgr" or "gray").
        layout: "nchw" or "nhwc"; size and dtype come from the model's input tensor.
        scale: multiplied into the pixel values first (e.g. 1/255).
        mean, std: per channel, applied after scaling: ``(x * scale - mean) / std``.
        interpolation: "linear", "nearest" or "area".
    """

    color: Literal["rgb", "bgr", "gray"] = "rgb"
    layout: Literal["nchw", "nhwc"] = "nchw"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    interpolation: Literal["linear", "nearest", "area"] = "linear"


_INTERP = {"linear": cv2.INTER_LINEAR, "nearest": cv2.INTER_NEAREST, "area": cv2.INTER_AREA}


def model_hw(spec: PreprocessSpec, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(height, width, channels) of a single-image model input of ``input_shape``."""
    if len(input_shape) != 4 or input_shape[0] != 1:
        raise ValueError(f"preprocessing needs a [1, ...] image input, got {input_shape}")
    if spec.layout == "nchw":
        _, c, h, w = input_shape
    else:
        _, h, w, c = input_shape
    return h, w, c


class Preprocessor:
    """Preallocated preprocessing for one model input on one worker."""

    def __init__(self, spec: PreprocessSpec, input_shape: tuple[int, ...], dtype: Any) -> None:
        self.spec = spec
        self.dtype = np.dtype(dtype)
        self.h, self.w, self.c = model_hw(spec, input_shape)
        channels = 1 if spec.color == "gray" else 3
        if self.c != channels:
            raise ValueError(
                f"preprocess colour '{spec.color}' gives {channels} channels; "
                f"the model input has {self.c}"
            )
        self._interp = _INTERP[spec.interpolation]
        self._resized = np.empty((self.h, self.w, 3), np.uint8)
        self._colored = np.empty((self.h, self.w, self.c), np.uint8)
        self._float = np.empty((self.h, self.w, self.c), np.float32)
        n = self.c
        mean = np.resize(np.asarray(spec.mean, np.float32), n)
        std = np.resize(np.asarray(spec.std, np.float32), n)
        self._mul = (np.float32(spec.scale) / std).astype(np.float32)
        self._add = (-mean / std).astype(np.float32)
        self._identity = (
            self.dtype == np.uint8 and bool(np.all(self._mul == 1)) and not np.any(self._add)
        )

    def run(self, frame: Array, out: Array) -> None:
        """Write the preprocessed ``frame`` into ``out`` (the slot's input tensor)."""
        if frame.ndim == 2:
            frame = frame[:, :, None]
        if frame.ndim != 3 or frame.shape[2] not in (1, 3):
            raise InputShapeError("frame", (-1, -1, 3), frame.shape)
        src = frame
        if frame.shape[2] == 1:
            src = cv2.cvtColor(frame, cv2.COLOR_GRAY2BGR)  # rare path: grey cameras
        cv2.resize(src, (self.w, self.h), dst=self._resized, interpolation=self._interp)
        if self.spec.color == "rgb":
            cv2.cvtColor(self._resized, cv2.COLOR_BGR2RGB, dst=self._colored)
        elif self.spec.color == "gray":
            gray = self._colored.reshape(self.h, self.w)  # a view: c == 1
            cv2.cvtColor(self._resized, cv2.COLOR_BGR2GRAY, dst=gray)
        else:
            np.copyto(self._colored, self._resized)
        hwc: Array
        if self._identity:
            hwc = self._colored
        else:
            np.multiply(self._colored, self._mul, out=self._float)
            np.add(self._float, self._add, out=self._float)
            hwc = self._float
        target = out[0].transpose(1, 2, 0) if self.spec.layout == "nchw" else out[0]
        np.copyto(target, hwc, casting="unsafe")
