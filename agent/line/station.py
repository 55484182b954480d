"""A station's shell: it reads its trigger through its PLC link, arms its pipeline's
source, enforces the deadline on a thread of its own, and queues the writes of each
answer on the link (the handshake itself is :mod:`agent.line.handshake`, pure).

Threads: the link's thread calls :meth:`Station.on_values` with each read of the inputs;
the pipeline's decider calls :meth:`Station.decided` (through the decision sink) with
each decision of a triggered frame, before the decision is logged, so a late one is
logged marked ``deadline_missed``; the station's own thread wakes at the current
trigger's deadline. None of them waits on the PLC: writes go to the link's bounded queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from agent.line.config import HANDSHAKE_VALUES, StationConfig
from agent.line.drivers.base import Point
from agent.line.errors import LineError
from agent.line.handshake import Answer, Effects, Handshake, Trigger
from agent.line.link import PlcLink
from agent.line.points import parse_point
from agent.line.results import ResultListener, StationResult
from agent.line.source import TriggeredSource
from agent.line.values import ValueMismatch, coerce

log = logging.getLogger(__name__)

MAX_PART_ID = 128
"""The longest part id kept (longer ones are cut; control characters are dropped)."""
_UINT_MASKS = {"bool": 1, "int16": 0xFFFF, "uint16": 0xFFFF, "int32": 0xFFFFFFFF,
               "uint32": 0xFFFFFFFF, "int64": (1 << 64) - 1}  # fmt: skip


def part_id_text(value: Any) -> str:
    """A part id as read from the PLC, as the text stored with the decision: printable,
    at most :data:`MAX_PART_ID` characters, NULs and padding stripped."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).split("\0", 1)[0].strip()
    return "".join(ch for ch in text if ch.isprintable())[:MAX_PART_ID]


def _last_of_runs(writes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``writes`` with each run of consecutive results cut to its last one (handshake-only
    writes, which hold no ``seq``, are kept where they are)."""
    out: list[dict[str, Any]] = []
    for values in writes:
        if out and "seq" in values and "seq" in out[-1]:
            out[-1] = values
        else:
            out.append(values)
    return out


class Station:
    """One ``[[stations]]`` entry, running.

    Args:
        config: the station's settings.
        source: its pipeline's triggered source.
        link: its PLC connection (None: triggered only by the agent's own servers).
        listeners: told of every result (the OPC UA and Modbus servers).
        on_failure: told of each write failure's reason (metrics), on the link's thread.
    """

    def __init__(
        self,
        config: StationConfig,
        source: TriggeredSource,
        link: PlcLink | None,
        *,
        listeners: Sequence[ResultListener] = (),
        on_result: Callable[[StationResult], None] | None = None,
        on_state: Callable[[str, str], None] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.source = source
        self.link = link
        self.listeners = list(listeners)
        self._on_result = on_result
        self._on_state = on_state
        """Told ``(station, OPC 40100 state)`` on each change: Ready, SingleExecution,
        Halted (under the station's lock: it must return at once)."""
        self.state40100 = ""
        """The OPC 40100 state last told ("" before :meth:`start` tells Ready)."""
        self.hs = Handshake(
            config.name,
            fail_safe=config.fail_safe,
            outcome_codes=config.outcome_codes,
            deadline_ns=int(config.deadline_ms * 1e6),
        )
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = False
        self._thread: threading.Thread | None = None
        self.write_failures: dict[str, int] = {}
        self.ignored_triggers = 0
        """Triggers from the agent's servers refused (the station is halted)."""
        self.halted = False
        self._outputs: list[tuple[Point, str, str, float, str | None]] = []
        self._inputs: list[Point] = []
        self._prev_trigger: Any = None
        self._prev_ack: Any = None
        if link is not None:
            self._parse_points(link.driver_key)

    def _parse_points(self, driver: str) -> None:
        c = self.config
        for out in c.outputs:
            self._outputs.append(
                (
                    parse_point(driver, out.point, out.type),
                    out.value,
                    out.type,
                    out.scale,
                    out.outcome,
                )
            )
        # result_valid last: a PLC that sees it set reads a whole result
        self._outputs.sort(key=lambda o: o[1] == "result_valid")
        for cfg in (c.trigger, c.part_id, c.ack):
            if cfg is not None:
                self._inputs.append(parse_point(driver, cfg.point, cfg.type))

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Register the inputs on the link (before the link starts) and start the
        deadline thread."""
        if self.link is not None and self.config.trigger is not None:
            self.link.add_group(
                self._inputs,
                self.config.trigger.poll_ms / 1000.0,
                self.on_values,
                on_lost=self._lost,
            )
        self._thread = threading.Thread(target=self._run, name=f"station-{self.name}", daemon=True)
        self._thread.start()
        with self._wake:
            self._set_state("Ready")

    def stop(self, timeout_s: float = 1.0) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        with self._wake:
            while not self._stop:
                due = self.hs.next_deadline_ns
                now = time.perf_counter_ns()
                if due is None:
                    self._wake.wait(1.0)
                    continue
                if now <= due:
                    self._wake.wait((due - now) / 1e9 + 0.0002)
                    continue
                fx = self.hs.tick(now)
                self._carry_out(fx)

    # -- inputs ----------------------------------------------------------------------
    def on_values(self, values: list[Any], seen_ns: int) -> None:
        """One read of the inputs (trigger, part id, ack, in that order), from the link."""
        c = self.config
        trig_cfg = c.trigger
        if trig_cfg is None:
            return
        ack = values[2 if c.part_id is not None else 1] if c.ack is not None else None
        value = values[0]
        prev, self._prev_trigger = self._prev_trigger, value
        if value == prev and (c.ack is None or ack == self._prev_ack):
            return  # most reads: nothing changed (no lock, no part id decoded)
        part = part_id_text(values[1]) if c.part_id is not None else ""
        with self._wake:
            if c.ack is not None:
                prev_ack, self._prev_ack = self._prev_ack, ack
                if prev_ack is not None and bool(ack) and not bool(prev_ack):
                    self._carry_out(self.hs.release())
            if prev is None:  # the first read after a (re)connect is the baseline
                return
            if trig_cfg.edge == "rising":
                if bool(value) and not bool(prev):
                    self._trigger(part, seen_ns)
                elif not bool(value) and bool(prev) and c.ack is None:
                    self._carry_out(self.hs.release())
                return
            if value != prev:
                mask = _UINT_MASKS.get(trig_cfg.type, 0)
                steps = (int(value) - int(prev)) & mask if mask else 1
                if steps == 0 or steps > mask // 2:  # went back (a PLC restart): one trigger
                    steps = 1
                self._trigger(part, seen_ns, missed=steps - 1)

    def _lost(self) -> None:
        """The link dropped: the next read is a new baseline."""
        self._prev_trigger = None
        self._prev_ack = None

    def trigger(self, part_id: str = "", source: str = "server") -> bool:
        """A trigger from the agent's own servers (OPC UA single job, a Modbus trigger
        coil); False while the station is halted (the server refuses it)."""
        with self._wake:
            if self.halted:
                self.ignored_triggers += 1
                return False
            self._trigger(part_id_text(part_id), time.perf_counter_ns())
        return True

    def command(self, what: str) -> str | None:
        """OPC 40100's Halt, Reset, Stop and Abort: None when done, else why not.

        - halt: triggers are answered at once with the fail-safe result (status error);
          the agent's servers refuse theirs;
        - reset: back to Ready;
        - stop, abort: the part being inspected gets the fail-safe result now.
        """
        with self._wake:
            if what == "halt":
                self.halted = True
                self._set_state("Halted")
            elif what == "reset":
                self.halted = False
                self._set_state("Ready")
            elif what in ("stop", "abort"):
                self._carry_out(self.hs.abort(time.perf_counter_ns()))
            else:
                return f"unknown command {what!r}"
            self._wake.notify_all()
        return None

    def _set_state(self, state: str) -> None:
        if state == self.state40100:
            return
        self.state40100 = state
        if self._on_state is not None:
            try:
                self._on_state(self.name, state)
            except Exception:
                log.exception("station %s: the state callback failed", self.name)

    def _trigger(self, part: str, seen_ns: int, missed: int = 0) -> None:
        if self.halted:
            self._carry_out(self.hs.refuse(part, seen_ns, time.time()))
            return
        fx = self.hs.trigger(part, seen_ns, time.time(), missed)
        self._carry_out(fx)
        if fx.start is not None:
            self.source.arm(fx.start)
        self._wake.notify_all()

    # -- the pipeline's answer ------------------------------------------------------------
    def decided(self, trigger: Trigger, answer: Answer) -> bool:
        """The pipeline decided ``trigger``'s frame; True when it came past the deadline
        (the fail-safe result was written; the decision is logged marked)."""
        with self._wake:
            fx = self.hs.decided(trigger, answer, time.perf_counter_ns())
            self._carry_out(fx)
            self._wake.notify_all()
        return fx.deadline_missed

    # -- outputs ---------------------------------------------------------------------
    def _carry_out(self, fx: Effects) -> None:
        """Queue ``fx``'s writes and tell the listeners (under the station's lock).

        Results that follow one another in one step (a result and the overruns answered
        after it) overwrite the same outputs: only the last is written (its ``seq`` tells
        the PLC how many came), so a burst of overruns costs the PLC one write, not one
        each; every result still goes to the listeners (the OPC UA events, the Modbus
        server's registers) and the counts."""
        for values in _last_of_runs(fx.writes):
            self._write(values)
        for result in fx.results:
            self._tell(result)
        if not self.halted:
            self._set_state("SingleExecution" if self.hs.state == "busy" else "Ready")

    def _write(self, values: dict[str, Any]) -> None:
        link = self.link
        if link is None or not self._outputs:
            return
        handshake_only = set(values) <= HANDSHAKE_VALUES
        batch: list[tuple[Point, Any]] = []
        for point, kind, vtype, scale, outcome in self._outputs:
            if handshake_only and kind not in HANDSHAKE_VALUES:
                continue
            if kind == "outcome_is":
                if "outcome" not in values:
                    continue
                value: Any = values["outcome"] == outcome
            elif kind in values:
                value = values[kind]
            else:
                continue
            if scale != 1.0 and isinstance(value, int | float) and not isinstance(value, bool):
                value = value * scale
            try:
                batch.append((point, coerce(value, vtype)))
            except ValueMismatch as exc:
                self._count_write("type_mismatch", f"{kind} -> {point.address}: {exc}")
        if batch and not link.submit(batch, self._write_done):
            self._count_write("queue_full", "the link's write queue is full")

    def _write_done(self, error: LineError | None) -> None:
        if error is not None:
            self._count_write(error.reason, error.detail)

    def _count_write(self, reason: str, detail: str) -> None:
        self.write_failures[reason] = self.write_failures.get(reason, 0) + 1
        log.warning("station %s: write failed: %s: %s", self.name, reason, detail)

    def _tell(self, result: StationResult) -> None:
        if self._on_result is not None:
            try:
                self._on_result(result)
            except Exception:
                log.exception("station %s: the result callback failed", self.name)
        for listener in self.listeners:
            try:
                listener.on_result(result)
            except Exception:
                log.exception("station %s: a result listener failed", self.name)

    def stats(self) -> dict[str, Any]:
        c = self.hs.counts
        return {
            "state": self.hs.state,
            "halted": self.halted,
            "triggers": c.triggers,
            "answered": c.answered,
            "ok": c.ok,
            "deadline_missed": c.deadline_missed,
            "overruns": c.overruns,
            "overruns_folded": c.overruns_folded,
            "late_decisions": c.late_decisions,
            "ignored_triggers": self.ignored_triggers,
            "write_failures": dict(self.write_failures),
            "plc": self.link.name if self.link is not None else "",
            **self.source.stats(),
        }
