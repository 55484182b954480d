"""The size of a JPEG, read from its header (pure; no image library, nothing decoded).

A thumbnail that crosses the wire is checked with :func:`jpeg_size` before it is stored:
it must start with the SOI marker and hold a start-of-frame segment with a size.
"""

from __future__ import annotations

_SOI = b"\xff\xd8"
# Start-of-frame markers: C0-CF less DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length: TEM, RST0-7 (SOI and EOI are handled apart).
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})
_EOI = 0xD9
_SOS = 0xDA


class JpegError(ValueError):
    """The bytes are not a JPEG whose size can be read."""


def jpeg_size(data: bytes) -> tuple[int, int]:
    """The (width, height) in the first start-of-frame segment of a JPEG.

    Raises:
        JpegError: no SOI marker, a truncated or malformed segment, or no frame header
            before the image data.
    """
    if not data.startswith(_SOI):
        raise JpegError("not a JPEG (no FF D8 start-of-image marker)")
    i, n = 2, len(data)
    while i < n:
        if data[i] != 0xFF:
            raise JpegError(f"malformed JPEG: no marker at byte {i}")
        while i < n and data[i] == 0xFF:  # fill bytes
            i += 1
        if i >= n:
            break
        marker = data[i]
        i += 1
        if marker in _STANDALONE:
            continue
        if marker in (_EOI, _SOS):
            break
        if i + 2 > n:
            break
        length = int.from_bytes(data[i : i + 2], "big")
        if length < 2 or i + length > n:
            raise JpegError(f"malformed JPEG: segment FF {marker:02X} of length {length}")
        if marker in _SOF:
            if length < 7:
                raise JpegError(f"malformed JPEG: frame header of length {length}")
            height = int.from_bytes(data[i + 3 : i + 5], "big")
            width = int.from_bytes(data[i + 5 : i + 7], "big")
            if width == 0 or height == 0:
                raise JpegError(f"JPEG frame header says {width} x {height}")
            return width, height
        i += length
    raise JpegError("truncated JPEG: no frame header before the image data")
