"""Compressed payloads: a payload may be gzip (RFC 1952) instead of plain JSON.

A JSON text never starts with the gzip magic bytes ``1f 8b`` (``0x1f`` is a control
character and ``0x8b`` is not a UTF-8 lead byte), so a receiver tells the two apart by
the first two bytes; no MQTT property is needed. The agent's outbox sends decision uploads
gzipped (rows of one line compress 5-10 times). The uncompressed size is held to the same
limit as a plain payload, checked while inflating, so a small bomb can't fill memory.
"""

from __future__ import annotations

import gzip
import zlib

GZIP_MAGIC = b"\x1f\x8b"
_GZIP_WBITS = 16 + zlib.MAX_WBITS
LEVEL = 6


class CompressedPayloadError(ValueError):
    """A gzip payload is damaged, or inflates past the limit.

    Attributes:
        reason: what is wrong.
        too_large: it inflates past the limit (else it is damaged).
    """

    def __init__(self, reason: str, *, too_large: bool = False) -> None:
        self.reason = reason
        self.too_large = too_large
        super().__init__(reason)


def compress(data: bytes, level: int = LEVEL) -> bytes:
    """``data`` gzipped (no file name, time 0: the same bytes give the same payload)."""
    return gzip.compress(data, compresslevel=level, mtime=0)


def is_compressed(payload: bytes | bytearray | memoryview) -> bool:
    """Whether the payload starts with the gzip magic."""
    return bytes(payload[:2]) == GZIP_MAGIC


def decompress(payload: bytes | bytearray | memoryview, max_bytes: int) -> bytes:
    """The inflated payload, at most ``max_bytes``.

    Raises:
        CompressedPayloadError: not valid gzip, truncated, trailing data, or over
            ``max_bytes`` once inflated.
    """
    inflater = zlib.decompressobj(_GZIP_WBITS)
    try:
        data = inflater.decompress(bytes(payload), max_bytes + 1)
    except zlib.error as exc:
        raise CompressedPayloadError(f"damaged gzip: {exc}") from exc
    if len(data) > max_bytes or inflater.unconsumed_tail:
        raise CompressedPayloadError(
            f"gzip payload inflates to more than the limit of {max_bytes} bytes", too_large=True
        )
    if not inflater.eof:
        raise CompressedPayloadError("truncated gzip")
    if inflater.unused_data:
        raise CompressedPayloadError(
            f"{len(inflater.unused_data)} bytes after the end of the gzip stream"
        )
    return data
