"""Health at a glance (pure): a device row and its newest health report as one level and
one short text, for the fleet overview and the device page.

Levels, worst first: ``bad`` (red: offline, revoked, too hot, disk nearly full), ``warn``
(amber: silent for a while, warm, disk getting full, a deep queue, a camera at 0 fps,
CPU saturated, p99 over the bundle's latency budget), ``ok`` (green), ``unknown`` (grey:
online but no health report yet). The text names the worst finding and how many more
there are, so the colour is never the only signal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fleet_server import timefmt

Level = Literal["ok", "warn", "bad", "unknown"]
LEVELS: tuple[Level, ...] = ("bad", "warn", "unknown", "ok")
"""Worst first."""

SILENT_S = 300.0
"""An online device not heard from for this long is a warning."""
TEMP_WARN_C = 75.0
TEMP_BAD_C = 85.0
DISK_WARN_FRACTION = 0.15
"""Free disk below this share of the data disk is a warning."""
DISK_BAD_FRACTION = 0.05
QUEUE_WARN = 32
"""Requests waiting in one model's queue."""
CPU_WARN_PERCENT = 95.0


@dataclass(frozen=True)
class Glance:
    """A device's health in one word and one line."""

    level: Level
    text: str
    findings: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The level as a word a person reads (``OK``, ``Warning``, ``Problem``, ...)."""
        return {"ok": "OK", "warn": "Warning", "bad": "Problem", "unknown": "No data"}[self.level]


def _num(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def _numbers(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): n for k, v in value.items() if (n := _num(v)) is not None}


def ago(seconds: float) -> str:
    """``42 s``, ``7 min``, ``3 h``, ``2 d`` (``?`` for a value that is not a number)."""
    return timefmt.duration(seconds)


def max_p99(health: Mapping[str, Any] | None) -> float | None:
    """The highest p99 (ms) over the models of a health report."""
    latency = health.get("latency_ms") if health else None
    if not isinstance(latency, Mapping):
        return None
    p99s = [
        p
        for e in latency.values()
        if isinstance(e, Mapping) and (p := _num(e.get("p99"))) is not None
    ]
    return max(p99s, default=None)


def _findings(health: Mapping[str, Any], budget_ms: float | None) -> list[tuple[Level, str]]:
    out: list[tuple[Level, str]] = []
    temps = _numbers(health.get("temperature_c"))
    if temps:
        zone, hottest = max(temps.items(), key=lambda kv: kv[1])
        if hottest >= TEMP_BAD_C:
            out.append(("bad", f"{zone} {hottest:.0f} °C"))
        elif hottest >= TEMP_WARN_C:
            out.append(("warn", f"{zone} {hottest:.0f} °C"))
    free, used = _num(health.get("disk_free_mb")), _num(health.get("disk_used_mb"))
    if free is not None and used is not None and free + used > 0:
        share = free / (free + used)
        if share < DISK_BAD_FRACTION:
            out.append(("bad", f"disk {share:.0%} free"))
        elif share < DISK_WARN_FRACTION:
            out.append(("warn", f"disk {share:.0%} free"))
    p99 = max_p99(health)
    if budget_ms is not None and p99 is not None and p99 > budget_ms:
        out.append(("warn", f"p99 {p99:.1f} ms > budget {budget_ms:g} ms"))
    queues = _numbers(health.get("queue_depth"))
    if queues:
        name, deepest = max(queues.items(), key=lambda kv: kv[1])
        if deepest >= QUEUE_WARN:
            out.append(("warn", f"queue {name} {deepest:.0f}"))
    stalled = sorted(k for k, v in _numbers(health.get("fps")).items() if v <= 0)
    if stalled:
        out.append(("warn", f"camera {stalled[0]} 0 fps"))
    cpu = _num(health.get("cpu_percent"))
    if cpu is not None and cpu >= CPU_WARN_PERCENT:
        out.append(("warn", f"CPU {cpu:.0f} %"))
    return out


def _offline(last_seen: float | None, now: float) -> str:
    if last_seen is None:
        return "never seen"
    if timefmt.as_datetime(last_seen) is None:
        return f"offline, last seen at {timefmt.invalid(last_seen)}"
    return f"offline for {timefmt.ago(last_seen, now)}"


def glance(
    *,
    online: bool,
    last_seen: float | None,
    revoked: bool,
    health: Mapping[str, Any] | None,
    now: float,
    budget_ms: float | None = None,
) -> Glance:
    """The device's health at a glance (see the module docstring); ``budget_ms`` is the
    latency budget of the bundle it runs (None: not checked)."""
    if revoked:
        return Glance("bad", "revoked")
    if not online:
        return Glance("bad", _offline(last_seen, now))
    findings: list[tuple[Level, str]] = []
    if last_seen is not None and timefmt.as_datetime(last_seen) is None:
        findings.append(("warn", f"last seen at {timefmt.invalid(last_seen)}"))
    elif last_seen is not None and now - last_seen > SILENT_S:
        findings.append(("warn", f"silent for {timefmt.ago(last_seen, now)}"))
    if health:
        findings += _findings(health, budget_ms)
    elif not findings:
        return Glance("unknown", "no health report yet")
    if not findings:
        return Glance("ok", "healthy")
    findings.sort(key=lambda f: LEVELS.index(f[0]))
    level, text = findings[0]
    more = len(findings) - 1
    return Glance(level, text + (f" (+{more} more)" if more else ""), tuple(t for _, t in findings))
