"""Preallocated shared memory: one file-backed segment per model, cut into slots.

We map files under ``/dev/shm`` ourselves instead of using
``multiprocessing.shared_memory``: on Python < 3.13 its resource tracker unlinks a
segment when any attaching child exits, which would pull the memory from under a pool
whose worker was just restarted. Segment names carry the owner's pid so a pool can
clean up segments left behind by a process that was killed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.backends.base import Array

_ALIGN = 64
_PREFIX = "edgefleet-"


def shm_dir() -> Path:
    """Where segments live: ``$EDGEFLEET_SHM_DIR``, else /dev/shm, else the temp dir."""
    env = os.environ.get("EDGEFLEET_SHM_DIR")
    if env:
        return Path(env)
    dev = Path("/dev/shm")  # noqa: S108 - the POSIX shared-memory mount, not a temp file
    return dev if dev.is_dir() and os.access(dev, os.W_OK) else Path(tempfile.gettempdir())


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class ArrayField:
    """One array inside a slot: byte offset from the slot start, shape and dtype."""

    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class SlotLayout:
    """How one model's segment is cut: ``n_slots`` equal slots, each holding an optional
    raw-frame area (for preprocessing in the worker), the model inputs and its outputs."""

    n_slots: int
    slot_bytes: int
    frame_bytes: int  # capacity of the raw-frame area; 0 = none
    inputs: tuple[ArrayField, ...]
    outputs: tuple[ArrayField, ...]

    @classmethod
    def build(
        cls,
        n_slots: int,
        frame_bytes: int,
        inputs: list[tuple[tuple[int, ...], str]],
        outputs: list[tuple[tuple[int, ...], str]],
    ) -> SlotLayout:
        offset = _align(frame_bytes)
        fields_in = []
        for shape, dtype in inputs:
            field = ArrayField(offset, shape, dtype)
            fields_in.append(field)
            offset += _align(field.nbytes)
        fields_out = []
        for shape, dtype in outputs:
            field = ArrayField(offset, shape, dtype)
            fields_out.append(field)
            offset += _align(field.nbytes)
        return cls(n_slots, max(offset, _ALIGN), frame_bytes, tuple(fields_in), tuple(fields_out))

    @property
    def total_bytes(self) -> int:
        return self.n_slots * self.slot_bytes


class Segment:
    """A mapped shared-memory file. The creator owns it and unlinks it on :meth:`close`."""

    def __init__(self, path: Path, size: int, *, create: bool) -> None:
        self.path = path
        self.size = size
        self._owner = create
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self._mmap = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.buf = np.frombuffer(self._mmap, dtype=np.uint8)

    @classmethod
    def create(cls, label: str, size: int) -> Segment:
        clean_stale_segments()
        name = f"{_PREFIX}{os.getpid()}-{label}-{secrets.token_hex(4)}"
        return cls(shm_dir() / name, size, create=True)

    @classmethod
    def attach(cls, path: str | Path, size: int) -> Segment:
        return cls(Path(path), size, create=False)

    def array(self, offset: int, shape: tuple[int, ...], dtype: str | np.dtype[Any]) -> Array:
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        view: Array = self.buf[offset : offset + count * dt.itemsize].view(dt).reshape(shape)
        return view

    def close(self) -> None:
        # Views into the map must be gone before it can close; if a caller still holds
        # one, leave the map to the garbage collector rather than fail.
        del self.buf
        with contextlib.suppress(BufferError):
            self._mmap.close()
        if self._owner:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


class SlotViews:
    """Numpy views of every slot of one model's segment (built once per process)."""

    def __init__(self, segment: Segment, layout: SlotLayout) -> None:
        self.layout = layout
        self.frames: list[Array] = []
        self.inputs: list[list[Array]] = []
        self.outputs: list[list[Array]] = []
        for slot in range(layout.n_slots):
            base = slot * layout.slot_bytes
            self.frames.append(segment.buf[base : base + layout.frame_bytes])
            self.inputs.append(
                [segment.array(base + f.offset, f.shape, f.dtype) for f in layout.inputs]
            )
            self.outputs.append(
                [segment.array(base + f.offset, f.shape, f.dtype) for f in layout.outputs]
            )

    def frame(self, slot: int, shape: tuple[int, ...]) -> Array:
        """The slot's raw-frame area viewed as a uint8 array of ``shape``."""
        count = int(np.prod(shape, dtype=np.int64))
        view: Array = self.frames[slot][:count].reshape(shape)
        return view


def clean_stale_segments() -> int:
    """Unlink segments whose owning process is gone. Returns how many were removed."""
    removed = 0
    directory = shm_dir()
    try:
        entries = list(directory.glob(f"{_PREFIX}*"))
    except OSError:
        return 0
    for entry in entries:
        try:
            pid = int(entry.name[len(_PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if pid == os.getpid() or _alive(pid):
            continue
        with contextlib.suppress(OSError):
            entry.unlink()
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
