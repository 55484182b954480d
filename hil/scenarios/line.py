"""Scenario 7 (the line): the PLC link cut for 30 s in the middle of a triggered run.

The PLC is :class:`LinePlc`, a Modbus TCP PLC (:mod:`hil.plc.modbus_plc`) in the
harness's process, listening on the simulated LAN beside the fleet's broker; the device's
agent runs an inspection station on it (:class:`hil.agentconf.StationSettings`: a second
camera fired by the station's software trigger, its own pipeline on the device's bundle)
next to its free-running pipeline. The PLC's program steps the trigger counter with a
new part id five times a second, all along, as a PLC does whether or not its vision
system answers; the cut is the device's cable pulled (:class:`hil.faults.LinkDown`),
which takes the PLC (and the fleet) away from the agent.

Triggers the PLC makes while the link is down are not seen by the station (its first
read after the reconnect is the counter's new baseline); the report says how many
(``unseen_while_cut``). Every trigger the station does see is answered once.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from hil import agentconf
from hil.device import Device
from hil.errors import FaultUnavailable, HilError
from hil.faults import LinkDown
from hil.observe import labelled, metric_samples
from hil.plc.modbus_plc import ModbusPlc
from hil.report import ScenarioReport, verdict
from hil.scenario import RunContext, Scenario, bring_up, pause
from hil.shell import wait_for

FPS = 15.0
CUT_S = 30.0
PACE_S = 0.2
"""The PLC's program: a part every 200 ms."""
RESULT_WAIT_S = 30.0
M = agentconf.STATION_MAP


@dataclass(frozen=True)
class Made:
    """A trigger the PLC made: its number, the part id, when (monotonic)."""

    number: int
    part: str
    t: float


@dataclass(frozen=True)
class Seen:
    """A result as the PLC saw it: when its result_valid write came (monotonic), and the
    sequence number, status and part id written before it."""

    t: float
    seq: int
    status: int
    part: str


def _text(words: list[int]) -> str:
    raw = b"".join(int(w).to_bytes(2, "big") for w in words)
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


class LinePlc(ModbusPlc):
    """The station's PLC (see the module docstring): it makes triggers and records each
    result the station writes."""

    def __init__(self, host: str) -> None:
        super().__init__(size=64, host=host)
        self.lock = threading.Lock()
        self.made: list[Made] = []
        self.seen: list[Seen] = []
        self._seq_words = [0, 0]
        self._status = 0
        self._part = ""

    async def _action(
        self,
        function_code: int,
        start_address: int,
        address: int,
        count: int,
        registers: list[int],
        set_values: list[int] | list[bool] | None,
    ) -> Any:
        if set_values is not None and not self._own_call:
            values = [int(v) for v in set_values]
            if function_code in (5, 15) and address == M["result_valid"] and values[0]:
                with self.lock:
                    seq = (self._seq_words[0] << 16) | self._seq_words[1]
                    self.seen.append(Seen(time.monotonic(), seq, self._status, self._part))
            elif function_code in (6, 16):
                self._registers_written(address, values)
        return await super()._action(
            function_code, start_address, address, count, registers, set_values
        )

    def _registers_written(self, address: int, values: list[int]) -> None:
        for i, value in enumerate(values):
            reg = address + i
            if reg in (M["seq"], M["seq"] + 1):
                self._seq_words[reg - M["seq"]] = value
            elif reg == M["status"]:
                self._status = value
        if address == M["part_echo"]:
            self._part = _text(values)

    def trigger(self, part: str) -> Made:
        """Write ``part``, then step the counter (as the PLC's program would)."""
        raw = part.encode()[: agentconf.PART_REGS * 2].ljust(agentconf.PART_REGS * 2, b"\0")
        self.set("hr", M["part_id"], [int.from_bytes(raw[i : i + 2], "big")
                                      for i in range(0, len(raw), 2)])  # fmt: skip
        with self.lock:
            number = len(self.made) + 1
            made = Made(number, part, time.monotonic())
            self.made.append(made)
        self.set("hr", M["trigger"], [number >> 16, number & 0xFFFF])
        return made

    def results(self) -> list[Seen]:
        with self.lock:
            return list(self.seen)


class Program:
    """The PLC's program: a part every ``pace_s`` on a thread, until stopped."""

    def __init__(self, plc: LinePlc, pace_s: float) -> None:
        self.plc = plc
        self.pace_s = pace_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hil-plc-program", daemon=True)
        self.error = ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop making parts (idempotent; also before :meth:`start`)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(10.0)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.plc.trigger(f"P-{len(self.plc.made) + 1:06d}")
            except Exception as exc:  # noqa: BLE001 - the harness's own PLC: say why it stopped
                self.error = f"{type(exc).__name__}: {exc}"
                return
            next_at += self.pace_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))


def _line(dev: Device) -> dict[str, Any]:
    """The station's and the PLC link's figures from /healthz ({} when it does not
    answer)."""
    line = (dev.healthz() or {}).get("line", {})
    return {
        "station": dict(line.get("stations", {}).get(agentconf.STATION, {})),
        "plc": dict(line.get("plc", {}).get(agentconf.STATION_PLC, {})),
    }


def _alarms(dev: Device) -> dict[str, float]:
    status, body = dev.http("/metrics")
    return labelled(metric_samples(body), "edgefleet_alarms_total", "kind") if status == 200 else {}


def _connected(dev: Device) -> bool:
    return bool(_line(dev)["plc"].get("connected"))


class PlcLinkCut(Scenario):
    """Scenario 7 (see the module docstring)."""

    name = "plc-link-cut"
    title = "PLC link cut for 30 s mid-run"
    invariants = (
        "every trigger accounted for after recovery",
        "decisions logged throughout",
        "plc_down raised once and cleared once",
    )
    in_ci = False  # about 90 s: more than `make hil` may grow by

    def run(self, ctx: RunContext, out: ScenarioReport) -> None:
        dev = ctx.device("hil-plc")
        if dev.kind != "sim":
            raise FaultUnavailable(
                "link-down",
                "the PLC runs in the harness's process on the simulated LAN; on a real "
                "device `link=nft` cuts only the fleet's ports (not tried on one yet)",
            )
        # the cut makes the PLC's replies fail by design: pymodbus logs each with a dump
        # of its last frames, which would bury the run's own lines
        quiet = logging.getLogger("pymodbus")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        plc = LinePlc(ctx.fleet.broker_host)
        plc.start()
        program = Program(plc, PACE_S)
        try:
            self._run(ctx, out, dev, plc, program)
        finally:
            program.stop()
            plc.close()
            quiet.setLevel(level)

    def _run(
        self, ctx: RunContext, out: ScenarioReport, dev: Device, plc: LinePlc, program: Program
    ) -> None:
        station = agentconf.StationSettings(host=plc.host, port=plc.port)
        bring_up(ctx, dev, labels={"hil": self.name}, fps=FPS, station=station)
        wait_for(lambda: _connected(dev), 30, "the station's PLC link", poll_s=0.2)
        program.start()
        pause(ctx, ctx.size.baseline_s, "triggered run")
        alarms_before = _alarms(dev)
        link = LinkDown(dev)
        link.apply()
        t_cut, cut_at = time.time(), time.monotonic()
        pause(ctx, CUT_S, "PLC link cut")
        during = _line(dev)
        alarms_during = _alarms(dev)
        link.clear()
        t_back, back_at = time.time(), time.monotonic()
        out.faults.append(link.record())
        try:
            reconnect_s: float | None = wait_for(
                lambda: _connected(dev), 60, "the PLC link back", poll_s=0.1
            )
        except HilError as exc:
            reconnect_s, out.error = None, str(exc)
        up_at = time.monotonic()
        pause(ctx, ctx.size.baseline_s, "triggered run after the cut")
        program.stop()
        if program.error:
            raise HilError(f"the PLC's program stopped: {program.error}")
        last = plc.trigger("LAST")
        try:
            wait_for(lambda: any(s.part == last.part for s in plc.results()), RESULT_WAIT_S,
                     "the last trigger's result at the PLC", poll_s=0.05)  # fmt: skip
        except HilError as exc:
            out.error = out.error or str(exc)
        try:
            wait_for(lambda: _alarms(dev).get("plc_up", 0) > alarms_before.get("plc_up", 0),
                     30, "plc_up", poll_s=0.5)  # fmt: skip
        except HilError as exc:
            out.error = out.error or str(exc)
        time.sleep(2.0)  # the decision log's last batch
        after = _line(dev)
        alarms_after = _alarms(dev)
        st, link_stats = after["station"], after["plc"]

        # 1. every trigger the station saw answered once; every one after recovery seen
        seen = plc.results()
        made = [m for m in plc.made if m.part != last.part]
        after_up = [m for m in made if m.t > up_at]
        by_part: dict[str, int] = {}
        for s in seen:
            by_part[s.part] = by_part.get(s.part, 0) + 1
        missing = [m.part for m in after_up if by_part.get(m.part, 0) != 1]
        last_seq = next((s.seq for s in seen if s.part == last.part), None)
        balanced = bool(st) and st.get("triggers") == st.get("answered") == (
            st.get("ok", 0) + st.get("deadline_missed", 0) + st.get("overruns", 0)
        )
        ok1 = balanced and not missing and bool(after_up) and last_seq == st.get("triggers")
        figures1 = {
            "plc_triggers": len(made) + 1,
            "station_triggers": st.get("triggers"),
            "answered": st.get("answered"),
            "ok": st.get("ok"),
            "deadline_missed": st.get("deadline_missed"),
            "overruns": st.get("overruns"),
            "unseen_while_cut": len(made) + 1 - int(st.get("triggers", 0)),
            "triggers_after_recovery": len(after_up),
            "answered_once_after_recovery": len(after_up) - len(missing),
            "last_seq_at_plc": last_seq,
            "results_at_plc": len(seen),
            "write_failures": st.get("write_failures"),
            "link_failures": link_stats.get("failures"),
            "reconnect_s": None if reconnect_s is None else round(reconnect_s, 2),
        }
        why1 = ""
        if not balanced:
            why1 = f"the station's counts do not add up: {st}"
        elif missing:
            why1 = f"{len(missing)} triggers after recovery not answered once: {missing[:5]}"
        elif last_seq != st.get("triggers"):
            why1 = f"the last result's seq {last_seq} is not the trigger count"
        out.checks.append(verdict(self.invariants[0], ok1, figures1, why1 or out.error))

        # 2. decisions logged throughout: the free-running pipeline through the cut, and
        # every decided trigger of the station (those in flight at the cut too)
        rows = dev.query(
            dev.path("state", "decisions.db"),
            "SELECT source, station, decision_time FROM decisions",
        )
        free = [r for r in rows if r["station"] == "" and t_cut <= r["decision_time"] < t_back]
        station_rows = [r for r in rows if r["station"] == agentconf.STATION]
        decided = st.get("ok", 0) + st.get("deadline_missed", 0) - st.get("no_frame", 0)
        fps_cut = len(free) / CUT_S
        after_rows = [r for r in station_rows if r["decision_time"] > t_back]
        ok2 = fps_cut >= 0.8 * FPS and len(station_rows) == decided and bool(after_rows)
        out.checks.append(
            verdict(
                self.invariants[1],
                ok2,
                {
                    "free_running_during_cut": len(free),
                    "free_running_fps_during_cut": round(fps_cut, 1),
                    "station_decisions_logged": len(station_rows),
                    "station_decided": decided,
                    "station_decisions_after_recovery": len(after_rows),
                },
                ""
                if ok2
                else "the hot path did not keep deciding, or a station decision is not logged",
            )
        )

        # 3. the alarm: raised once during the cut, cleared once after it
        def delta(now: dict[str, float], kind: str) -> int:
            return int(now.get(kind, 0) - alarms_before.get(kind, 0))

        down_during, up_during = delta(alarms_during, "plc_down"), delta(alarms_during, "plc_up")
        down, up = delta(alarms_after, "plc_down"), delta(alarms_after, "plc_up")
        ok3 = (down_during, up_during, down, up) == (1, 0, 1, 1)
        out.checks.append(
            verdict(
                self.invariants[2],
                ok3,
                {
                    "plc_down": down,
                    "plc_up": up,
                    "plc_down_during_cut": down_during,
                    "plc_up_during_cut": up_during,
                    "connected_during_cut": during["plc"].get("connected"),
                    "cut_s": round(back_at - cut_at, 1),
                },
                "" if ok3 else "plc_down must be raised once in the cut and cleared once after",
            )
        )
