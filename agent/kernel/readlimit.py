"""Reading a file that came from outside (removable media, the fleet, an operator) with
its size limit enforced before the rest of it is read.

A 4 GiB "directive" on a USB stick costs the device ``limit + 1`` bytes of memory, not
4 GiB: the file is opened and read up to one byte past its limit, and refused when that
byte exists.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent.wire.untrusted import PayloadTooLarge


def read_at_most(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path`` when it holds at most ``limit`` of them.

    Args:
        path: the file.
        limit: the most bytes accepted.
        what: names the file in the error ("directive", "trusted root").

    Raises:
        PayloadTooLarge: the file holds more than ``limit`` bytes (its size, when the
            file is a regular one; else ``limit + 1``), named as ``"<what> <path>"``.
        OSError: the file can't be opened or read (missing, a directory ...).
    """
    with Path(path).open("rb") as f:
        data = f.read(limit + 1)
        if len(data) <= limit:
            return data
        info = os.fstat(f.fileno())
        size = info.st_size if stat.S_ISREG(info.st_mode) else len(data)
    raise PayloadTooLarge(f"{what} {path}", max(size, len(data)), limit)


__all__ = ["read_at_most"]
