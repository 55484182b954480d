"""GenICam pixel formats converted to the pipeline's BGR, into preallocated images.

A frame's bytes stay in Aravis's buffer; OpenCV converts them straight into an image of a
:class:`FrameRing` (``cvtColor(..., dst=)``), so a frame costs no allocation. An image is
reused only once nothing else holds it (its reference count: the pipeline, the latest
slot, a view of it); when every image of the ring is held, a new one is allocated and
counted (:attr:`FrameRing.allocated`), so a slow consumer never sees its frame
overwritten.
"""

from __future__ import annotations

import ctypes
import sys

import cv2
import numpy as np
import numpy.typing as npt

Image = npt.NDArray[np.uint8]

CODES = {
    "Mono8": 0x01080001,
    "BayerGR8": 0x01080008,
    "BayerRG8": 0x01080009,
    "BayerGB8": 0x0108000A,
    "BayerBG8": 0x0108000B,
    "RGB8": 0x02180014,
    "BGR8": 0x02180015,
}
"""PFNC codes (what a buffer says it holds) of the formats the agent converts."""
NAMES = {code: name for name, code in CODES.items()}

# (bytes per pixel, OpenCV conversion to BGR; None: the bytes are BGR already). OpenCV's
# Bayer codes name the pattern by its first 2x2 block: GenICam's BayerRG8 is RGGB.
_CONVERT: dict[int, tuple[int, int | None]] = {
    CODES["Mono8"]: (1, cv2.COLOR_GRAY2BGR),
    CODES["BayerRG8"]: (1, cv2.COLOR_BayerRGGB2BGR),
    CODES["BayerGR8"]: (1, cv2.COLOR_BayerGRBG2BGR),
    CODES["BayerGB8"]: (1, cv2.COLOR_BayerGBRG2BGR),
    CODES["BayerBG8"]: (1, cv2.COLOR_BayerBGGR2BGR),
    CODES["RGB8"]: (3, cv2.COLOR_RGB2BGR),
    CODES["BGR8"]: (3, None),
}

_FREE_REFS = 3
"""``sys.getrefcount`` of a ring image nobody else holds: the ring's list, the loop's
name and the call's argument."""


class PixelFormatError(ValueError):
    """A buffer in a pixel format the agent does not convert, or shorter than its size."""


def name_of(code: int) -> str:
    """The PFNC name of ``code`` (hex when it is not one the agent converts)."""
    return NAMES.get(code, f"0x{code:08x}")


class FrameRing:
    """Up to ``size`` preallocated HxWx3 images, each reused once nobody holds it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._images: list[Image] = []
        self.allocated = 0
        """Images allocated: the ring's own first ones, then one per frame for which
        every image of the ring was still held."""

    def take(self, height: int, width: int) -> Image:
        """An image of that size nobody else holds, writable."""
        for image in self._images:
            if sys.getrefcount(image) <= _FREE_REFS and image.shape[:2] == (height, width):
                image.flags.writeable = True
                return image
        image = np.empty((height, width, 3), np.uint8)
        self.allocated += 1
        if len(self._images) < self.size:
            self._images.append(image)
        else:  # a new size (a changed ROI) replaces the oldest held-or-not image
            stale = [i for i, im in enumerate(self._images) if im.shape[:2] != (height, width)]
            if stale:
                self._images[stale[0]] = image
        return image


def convert(data: int, size: int, width: int, height: int, code: int, out: Image) -> Image:
    """The ``size`` bytes at address ``data`` (a ``width`` x ``height`` frame in PFNC
    ``code``) as BGR in ``out`` (HxWx3, preallocated).

    Raises:
        PixelFormatError: ``code`` is not converted here, or the data is too short.
    """
    spec = _CONVERT.get(code)
    if spec is None:
        raise PixelFormatError(
            f"pixel format {name_of(code)} is not one the agent converts ({', '.join(CODES)})"
        )
    need = width * height * spec[0]
    if size < need or data == 0:
        raise PixelFormatError(
            f"a {width}x{height} {name_of(code)} frame has {size} bytes, needs {need}"
        )
    flat = np.frombuffer(memoryview((ctypes.c_uint8 * need).from_address(data)), np.uint8)
    return convert_array(flat, width, height, code, out)


def convert_array(flat: Image, width: int, height: int, code: int, out: Image) -> Image:
    """:func:`convert` of bytes already in an array (``flat``: at least W*H*bpp bytes)."""
    spec = _CONVERT.get(code)
    if spec is None:
        raise PixelFormatError(f"pixel format {name_of(code)} is not one the agent converts")
    bpp, how = spec
    src = flat[: width * height * bpp].reshape((height, width, bpp) if bpp > 1 else (height, width))
    if how is None:
        np.copyto(out, src)
    else:
        cv2.cvtColor(src, how, dst=out)
    return out
