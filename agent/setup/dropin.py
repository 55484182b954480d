"""The systemd drop-in that gives ``edgefleet-agent.service`` its firmware profile's
resource settings (``50-profile.conf`` in the unit's ``.d`` directory).

- ``MemoryMax=``: the profile's ``memory_budget_mb`` (models, sessions, slots) plus the
  headroom the rest of the agent needs (supervisor, companion, the standby hot path at
  ~100 MB, capture buffers, the decision-log writer): a quarter of the budget, at least
  :data:`MIN_HEADROOM_MB`. Past it the kernel kills inside the service and systemd
  restarts it, instead of the whole device swapping.
- ``CPUWeight=``: the weight the kernel gives a task of the hot path's niceness
  (``processes.hotpath_nice``; 0 -> 100, systemd's default, -5 -> 305), so that the
  service's share against other services follows the profile.
- ``Nice=``: only when the profile wants a negative hot-path niceness: systemd sets it
  before dropping privileges, so the service needs no CAP_SYS_NICE for it (the companion
  still lowers itself to ``companion_nice``).

``AllowedCPUs=`` is not written: a profile's ``cores`` are where the runtime pins its
workers, and the agent's capture threads and companion run on the cores it leaves free
(jetson-orin keeps 0-1 for them); a cgroup limited to the workers' cores would starve
capture. The runtime's own pinning already places the heavy work.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from agent.kernel.durable import make_dirs, write_durable

if TYPE_CHECKING:
    from runtime.profiles import Profile

UNIT = "edgefleet-agent.service"
DEFAULT_DIR = Path("/etc/systemd/system") / f"{UNIT}.d"
FILE_NAME = "50-profile.conf"
MIN_HEADROOM_MB = 512
RELOAD_TIMEOUT_S = 60.0
_NICE_0_WEIGHT = 1024


def memory_max_mb(profile: Profile) -> int:
    """The service's memory ceiling in MiB: the budget plus headroom."""
    budget = profile.memory_budget_mb
    return budget + max(MIN_HEADROOM_MB, budget // 4)


def cpu_weight(nice: int) -> int:
    """systemd's CPUWeight (1-10000, 100 = a nice-0 task) for a niceness, from the
    kernel's nice-to-weight table (each step is a factor of 1.25)."""
    weight = _NICE_0_WEIGHT / (1.25**nice)
    return max(1, min(10_000, round(weight / _NICE_0_WEIGHT * 100)))


def render(profile: Profile) -> str:
    """The drop-in's text for ``profile``."""
    budget = profile.memory_budget_mb
    nice = profile.processes.hotpath_nice
    lines = [
        f"# Written by `edge-agent setup` from firmware profile {profile.name};",
        "# `edge-agent setup --force` writes it again. See docs/adr/0012-first-start-setup.md.",
        "[Service]",
        f"# memory_budget_mb {budget} + {memory_max_mb(profile) - budget} MiB for the rest "
        "of the agent",
        f"MemoryMax={memory_max_mb(profile)}M",
        f"# the hot path's niceness {nice} as a cgroup weight",
        f"CPUWeight={cpu_weight(nice)}",
    ]
    if nice < 0:
        lines.append(f"Nice={nice}")
    return "\n".join(lines) + "\n"


def write_dropin(profile: Profile, directory: Path = DEFAULT_DIR) -> Path:
    """Write the drop-in (0644, durably) into ``directory``; its path.

    Raises:
        OSError: the directory can't be made or the file written.
    """
    make_dirs(directory, mode=0o755)
    path = directory / FILE_NAME
    write_durable(path, render(profile).encode(), mode=0o644)
    return path


def systemd_running() -> bool:
    """Whether this system was booted with systemd (sd_booted(3))."""
    return Path("/run/systemd/system").is_dir()


def daemon_reload() -> str:
    """Run ``systemctl daemon-reload`` so a changed drop-in is read; what happened, as a
    line ("" when it ran)."""
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        return "systemctl not found: run `systemctl daemon-reload` yourself"
    try:
        done = subprocess.run(
            [systemctl, "daemon-reload"],
            capture_output=True,
            text=True,
            timeout=RELOAD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"systemctl daemon-reload took over {RELOAD_TIMEOUT_S:g} s"
    if done.returncode != 0:
        return f"systemctl daemon-reload failed: {done.stderr.strip()[-200:]}"
    return ""
