"""The installer's small durable files, per bundle name, and the install lock.

``<state_dir>/bundles/<name>/``:

- ``active.json``: the active-slot pointer (:class:`~agent.installer.machine.Pointer`);
- ``install-state.json``: the journal (:class:`~agent.installer.machine.Journal`);
- ``slot-a.commit.json``, ``slot-b.commit.json``: commit markers;
- ``.lock``: held (``flock``) by the process running an install, rollback or recovery.

Every write is a temp file in the same directory, fsync, ``os.replace``, fsync of the
directory, so a reader sees the old file or the new one, never a torn one. Readers never
raise on a missing or corrupt file: they return ``None`` and say what was wrong.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from agent.installer.machine import Journal, Marker, Pointer
from agent.kernel.durable import fsync_dir

log = logging.getLogger(__name__)

FORMAT = 1
POINTER_FILE = "active.json"
JOURNAL_FILE = "install-state.json"
LOCK_FILE = ".lock"
TEMP_SUFFIX = ".tmp"
_MAX_BYTES = 1 << 20

T = TypeVar("T")


def marker_file(slot: str) -> str:
    return f"slot-{slot}.commit.json"


def write_json(
    path: Path, value: dict[str, Any], *, before_replace: Callable[[], None] | None = None
) -> None:
    """Write ``value`` (with ``"format"``) durably to ``path``.

    ``before_replace`` runs once the temp file is written and synced, just before the
    rename (the point where a power cut leaves only a stray temp file).

    Raises:
        OSError: the file could not be written (the temp file is removed).
    """
    data = (json.dumps({"format": FORMAT, **value}, indent=2) + "\n").encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def read_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)``; ``(None, None)`` when missing; ``(None, problem)`` when the file
    is unreadable, not JSON, not an object or of an unknown format."""
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: cannot read: {exc.strerror or exc}"
    problem = f"{path}: larger than {_MAX_BYTES} bytes" if len(data) > _MAX_BYTES else None
    raw: Any = None
    if problem is None:
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            problem = f"{path}: not valid JSON ({exc})"
    if problem is None and not isinstance(raw, dict):
        problem = f"{path}: not a JSON object"
    elif problem is None and raw.get("format") != FORMAT:
        problem = f"{path}: unknown format {raw.get('format')!r} (this code reads {FORMAT})"
    return (None, problem) if problem is not None else (raw, None)


def _read(path: Path, parse: Callable[[Any], T]) -> tuple[T | None, str | None]:
    raw, problem = read_json(path)
    if raw is None:
        if problem is not None:
            log.warning("%s", problem)
        return None, problem
    try:
        return parse(raw), None
    except (ValueError, KeyError, TypeError) as exc:
        problem = f"{path}: {exc}"
        log.warning("%s", problem)
        return None, problem


def read_pointer(directory: Path) -> tuple[Pointer | None, str | None]:
    return _read(directory / POINTER_FILE, Pointer.from_dict)


def write_pointer(
    directory: Path, pointer: Pointer, *, before_replace: Callable[[], None] | None = None
) -> None:
    write_json(directory / POINTER_FILE, pointer.as_dict(), before_replace=before_replace)


def read_journal(directory: Path) -> tuple[Journal | None, str | None]:
    return _read(directory / JOURNAL_FILE, Journal.from_dict)


def write_journal(directory: Path, journal: Journal) -> None:
    write_json(directory / JOURNAL_FILE, {**journal.as_dict(), "updated_at": time.time()})


def read_marker(directory: Path, slot: str) -> Marker | None:
    return _read(directory / marker_file(slot), Marker.from_dict)[0]


def write_marker(directory: Path, slot: str, marker: Marker) -> None:
    write_json(directory / marker_file(slot), marker.as_dict())


def remove_marker(directory: Path, slot: str) -> None:
    """Remove ``slot``'s commit marker durably (nothing to do when there is none)."""
    path = directory / marker_file(slot)
    if path.exists():
        path.unlink()
        fsync_dir(directory)


def remove_temp_files(directory: Path) -> int:
    """Remove temp files a stopped write left in ``directory``; return how many."""
    removed = 0
    for path in directory.glob(f".*{TEMP_SUFFIX}"):
        if path.is_file():
            path.unlink()
            removed += 1
    if removed:
        log.info("removed %d stray temp file(s) in %s", removed, directory)
        fsync_dir(directory)
    return removed


class NameLock:
    """An exclusive ``flock`` on ``<dir>/.lock``; released by the kernel if the holder dies."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._fd = -1

    def acquire(self, timeout_s: float) -> bool:
        """Try for up to ``timeout_s``; ``False`` when another process (or thread) holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.02)
                continue
            self._fd = fd
            return True

    def release(self) -> None:
        if self._fd != -1:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = -1


def lock_held(directory: Path) -> bool:
    """Whether some process (this one included) holds ``directory``'s install lock now."""
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def locked(directory: Path, timeout_s: float) -> Iterator[bool]:
    """Hold the lock for the block; yields whether it was acquired."""
    lock = NameLock(directory)
    got = lock.acquire(timeout_s)
    try:
        yield got
    finally:
        lock.release()
