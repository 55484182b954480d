"""The processes of a running ``edge-agent run``, read from ``/proc``: a process's
children and descendants, and the supervisor's children by role (each names itself
``ef-<role>``: ``ef-hotpath``, ``ef-standby``, ``ef-companion``). Benches and tests
find what to measure or kill with these."""

from __future__ import annotations

import contextlib
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
