"""The health window after a switch: poll a probe, judge its counters, pass or fail.

A probe is any callable returning a mapping with

- ``worker_crashes``: worker processes lost so far (a counter, never decreasing);
- ``inference_errors``: failed inferences so far (a counter);
- ``p95_ms``: the 95th percentile latency now, in milliseconds;
- ``inferences`` (optional): inferences so far; with none in the window, p95 is not judged.

The window calls it once at its start (the baseline) and then every ``poll_s``; the
counters are judged as increases over the baseline. The agent's probe reads its own
pool's metrics; :class:`agent.installer.checks.PoolProbe` is the default.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

HealthProbe = Callable[[], Mapping[str, float]]
REQUIRED = ("worker_crashes", "inference_errors", "p95_ms")


@dataclass(frozen=True)
class HealthCounters:
    """What a probe reported (or the increase over the baseline)."""

    worker_crashes: float
    inference_errors: float
    p95_ms: float
    inferences: float | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, float]) -> HealthCounters:
        """Raises ValueError (TypeError) naming a missing (non-numeric) counter."""
        missing = [k for k in REQUIRED if k not in raw]
        if missing:
            raise ValueError(f"the probe's answer lacks {', '.join(missing)}")
        values: dict[str, float] = {}
        for key in (*REQUIRED, "inferences"):
            if key not in raw:
                continue
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"the probe's {key} is {value!r}, not a number")
            if math.isnan(value) or value < 0:
                raise ValueError(f"the probe's {key} is {value!r}")
            values[key] = float(value)
        return cls(
            values["worker_crashes"],
            values["inference_errors"],
            values["p95_ms"],
            values.get("inferences"),
        )

    def since(self, baseline: HealthCounters) -> HealthCounters:
        """Counters as increases over ``baseline``; p95 as reported now."""
        inferences = None
        if self.inferences is not None:
            inferences = self.inferences - (baseline.inferences or 0.0)
        return HealthCounters(
            self.worker_crashes - baseline.worker_crashes,
            self.inference_errors - baseline.inference_errors,
            self.p95_ms,
            inferences,
        )

    def as_dict(self) -> dict[str, float | None]:
        return {
            "worker_crashes": self.worker_crashes,
            "inference_errors": self.inference_errors,
            "p95_ms": self.p95_ms,
            "inferences": self.inferences,
        }


@dataclass(frozen=True)
class HealthLimits:
    """What a healthy window may show; p95 is judged against the bundle's budget."""

    budget_ms: float
    max_worker_crashes: int = 0
    max_inference_errors: int = 0


@dataclass(frozen=True)
class HealthVerdict:
    ok: bool
    reason: str
    counters: HealthCounters | None
    polls: int = 0


def judge(counters: HealthCounters, limits: HealthLimits) -> HealthVerdict:
    """Pass, or fail naming every limit the counters exceed."""
    problems = []
    if counters.worker_crashes > limits.max_worker_crashes:
        problems.append(
            f"{counters.worker_crashes:g} worker crash(es) (at most {limits.max_worker_crashes})"
        )
    if counters.inference_errors > limits.max_inference_errors:
        problems.append(
            f"{counters.inference_errors:g} inference error(s) "
            f"(at most {limits.max_inference_errors})"
        )
    judged = counters.inferences is None or counters.inferences > 0
    if judged and counters.p95_ms > limits.budget_ms:
        problems.append(
            f"p95 latency {counters.p95_ms:.3f} ms over the budget of {limits.budget_ms:g} ms"
        )
    return HealthVerdict(not problems, "; ".join(problems), counters)


def _ask(probe: HealthProbe) -> HealthCounters:
    try:
        return HealthCounters.from_mapping(probe())
    except Exception as exc:
        # A probe that fails is an unhealthy window, whatever the exception.
        raise _ProbeFailed(f"the health probe failed: {exc!r}") from exc


class _ProbeFailed(Exception):
    pass


def run_window(
    probe: HealthProbe,
    limits: HealthLimits,
    *,
    window_s: float,
    poll_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> HealthVerdict:
    """Watch ``probe`` for ``window_s``; fail at the first poll over a limit."""
    polls = max(1, math.ceil(window_s / max(poll_s, 1e-3)))
    start = clock()
    try:
        baseline = _ask(probe)
    except _ProbeFailed as exc:
        return HealthVerdict(False, str(exc), None, 0)
    verdict = HealthVerdict(True, "", None, 0)
    for i in range(polls):
        due = start + min(window_s, (i + 1) * poll_s)
        sleep(max(0.0, due - clock()))
        try:
            counters = _ask(probe).since(baseline)
        except _ProbeFailed as exc:
            log.warning("%s", exc)
            return HealthVerdict(False, str(exc), None, i + 1)
        verdict = judge(counters, limits)
        verdict = HealthVerdict(verdict.ok, verdict.reason, counters, i + 1)
        if not verdict.ok:
            log.warning("health window failed after %d poll(s): %s", i + 1, verdict.reason)
            return verdict
    return verdict
