"""Figures the invariants are checked on: pure functions over what was read from the
device (decision log, robot messages, /metrics) and from the fleet's database.

Nothing here talks to a device or the fleet; the scenarios read, these judge.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hil.fleet import HealthSample

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` (0-100) percentile by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def metric_samples(text: str) -> dict[str, float]:
    """Prometheus text format to ``{'name{labels}': value}`` (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                continue
    return out


def labelled(samples: dict[str, float], name: str, label: str) -> dict[str, float]:
    """``{label value: sample}`` of metric ``name`` by one of its labels."""
    pattern = re.compile(rf'^{re.escape(name)}\{{.*\b{re.escape(label)}="([^"]*)"')
    out: dict[str, float] = {}
    for key, value in samples.items():
        m = pattern.match(key)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


@dataclass
class IdComparison:
    """Decision ids on the device against those at the fleet."""

    local: int
    fleet: int
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    duplicated: int = 0

    @property
    def exactly_once(self) -> bool:
        return not self.missing and not self.extra and self.duplicated == 0

    def figures(self) -> dict[str, Any]:
        return {
            "local": self.local,
            "fleet": self.fleet,
            "missing": len(self.missing),
            "extra": len(self.extra),
            "duplicated": self.duplicated,
        }

    def detail(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"missing at the fleet: {', '.join(self.missing[:3])}")
        if self.extra:
            parts.append(f"at the fleet, not in the log: {', '.join(self.extra[:3])}")
        if self.duplicated:
            parts.append(f"{self.duplicated} ids stored more than once")
        return "; ".join(parts)


def compare_ids(local: Iterable[str], fleet: Sequence[str]) -> IdComparison:
    """Every local id at the fleet once, and nothing else."""
    mine = set(local)
    counts = Counter(fleet)
    theirs = set(counts)
    return IdComparison(
        local=len(mine),
        fleet=len(fleet),
        missing=sorted(mine - theirs),
        extra=sorted(theirs - mine),
        duplicated=sum(1 for n in counts.values() if n > 1),
    )


@dataclass
class HealthRun:
    """Health reports of one agent run (sequence numbers count up from 0 at its start)."""

    samples: list[HealthSample]

    @property
    def seqs(self) -> list[int]:
        return [s.seq for s in self.samples]

    def gaps(self) -> list[int]:
        """Sequence numbers missing between 0 and the highest one."""
        have = set(self.seqs)
        return [n for n in range(max(have) + 1) if n not in have] if have else []

    def duplicates(self) -> int:
        """Reports stored more than once (the same seq with another timestamp)."""
        return len(self.seqs) - len(set(self.seqs))


def health_runs(samples: Sequence[HealthSample]) -> list[HealthRun]:
    """Split a device's health reports (oldest first) into agent runs: a run starts at
    sequence number 0."""
    runs: list[HealthRun] = []
    for s in samples:
        if not runs or s.seq == 0:
            runs.append(HealthRun([]))
        runs[-1].samples.append(s)
    return runs


@dataclass
class HealthVerdict:
    """Health reports complete over a window: no gaps, no duplicates, and as many in the
    window as the interval makes."""

    ok: bool
    figures: dict[str, Any]
    detail: str


def judge_health(
    samples: Sequence[HealthSample], window: tuple[float, float], interval_s: float
) -> HealthVerdict:
    """Judge the device's health reports; ``window`` is (start, end) Unix time of the
    fault, and at least 80 % of ``(end - start) / interval_s`` reports must carry a time
    inside it (the rest is timer jitter at the edges)."""
    runs = health_runs(samples)
    gaps = [g for r in runs for g in r.gaps()]
    dups = sum(r.duplicates() for r in runs)
    start, end = window
    inside = sum(1 for s in samples if start <= s.ts <= end)
    expected = int((end - start) / interval_s)
    enough = inside >= math.floor(0.8 * expected)
    ok = bool(samples) and not gaps and dups == 0 and enough
    figures = {
        "stored": len(samples),
        "runs": len(runs),
        "gaps": len(gaps),
        "duplicates": dups,
        "in_window": inside,
        "expected_in_window": expected,
    }
    problems = []
    if gaps:
        problems.append(f"seq gaps {gaps[:5]}")
    if dups:
        problems.append(f"{dups} duplicate seqs")
    if not enough:
        problems.append(f"only {inside} of ~{expected} reports made during the fault arrived")
    return HealthVerdict(ok, figures, "; ".join(problems))


def drop_policy_holds(
    dropped: dict[str, int], pending: dict[str, int], order: Sequence[str]
) -> tuple[bool, str]:
    """Whether drops followed ``order``: a kind was dropped only while no kind before it
    in the order still holds records (those would have had to go first)."""
    for i, kind in enumerate(order):
        if dropped.get(kind, 0) > 0:
            kept = [k for k in order[:i] if pending.get(k, 0) > 0]
            if kept:
                held = ", ".join(f"{pending[k]} {k}" for k in kept)
                return False, f"{kind} records dropped while {held} (earlier in the order) wait"
    return True, ""
