"""The health window after a switch: poll a probe, judge its counters, pass or fail.

A probe is any callable returning a mapping of counters *since the switch* (the new
bundle's own: nothing that happened before it took over, and everything after):

- ``worker_crashes``: worker processes lost (never decreasing);
- ``inference_errors``: failed inferences;
- ``p95_ms``: the 95th percentile latency now, in milliseconds;
- ``inferences`` (optional): inferences completed; with none, p95 is not judged;
- ``frames`` (optional): inputs the bundle's sources delivered (camera frames, sensor
  windows; a probe that runs the sample itself counts its runs);
- ``pipelines_without_inference`` (optional): pipelines of the bundle whose source
  delivered inputs while they completed no inference.

The window's first call is the switch (the agent's probe loads its pipelines with the
new bundle there, :class:`agent.directives.service.AgentProbe`); its counters are judged
like every later poll's, so a failure between the switch and the first poll counts.
Crashes, errors and latency fail the window at the first poll over a limit. At its end,
a bundle that decided nothing though its sources delivered inputs fails too: it gets
``grace_s`` more (the longest wait for one inference) for a first one to complete. A
window whose sources delivered nothing at all (an idle line) passes, marked ``idle``:
the bundle was judged by its self-benchmark alone (docs/adr/0019-health-window-idle-line.md).
The default probe is :class:`agent.installer.checks.PoolProbe`.
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
OPTIONAL = ("inferences", "frames", "pipelines_without_inference")


@dataclass(frozen=True)
class HealthCounters:
    """What a probe reported: counters since the switch, p95 now."""

    worker_crashes: float
    inference_errors: float
    p95_ms: float
    inferences: float | None = None
    frames: float | None = None
    pipelines_without_inference: float | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, float]) -> HealthCounters:
        """Raises ValueError (TypeError) naming a missing (non-numeric) counter."""
        missing = [k for k in REQUIRED if k not in raw]
        if missing:
            raise ValueError(f"the probe's answer lacks {', '.join(missing)}")
        values: dict[str, float] = {}
        for key in (*REQUIRED, *OPTIONAL):
            if key not in raw:
                continue
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"the probe's {key} is {value!r}, not a number")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"the probe's {key} is {value!r}")
            values[key] = float(value)
        return cls(
            values["worker_crashes"],
            values["inference_errors"],
            values["p95_ms"],
            values.get("inferences"),
            values.get("frames"),
            values.get("pipelines_without_inference"),
        )

    @property
    def undecided(self) -> bool:
        """Inputs came and no inference completed (in some pipeline, when the probe
        says per pipeline)."""
        if self.pipelines_without_inference is not None:
            return self.pipelines_without_inference > 0
        return bool(self.frames) and self.inferences == 0

    @property
    def idle(self) -> bool:
        """The bundle's sources delivered nothing since the switch."""
        return self.frames == 0

    def as_dict(self) -> dict[str, float | None]:
        return {
            "worker_crashes": self.worker_crashes,
            "inference_errors": self.inference_errors,
            "p95_ms": self.p95_ms,
            "inferences": self.inferences,
            "frames": self.frames,
            "pipelines_without_inference": self.pipelines_without_inference,
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
    idle: bool = False
    """Passed on an idle line: no input reached the bundle during the window."""


def judge(counters: HealthCounters, limits: HealthLimits) -> HealthVerdict:
    """Pass, or fail naming every limit the counters exceed (at any poll)."""
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


def judge_end(counters: HealthCounters, limits: HealthLimits) -> HealthVerdict:
    """The verdict of the whole window: :func:`judge`, and a bundle that decided nothing
    though its sources delivered inputs fails; an idle window passes, marked so."""
    verdict = judge(counters, limits)
    if not verdict.ok:
        return verdict
    if counters.undecided:
        frames = f"{counters.frames:g} input(s)" if counters.frames is not None else "inputs"
        where = ""
        if counters.pipelines_without_inference:
            where = f" in {counters.pipelines_without_inference:g} pipeline(s)"
        reason = (
            f"no inference completed since the switch{where} while the sources delivered "
            f"{frames} ({counters.inferences or 0:g} inference(s) in all)"
        )
        return HealthVerdict(False, reason, counters)
    if counters.idle:
        reason = "idle line: no input reached the bundle during the window"
        return HealthVerdict(True, reason, counters, idle=True)
    return verdict


def _ask(probe: HealthProbe) -> HealthCounters:
    try:
        return HealthCounters.from_mapping(probe())
    except Exception as exc:
        # A probe that fails is an unhealthy window, whatever the exception.
        raise _ProbeFailed(f"the health probe failed: {exc!r}") from exc


class _ProbeFailed(Exception):
    pass


def _poll(probe: HealthProbe, limits: HealthLimits, n: int) -> HealthVerdict:
    """One reading, judged (crashes, errors, latency); a failing probe fails."""
    try:
        counters = _ask(probe)
    except _ProbeFailed as exc:
        return HealthVerdict(False, str(exc), None, n)
    verdict = judge(counters, limits)
    return HealthVerdict(verdict.ok, verdict.reason, counters, n)


def run_window(
    probe: HealthProbe,
    limits: HealthLimits,
    *,
    window_s: float,
    poll_s: float,
    grace_s: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> HealthVerdict:
    """Switch (the probe's first call), then watch ``probe`` for ``window_s``: fail at the
    first poll over a limit, and at the end when the bundle decided nothing though inputs
    came (after up to ``grace_s`` more for a first inference)."""
    poll_s = max(poll_s, 1e-3)
    polls = max(1, math.ceil(window_s / poll_s))
    most = polls + math.ceil(max(0.0, grace_s) / poll_s)  # bounded, whatever the clock does
    verdict = _poll(probe, limits, 0)
    start = clock()  # the window runs from the switch done
    grace_end = start + max(window_s, 0.0) + max(0.0, grace_s)
    n = 0
    while verdict.ok and verdict.counters is not None and n < most:
        if n < polls:
            due = start + min(window_s, (n + 1) * poll_s)
        elif verdict.counters.undecided and clock() < grace_end:
            due = min(clock() + poll_s, grace_end)
        else:
            break
        sleep(max(0.0, due - clock()))
        n += 1
        verdict = _poll(probe, limits, n)
    if verdict.ok and verdict.counters is not None:
        end = judge_end(verdict.counters, limits)
        verdict = HealthVerdict(end.ok, end.reason, verdict.counters, n, end.idle)
    if not verdict.ok:
        log.warning("health window failed after %d poll(s): %s", n, verdict.reason)
    elif verdict.idle:
        log.warning("health window: %s; judged by the self-benchmark alone", verdict.reason)
    return verdict
