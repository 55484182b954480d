"""A station's handshake with its PLC, as a pure state machine (no clock, no I/O: the
shell in :mod:`agent.line.station` feeds it times and carries out what it returns).

::

    PLC      trigger ──┐                       ┌── ack (or trigger falls)
                       ▼                       ▼
    station  idle ──► busy ──(decision / deadline)──► valid ──► idle
                       │  writes busy=1,                │ writes the result, busy=0,
                       │  result_valid=0                │ result_valid=1 (last)
                       └─ a trigger while busy: overrun, answered right after the
                          current result with the fail-safe outcome, in trigger order

Every trigger gets exactly one answer: the decision's result when it comes before the
deadline (``ok``), else the fail-safe result (``deadline_missed``); a trigger while busy
is an ``overrun`` answered with the fail-safe result right after the current one. A
decision that comes after its deadline is not written (the fail-safe one was) and is
logged marked ``deadline_missed``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from agent.line.results import StationResult

MAX_BACKLOG = 256
"""Overruns waiting for the current result at most; more are answered at once in one
result that counts them (``overruns_folded``)."""


@dataclass
class Trigger:
    """One trigger as the station saw it."""

    station: str
    seq: int
    t_ns: int
    """``time.perf_counter_ns()`` when the trigger was seen."""
    wall_time: float
    part_id: str
    deadline_ns: int
    answered: bool = False


@dataclass(frozen=True)
class Answer:
    """What the decision said (``None`` fields for a fail-safe answer)."""

    outcome: str
    score: float = 0.0
    label: str = ""
    decision_id: str = ""
    model_name: str = ""
    model_version: str = ""


@dataclass
class Effects:
    """What the shell must do, in order: write ``writes`` (each a batch of value kind ->
    value, result_valid last), hand ``start`` to the source, tell listeners of ``results``."""

    writes: list[dict[str, Any]] = field(default_factory=list)
    results: list[StationResult] = field(default_factory=list)
    start: Trigger | None = None
    deadline_missed: bool = False


@dataclass
class HandshakeCounts:
    triggers: int = 0
    answered: int = 0
    ok: int = 0
    deadline_missed: int = 0
    overruns: int = 0
    late_decisions: int = 0
    overruns_folded: int = 0


class Handshake:
    """One station's handshake state."""

    def __init__(
        self, station: str, *, fail_safe: str, outcome_codes: dict[str, int], deadline_ns: int
    ) -> None:
        self.station = station
        self.fail_safe = fail_safe
        self.codes = dict(outcome_codes)
        self.deadline_ns = deadline_ns
        self.state = "idle"
        self.current: Trigger | None = None
        self.backlog: collections.deque[Trigger] = collections.deque()
        self.trigger_seq = 0
        self.result_seq = 0
        self.counts = HandshakeCounts()

    def trigger(self, part_id: str, t_ns: int, wall_time: float, missed: int = 0) -> Effects:
        """A trigger seen at ``t_ns``; ``missed`` triggers before it were never seen (a
        counter that stepped by more than one): they are overruns."""
        fx = Effects()
        missed = max(0, missed)
        for _ in range(min(missed, MAX_BACKLOG)):
            self._overrun(self._new(t_ns, wall_time, ""), fx)
        if missed > MAX_BACKLOG:  # a counter that jumped far: counted, answered as one jump
            self._fold(missed - MAX_BACKLOG)
        trig = self._new(t_ns, wall_time, part_id)
        if self.state == "busy":
            self._overrun(trig, fx)
            return fx
        self.state = "busy"
        self.current = trig
        fx.writes.append({"busy": True, "result_valid": False})
        fx.start = trig
        return fx

    def decided(self, trig: Trigger, answer: Answer, now_ns: int) -> Effects:
        """The pipeline decided ``trig``'s frame at ``now_ns``."""
        fx = Effects()
        if trig is not self.current or trig.answered or now_ns > trig.deadline_ns:
            self.counts.late_decisions += 1
            fx.deadline_missed = True
            if trig is self.current and not trig.answered:  # past the deadline, not yet ticked
                self._answer(trig, "deadline_missed", Answer(self.fail_safe), now_ns, fx)
                self._finish(now_ns, fx)
            return fx
        self._answer(trig, "ok", answer, now_ns, fx)
        self._finish(now_ns, fx)
        return fx

    def tick(self, now_ns: int) -> Effects:
        """Time passed: a trigger past its deadline gets the fail-safe result."""
        fx = Effects()
        trig = self.current
        if self.state == "busy" and trig is not None and now_ns > trig.deadline_ns:
            self._answer(trig, "deadline_missed", Answer(self.fail_safe), now_ns, fx)
            self._finish(now_ns, fx)
        return fx

    def refuse(self, part_id: str, t_ns: int, wall_time: float) -> Effects:
        """A trigger the station can't take (it is halted): answered at once with the
        fail-safe result, status ``error`` (after the current one, in order, if busy)."""
        fx = Effects()
        trig = self._new(t_ns, wall_time, part_id)
        if self.state == "busy":
            self._overrun(trig, fx)
            return fx
        self._answer(trig, "error", Answer(self.fail_safe), t_ns, fx)
        self.state = "valid"
        return fx

    def abort(self, now_ns: int) -> Effects:
        """Give up the current trigger now: the fail-safe result, status ``error`` (its
        decision, when it comes, is logged marked deadline_missed)."""
        fx = Effects()
        trig = self.current
        if self.state == "busy" and trig is not None:
            self._answer(trig, "error", Answer(self.fail_safe), now_ns, fx)
            self._finish(now_ns, fx)
        return fx

    def release(self) -> Effects:
        """The PLC acknowledged (ack rose, or the trigger fell): result_valid goes back."""
        fx = Effects()
        if self.state == "valid":
            self.state = "idle"
            fx.writes.append({"result_valid": False})
        return fx

    @property
    def next_deadline_ns(self) -> int | None:
        trig = self.current
        return trig.deadline_ns if self.state == "busy" and trig is not None else None

    # -- inside ----------------------------------------------------------------------
    def _new(self, t_ns: int, wall_time: float, part_id: str) -> Trigger:
        self.trigger_seq += 1
        self.counts.triggers += 1
        return Trigger(
            self.station, self.trigger_seq, t_ns, wall_time, part_id, t_ns + self.deadline_ns
        )

    def _fold(self, n: int) -> None:
        """``n`` triggers never seen, past the backlog's bound: counted as overruns
        answered at once (their sequence numbers are skipped: the next result's tells the
        PLC how many), without a result each (a counter that jumps by millions must not
        make millions of results)."""
        self.trigger_seq += n
        self.result_seq += n
        self.counts.triggers += n
        self.counts.answered += n
        self.counts.overruns += n
        self.counts.overruns_folded += n

    def _overrun(self, trig: Trigger, fx: Effects) -> None:
        self.counts.overruns += 1
        if self.state != "busy":  # a missed counter step while idle: answer it at once
            self._answer(trig, "overrun", Answer(self.fail_safe), trig.t_ns, fx)
            self.state = "valid"
            return
        if len(self.backlog) >= MAX_BACKLOG:
            self.counts.overruns_folded += 1
            self._answer(trig, "overrun", Answer(self.fail_safe), trig.t_ns, fx, write=False)
            return
        self.backlog.append(trig)

    def _finish(self, now_ns: int, fx: Effects) -> None:
        while self.backlog:
            self._answer(self.backlog.popleft(), "overrun", Answer(self.fail_safe), now_ns, fx)
        self.current = None
        self.state = "valid"

    def _answer(
        self,
        trig: Trigger,
        status: str,
        ans: Answer,
        now_ns: int,
        fx: Effects,
        *,
        write: bool = True,
    ) -> None:
        trig.answered = True
        self.result_seq += 1
        self.counts.answered += 1
        if status == "ok":
            self.counts.ok += 1
        elif status == "deadline_missed":
            self.counts.deadline_missed += 1
        ms = max(0.0, (now_ns - trig.t_ns) / 1e6)
        result = StationResult(
            station=self.station,
            seq=self.result_seq,
            trigger_seq=trig.seq,
            status=status,
            outcome=ans.outcome,
            outcome_code=self.codes.get(ans.outcome, 0),
            score=ans.score,
            label=ans.label,
            part_id=trig.part_id,
            decision_id=ans.decision_id,
            model_name=ans.model_name,
            model_version=ans.model_version,
            trigger_to_result_ms=round(ms, 3),
            wall_time=trig.wall_time + ms / 1000.0,
        )
        fx.results.append(result)
        if write:
            fx.writes.append(result_values(result))


def result_values(r: StationResult) -> dict[str, Any]:
    """A result as the station's output values (value kind -> value)."""
    return {
        "outcome_code": r.outcome_code,
        "outcome": r.outcome,
        "status": r.status_code,
        "score": r.score,
        "label": r.label,
        "part_id": r.part_id,
        "decision_id": r.decision_id,
        "seq": r.seq,
        "trigger_to_result_ms": r.trigger_to_result_ms,
        "model_version": r.model_version,
        "busy": False,
        "result_valid": True,
    }
