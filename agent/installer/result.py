"""What the installer hands back: results, reports, and its named checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.installer.checks import BenchResult
from agent.installer.machine import BundleId

CHECKPOINTS = (
    # Named points of an install, in order, passed to the ``checkpoint`` callback.
    "stage",  # journal says "stage"; nothing copied yet
    "stage-write",  # a model file half copied (temp file not yet renamed)
    "load",
    "benchmark",
    "switch",  # journal says "switch"; pointer not yet written
    "switch-write",  # new pointer in its temp file, not yet renamed
    "health",  # pointer on the new slot, health window about to start
    "commit",  # health passed; commit pointer not yet written
    "commit-write",
    "commit-marker",  # commit pointer renamed; marker not yet written
    "done",
    "rollback",  # a step failed (or a rollback by hand); pointer not yet restored
    "rollback-write",
)
Report = dict[str, Any]
"""A report handed to ``on_report``: name, status, step, reason, source, slot, target,
active (the bundle running now), at (unix time), and per outcome extra keys."""


@dataclass(frozen=True)
class InstallResult:
    """What an install (or rollback) ended with: "committed", "noop" or "rolled-back"."""

    outcome: str
    bundle: BundleId
    slot: str
    path: Path
    benchmark: BenchResult | None = None
    health: dict[str, float | None] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            **self.bundle.as_dict(),
            "slot": self.slot,
            "path": str(self.path),
            "benchmark": vars(self.benchmark) if self.benchmark else None,
            "health": self.health,
        }
