"""What the device's health report says of the machine: CPU use, resident memory,
temperatures and disk, read from ``/proc``, ``/sys/class/thermal`` and the file system.

A figure that can't be read (no ``/proc``, a thermal zone that refuses) is left out of
the report, never guessed; each reader takes its root directory as an argument.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROC = Path("/proc")
THERMAL = Path("/sys/class/thermal")
_MB = 1024 * 1024
_MAX_ZONES = 64
STATE_SIZE_EVERY_S = 300.0
"""How often the state directory's size is measured (a walk of its files)."""
MAX_STATE_ENTRIES = 500_000
"""A walk of the state directory stops (no figure) past this many entries."""


def rss_kb(status_file: Path) -> int | None:
    """``VmRSS`` of a ``/proc/<pid>/status`` file in kB, or None when unreadable."""
    try:
        text = status_file.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
    return None


def process_cpu_s(stat_file: Path) -> float | None:
    """User + system CPU seconds of a ``/proc/<pid>/stat`` file, or None."""
    try:
        text = stat_file.read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) "
    if len(fields) < 13:
        return None
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    except ValueError:
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def system_cpu_ticks(stat_file: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores from ``/proc/stat``, or None."""
    try:
        with stat_file.open() as f:
            first = f.readline()
    except OSError:
        return None
    parts = first.split()
    if not parts or parts[0] != "cpu":
        return None
    try:
        values = [int(v) for v in parts[1:]]
    except ValueError:
        return None
    idle = sum(values[3:5])  # idle, iowait
    total = sum(values[:8])  # guest time is already counted in user and nice
    return total - idle, total


def temperatures(thermal_root: Path) -> dict[str, float]:
    """°C per thermal zone (named by its ``type``), for the zones that can be read."""
    found: dict[str, float] = {}
    try:
        zones = sorted(thermal_root.glob("thermal_zone*"))[:_MAX_ZONES]
    except OSError:
        return found
    for zone in zones:
        try:
            milli = int((zone / "temp").read_text().strip())
        except (OSError, ValueError):
            continue  # many zones refuse reads (sensor off, no permission)
        try:
            name = (zone / "type").read_text().strip() or zone.name
        except OSError:
            name = zone.name
        if name in found:
            name = f"{name}-{zone.name}"
        found[name] = milli / 1000.0
    return found


def disk_mb(path: Path) -> tuple[float, float] | None:
    """(free, used) MB of the file system holding ``path`` (or its nearest parent)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError:
        return None
    return usage.free / _MB, usage.used / _MB


def tree_mb(root: Path, max_entries: int = MAX_STATE_ENTRIES) -> float | None:
    """MiB the regular files under ``root`` take (their sizes; links not followed), or
    None when ``root`` can't be read or holds more than ``max_entries`` entries."""
    total = 0
    seen = 0
    stack = [Path(root)]
    try:
        while stack:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    seen += 1
                    if seen > max_entries:
                        return None
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        try:
                            total += entry.stat(follow_symlinks=False).st_size
                        except FileNotFoundError:
                            continue  # deleted during the walk (retention, a swap of slots)
    except OSError as exc:
        log.debug("sysinfo: size of %s: %s", root, exc)
        return None
    return total / _MB


@dataclass
class SysInfo:
    """Samples the machine for health reports; CPU use is measured between samples.

    Args:
        state_dir: whose file system's free and used space is reported, and whose own
            size is measured every ``state_every_s``.
        pids: the agent's worker processes, whose CPU and memory are added to its own.
        budget_mb: the agent's disk budget (reported beside the state directory's size).
        proc_root, thermal_root: where ``/proc`` and ``/sys/class/thermal`` are.
    """

    state_dir: Path
    pids: Callable[[], Iterable[int]] | None = None
    proc_root: Path = PROC
    thermal_root: Path = THERMAL
    budget_mb: float | None = None
    state_every_s: float = STATE_SIZE_EVERY_S
    _state: tuple[float, float | None] | None = field(default=None, init=False, repr=False)
    _last: tuple[float, float | None, tuple[int, int] | None] | None = field(
        default=None, init=False, repr=False
    )

    def __post_init__(self) -> None:
        self._last = self._cpu_now()

    def _worker_pids(self) -> list[int]:
        if self.pids is None:
            return []
        try:
            return [int(p) for p in self.pids()]
        except Exception:
            log.exception("sysinfo: the worker pid source failed")
            return []

    def _cpu_now(self) -> tuple[float, float | None, tuple[int, int] | None]:
        times = os.times()
        cpu: float | None = times.user + times.system
        for pid in self._worker_pids():
            worker = process_cpu_s(self.proc_root / str(pid) / "stat")
            if worker is not None and cpu is not None:
                cpu += worker
        return time.monotonic(), cpu, system_cpu_ticks(self.proc_root / "stat")

    def cpu(self) -> dict[str, float]:
        """``cpu_percent`` (agent and workers, % of one core) and ``system_cpu_percent``
        (all cores, 0-100) since the last call."""
        now = self._cpu_now()
        last, self._last = self._last, now
        out: dict[str, float] = {}
        if last is None:
            return out
        wall = now[0] - last[0]
        if wall > 0 and now[1] is not None and last[1] is not None:
            out["cpu_percent"] = max(0.0, (now[1] - last[1]) / wall * 100.0)
        if now[2] is not None and last[2] is not None:
            busy, total = now[2][0] - last[2][0], now[2][1] - last[2][1]
            if total > 0:
                out["system_cpu_percent"] = min(100.0, max(0.0, busy / total * 100.0))
        return out

    def memory_mb(self) -> float | None:
        """Resident memory of the agent and its workers, MB (None without ``/proc``)."""
        own = rss_kb(self.proc_root / "self" / "status")
        if own is None:
            return None
        workers = [rss_kb(self.proc_root / str(p) / "status") for p in self._worker_pids()]
        return (own + sum(w for w in workers if w is not None)) / 1024.0

    def sample(self) -> dict[str, Any]:
        """The machine's part of a :class:`agent.wire.messages.Health` report."""
        out: dict[str, Any] = dict(self.cpu())
        memory = self.memory_mb()
        if memory is not None:
            out["memory_mb"] = memory
        out["temperature_c"] = temperatures(self.thermal_root)
        disk = disk_mb(self.state_dir)
        if disk is not None:
            out["disk_free_mb"], out["disk_used_mb"] = disk
        if self.budget_mb is not None:
            out["disk_budget_mb"] = self.budget_mb
        state = self.state_dir_mb()
        if state is not None:
            out["state_dir_mb"] = state
        return out

    def state_dir_mb(self) -> float | None:
        """The state directory's size, measured at most every ``state_every_s``."""
        now = time.monotonic()
        if self._state is None or now - self._state[0] >= self.state_every_s:
            self._state = (now, tree_mb(self.state_dir))
        return self._state[1]
