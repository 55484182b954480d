"""The processes of a running ``edge-agent run``, read from ``/proc``: a process's
children and descendants, and the supervisor's children by role (each names itself
``ef-<role>``: ``ef-hotpath``, ``ef-standby``, ``ef-companion``). Benches and tests
find what to measure or kill with these."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    """The children of ``pid`` (of every thread of it); none when it is gone."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # the thread ended
                kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``."""
    out: set[int] = set()
    todo = [pid]
    while todo:
        kids = set(children(todo.pop())) - out
        out |= kids
        todo.extend(kids)
    return out


def name(pid: int) -> str:
    """The process's name (``/proc/<pid>/comm``); "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def agent_children(supervisor: int) -> dict[str, int]:
    """The supervisor's children (``python -m agent.child``) by role."""
    found: dict[str, int] = {}
    for kid in children(supervisor):
        try:
            argv = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # it ended
        role = name(kid).removeprefix("ef-")
        if b"agent.child" in argv and role:
            found[role] = kid
    return found


def wait_stopped(pid: int, timeout_s: float = 5.0) -> bool:
    """Wait (bounded) until process ``pid`` is stopped (``T`` in /proc/PID/stat) after a
    SIGSTOP, which the kernel delivers asynchronously; whether it is (False: it ran on, or
    is gone)."""
    deadline = time.monotonic() + timeout_s
    stat = Path(f"/proc/{pid}/stat")
    while time.monotonic() < deadline:
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state in ("T", "t"):
            return True
        time.sleep(0.001)
    return False
