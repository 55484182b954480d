"""Thumbnails: size-capped JPEGs under <state_dir>/thumbnails/YYYY-MM-DD/<id>.jpg.

Encoding and file I/O happen on the writer thread only. A file is written to a temporary
name and renamed, so a killed process leaves no half-written JPEG under its final name;
it is not fsynced (a thumbnail lost in a power cut is not worth an fsync per row).
"""

from __future__ import annotations

import calendar
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent.decisionlog.config import ThumbnailMode

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

log = logging.getLogger(__name__)

DIR = "thumbnails"
_MIN_QUALITY = 25
_QUALITY_STEP = 10
_MAX_HALVINGS = 4
_DAY_S = 86_400


def wanted(mode: ThumbnailMode, outcome: str) -> bool:
    """Whether a decision with ``outcome`` keeps a thumbnail under ``mode``."""
    return mode == "all" or (mode == "non-pass" and outcome != "pass")


class Sampler(Protocol):
    """What :func:`keep` draws from: ``random.Random`` (seeded in tests)."""

    def random(self) -> float: ...


def keep(mode: ThumbnailMode, outcome: str, pass_sample: float, rng: Sampler) -> bool:
    """Whether a decision keeps its thumbnail: :func:`wanted`, or, under 'non-pass', a
    'pass' drawn into the review sample (share ``pass_sample``, drawn from ``rng``)."""
    if wanted(mode, outcome):
        return True
    return mode == "non-pass" and pass_sample > 0.0 and rng.random() < pass_sample


def relpath(decision_id: str, decision_time: float) -> str:
    """The thumbnail's path relative to the state dir (UTC date of the decision)."""
    day = time.strftime("%Y-%m-%d", time.gmtime(decision_time))
    return f"{DIR}/{day}/{decision_id}.jpg"


def encode_jpeg(image: npt.NDArray[np.uint8], max_side: int, max_bytes: int, quality: int) -> bytes:
    """A JPEG of ``image`` (HxWx3 uint8 BGR, or HxW gray) at most ``max_side`` px a side.

    The quality steps down from ``quality`` to 25 until the file is at most
    ``max_bytes``; past that the image is halved (up to four times).

    Raises:
        ValueError: the array is not an 8-bit image, or no JPEG of it fits.
    """
    import cv2  # noqa: PLC0415 - only the writer thread needs OpenCV
    import numpy as np  # noqa: PLC0415

    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        raise ValueError(f"thumbnail must be a uint8 numpy array, not {type(image).__name__}")
    if not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3)):
        raise ValueError(f"thumbnail must be HxWx3 (BGR) or HxW, not shape {image.shape}")
    h, w = image.shape[:2]
    if h == 0 or w == 0:
        raise ValueError(f"thumbnail is empty (shape {image.shape})")
    side = min(max_side, max(h, w))
    for _ in range(_MAX_HALVINGS + 1):
        img: Any = image
        if side < max(h, w):
            scale = side / max(h, w)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            img = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
        q = quality
        while True:
            ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, q])
            if not ok:
                raise ValueError(f"OpenCV could not encode a {image.shape} image as JPEG")
            if len(buf) <= max_bytes:
                return bytes(buf)
            if q <= _MIN_QUALITY:
                break
            q = max(_MIN_QUALITY, q - _QUALITY_STEP)
        side //= 2
        if side < 8:
            break
    raise ValueError(f"no JPEG of the {image.shape} image fits in {max_bytes} bytes")


class ThumbnailStore:
    """The thumbnail files of one log and the bytes they take."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.root = state_dir / DIR
        self.bytes = 0

    def write(self, rel: str, data: bytes) -> None:
        """Write ``data`` at ``rel`` (temp file, then rename)."""
        path = self.state_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        self.bytes += len(data)

    def delete(self, rels: Iterable[str]) -> int:
        """Remove these files (missing ones are fine); returns the bytes freed."""
        freed = 0
        days: set[Path] = set()
        for rel in rels:
            path = self.state_dir / rel
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                log.warning("thumbnail %s of a deleted decision was already gone", path)
                continue
            freed += size
            days.add(path.parent)
        self.bytes = max(0, self.bytes - freed)
        for day in days:
            _remove_if_empty(day)
        return freed

    def scan(self, conn: sqlite3.Connection, table: str) -> int:
        """Count the bytes on disk; delete files no row refers to. Returns files deleted."""
        self.bytes = 0
        if not self.root.is_dir():
            return 0
        removed = 0
        for day in sorted(p for p in self.root.iterdir() if p.is_dir()):
            known = _referenced(conn, table, day.name)
            if known is None:
                log.warning("%s is not a thumbnail day directory; left alone", day)
                continue
            with os.scandir(day) as entries:
                for entry in entries:
                    if not entry.is_file():
                        continue
                    rel = f"{DIR}/{day.name}/{entry.name}"
                    if rel in known:
                        self.bytes += entry.stat().st_size
                    else:
                        os.unlink(entry.path)
                        removed += 1
            _remove_if_empty(day)
        if removed:
            log.warning("deleted %d thumbnail files no decision refers to", removed)
        return removed


def _referenced(conn: sqlite3.Connection, table: str, day: str) -> set[str] | None:
    """Thumbnail paths of the rows decided on UTC date ``day``; None if no date."""
    try:
        start = calendar.timegm(time.strptime(day, "%Y-%m-%d"))
    except ValueError:
        return None
    # One day either side: rows are found by their time, a file by its path.
    rows = conn.execute(
        f"SELECT thumbnail FROM {table} WHERE decision_time >= ? AND decision_time < ? "  # noqa: S608
        "AND thumbnail IS NOT NULL",
        (start - _DAY_S, start + 2 * _DAY_S),
    )
    return {r[0] for r in rows}


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not empty, or already gone: both fine
        directory.rmdir()
