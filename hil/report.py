"""The run's report: JSON for machines, and a summary table for people.

Each scenario has checks, one per invariant, each ``pass``, ``fail``, ``error`` (the
scenario broke before it could judge) or ``unavailable`` (a fault injector can't work
here, with the reason). A run passes when every check passes.
"""

from __future__ import annotations

import json
import os
import platform
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PASS, FAIL, ERROR, UNAVAILABLE = "pass", "fail", "error", "unavailable"
RESULTS = (PASS, FAIL, ERROR, UNAVAILABLE)
FORMAT = 1


@dataclass
class Check:
    """One invariant's verdict, with the figures it was judged on."""

    invariant: str
    result: str
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""

    def __post_init__(self) -> None:
        if self.result not in RESULTS:
            raise ValueError(f"result {self.result!r} is not one of {', '.join(RESULTS)}")


def verdict(invariant: str, ok: bool, figures: dict[str, Any], detail: str = "") -> Check:
    """A pass or a fail."""
    return Check(invariant, PASS if ok else FAIL, figures, detail)


@dataclass
class ScenarioReport:
    """One scenario's run."""

    name: str
    title: str
    device: str
    size: str
    checks: list[Check] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    wall_s: float = 0.0
    logs: str = ""

    @property
    def result(self) -> str:
        if self.error and not any(c.result == FAIL for c in self.checks):
            return ERROR
        results = {c.result for c in self.checks}
        for worst in (FAIL, ERROR, UNAVAILABLE):
            if worst in results:
                return worst
        return PASS if self.checks else ERROR


@dataclass
class Report:
    """A whole ``hil run``."""

    scenarios: list[ScenarioReport] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    wall_s: float = 0.0
    machine: dict[str, Any] = field(
        default_factory=lambda: {
            "host": platform.node(),
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
        }
    )

    @property
    def passed(self) -> bool:
        return bool(self.scenarios) and all(s.result == PASS for s in self.scenarios)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["format"] = FORMAT
        out["passed"] = self.passed
        for s, raw in zip(self.scenarios, out["scenarios"], strict=True):
            raw["result"] = s.result
        return out

    def write(self, path: Path) -> None:
        """Write the JSON report (temp file, then rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.as_dict(), indent=2, default=str) + "\n")
        tmp.replace(path)


def _figures_text(figures: dict[str, Any]) -> str:
    parts = []
    for key, value in figures.items():
        shown = value
        if isinstance(value, float):
            shown = f"{value:g}"
        elif isinstance(value, dict):
            shown = "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
        parts.append(f"{key}={shown}")
    return ", ".join(parts)


def render_table(report: Report, width: int = 120) -> str:
    """The summary: one row per check (scenario, invariant, result, figures), then the
    faults applied and the errors, then the overall verdict."""
    cols = (18, 46, 11)
    fig_w = max(30, width - sum(cols) - 3)
    head = f"{'scenario':<{cols[0]}}{'invariant':<{cols[1]}}{'result':<{cols[2]}}figures"
    lines = [head, "-" * min(width, len(head) + fig_w)]
    for s in report.scenarios:
        rows = s.checks or [Check("(scenario did not run its checks)", ERROR)]
        for i, c in enumerate(rows):
            inv = textwrap.wrap(c.invariant, cols[1] - 2) or [""]
            figs = textwrap.wrap(_figures_text(c.figures), fig_w) or [""]
            if c.detail:
                figs += textwrap.wrap(f"-> {c.detail}", fig_w)
            for j in range(max(len(inv), len(figs))):
                name = s.name if i == 0 and j == 0 else ""
                res = c.result.upper() if j == 0 else ""
                left = inv[j] if j < len(inv) else ""
                right = figs[j] if j < len(figs) else ""
                lines.append(f"{name:<{cols[0]}}{left:<{cols[1]}}{res:<{cols[2]}}{right}")
        pad = " " * cols[0]
        notes = textwrap.wrap(_figures_text(s.figures), width - cols[0]) if s.figures else []
        for f in s.faults:
            notes += textwrap.wrap(f"fault: {_figures_text(f)}", width - cols[0])
        notes += textwrap.wrap(f"error: {s.error}", width - cols[0]) if s.error else []
        lines.extend(pad + text for text in notes)
    lines.append("-" * min(width, len(head) + fig_w))
    counts = {r: sum(1 for s in report.scenarios if s.result == r) for r in RESULTS}
    summary = ", ".join(f"{n} {r}" for r, n in counts.items() if n)
    verdict_text = "PASSED" if report.passed else "FAILED"
    lines.append(f"{verdict_text}: {len(report.scenarios)} scenario(s), {summary}; "
                 f"{report.wall_s:.0f} s")  # fmt: skip
    return "\n".join(lines)
