"""Stations under faults, end to end: a real simulated PLC on loopback (pymodbus's server,
:mod:`hil.plc.modbus_plc`; asyncua's, :mod:`hil.plc.opcua_plc`, where the fault is OPC UA's),
an in-process agent with a software-triggered synthetic camera deciding on the tiny TFLite
model, and a station triggered by a uint32 counter the PLC steps (``edge = "change"``).

Each test puts one fault on the PLC in the middle of a triggered run and checks what the
issue asks of the line: every trigger answered exactly once (the decision's result, the
fail-safe, or an overrun), each failure counted by its reason word on the link, the
station and ``edgefleet_line_failures_total``, the decisions logged whatever the PLC
did, and the station answering again once the PLC is back.

Where a fault must land while a decision is in flight (the PLC stops or stalls between
the decision and its result's write), the test stops or stalls the real PLC from the
decision sink's hand-over to the station (:class:`InFlight`): the decision is made, its
result not yet queued. The fault itself is the real one.
"""

from __future__ import annotations

import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pymodbus.constants import ExcCodes

from agent.app import Agent
from agent.config import parse_config
from agent.kernel.bundle import init_bundle
from agent.line.results import STATUS_CODES
from agent.pipeline.runner import Decision
from hil.observe import metric_samples
from hil.plc.modbus_plc import ModbusPlc
from hil.plc.opcua_plc import OpcUaPlc

REPO = Path(__file__).resolve().parents[3]
TINY_TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"
WAIT_S = 20.0
TIMEOUT_MS = 300.0
"""Each link's call timeout: short, so that a stalled PLC is found out fast."""

# The station's map on a Modbus PLC: holding registers and two coils.
HR_TRIGGER, HR_PART, HR_CODE, HR_STATUS, HR_SEQ = 0, 2, 20, 21, 22
PART_REGS = 8
COIL_VALID, COIL_BUSY = 0, 1


# -- the PLC's side ----------------------------------------------------------------------


class Line:
    """The PLC program's side of one Modbus station: it writes the part id, steps the
    trigger counter, and reads the result the station wrote."""

    def __init__(self, plc: ModbusPlc) -> None:
        self.plc = plc
        self.count = 0

    def trigger(self, part: str = "") -> int:
        """Write ``part`` (when given) and step the counter; the new count."""
        if part:
            raw = part.encode()[: PART_REGS * 2].ljust(PART_REGS * 2, b"\0")
            words = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]
            self.plc.set("hr", HR_PART, words)
        self.count += 1
        self.plc.set("hr", HR_TRIGGER, [self.count >> 16, self.count & 0xFFFF])
        return self.count

    def seq(self) -> int:
        """The last result's sequence number as written to the PLC."""
        high, low = self.plc.get("hr", HR_SEQ, 2)
        return (high << 16) | low

    def wait_seq(self, seq: int, timeout_s: float = WAIT_S) -> bool:
        """Whether the result numbered ``seq`` reached the PLC within ``timeout_s``."""
        return self.plc.wait_for("hr", HR_SEQ, [seq >> 16, seq & 0xFFFF], timeout_s)


def modbus_link(name: str, plc: ModbusPlc) -> dict[str, Any]:
    return {
        "name": name,
        "driver": "modbus",
        "host": "127.0.0.1",
        "port": plc.port,
        "timeout_ms": TIMEOUT_MS,
        "reconnect_max_s": 0.5,
    }


def modbus_station(name: str, link: str, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "plc": link,
        "capture": "software_trigger",
        "deadline_ms": 5000,
        "fail_safe": "reject",
        "trigger": {"point": f"hr:{HR_TRIGGER}", "type": "uint32", "edge": "change", "poll_ms": 2},
        "part_id": {"point": f"hr:{HR_PART}:{PART_REGS}", "type": "string"},
        "outputs": [
            {"point": f"hr:{HR_CODE}", "type": "int16", "value": "outcome_code"},
            {"point": f"hr:{HR_STATUS}", "type": "uint16", "value": "status"},
            {"point": f"hr:{HR_SEQ}", "type": "uint32", "value": "seq"},
            {"point": f"coil:{COIL_BUSY}", "type": "bool", "value": "busy"},
            {"point": f"coil:{COIL_VALID}", "type": "bool", "value": "result_valid"},
        ],
        **more,
    }


def agent_config(
    tmp: Path, links: list[dict[str, Any]], stations: list[dict[str, Any]]
) -> dict[str, Any]:
    """An agent with one software-triggered camera and one pipeline (the tiny model) per
    station."""
    bundle = init_bundle(TINY_TFLITE, tmp / "tiny")
    cameras, pipelines = [], []
    for st in stations:
        cam, pipe = f"cam-{st['name']}", f"p-{st['name']}"
        cameras.append({"name": cam, "kind": "synthetic", "fps": 5, "width": 32, "height": 24,
                        "trigger_mode": "software"})  # fmt: skip
        pipelines.append({"name": pipe, "source": cam, "bundle": str(bundle.path)})
        st["pipeline"] = pipe
    return {
        "agent": {"device_id": "d", "state_dir": str(tmp / "state")},
        "runtime": {"workers": 1, "heartbeat_timeout_s": 30},
        "decision_log": {"thumbnails": "none"},
        "cameras": cameras,
        "pipelines": pipelines,
        "plc": links,
        "stations": stations,
    }


# -- waiting and reading -------------------------------------------------------------------


def wait_until(what: Callable[[], bool], timeout_s: float = WAIT_S, poll_s: float = 0.01) -> bool:
    """Whether ``what()`` came true within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if what():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def line_stats(agent: Agent) -> dict[str, Any]:
    stats: dict[str, Any] = agent.hotpath.line.stats()
    return stats


def station_stats(agent: Agent, name: str) -> dict[str, Any]:
    stats: dict[str, Any] = line_stats(agent)["stations"][name]
    return stats


def link_stats(agent: Agent, name: str) -> dict[str, Any]:
    stats: dict[str, Any] = line_stats(agent)["plc"][name]
    return stats


def settled(agent: Agent, link: str) -> bool:
    """Wait until ``link`` is connected and has read its inputs twice since (the first
    read after a connect is the trigger's baseline)."""
    if not wait_until(lambda: bool(link_stats(agent, link)["connected"])):
        return False
    reads = int(link_stats(agent, link)["reads"])
    return wait_until(lambda: int(link_stats(agent, link)["reads"]) >= reads + 2)


def metric(agent: Agent, name: str, **labels: str) -> float:
    """One sample of the agent's /metrics (0 when absent)."""
    samples = metric_samples(agent.metrics.render().decode())
    for key, value in samples.items():
        if not key.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            return value
    return 0.0


def decisions(agent: Agent, station: str) -> list[sqlite3.Row]:
    """The station's decisions in the decision log (flushed first)."""
    agent.hotpath.log.flush()
    conn = sqlite3.connect(agent.state_dir / "decisions.db")
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(
            "SELECT id, outcome, station, part_id, deadline_missed FROM decisions "
            "WHERE station = ? ORDER BY decision_time",
            (station,),
        ).fetchall()
    finally:
        conn.close()


def pipeline_errors(agent: Agent) -> int:
    return sum(r.stats.errors for r in agent.runners)


def accounted(stats: dict[str, Any]) -> bool:
    """Every trigger the station saw answered once: by the decision's result (ok), the
    fail-safe at the deadline, or as an overrun."""
    answered = stats["ok"] + stats["deadline_missed"] + stats["overruns"]
    return bool(stats["triggers"] == stats["answered"] == answered)


class InFlight:
    """Calls ``fault`` on the pipeline's thread when the next triggered decision is handed
    to its station: the decision is made, its result not yet queued for the PLC. The
    decision then goes on to its station and the log as always."""

    def __init__(self, agent: Agent, fault: Callable[[], None]) -> None:
        self.fault = fault
        self.seen = 0
        self.fired = threading.Event()
        self.fired_at = 0.0
        self.part_id = ""
        sink = agent.sink
        answer = sink.answer
        assert answer is not None
        self._answer = answer
        sink.answer = self

    def __call__(self, d: Decision) -> bool:
        self.seen += 1
        if self.seen == 1:
            self.part_id = str(getattr(d.trigger, "part_id", ""))
            self.fault()
            self.fired_at = time.monotonic()
            self.fired.set()
        return self._answer(d)


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def plc() -> Iterator[ModbusPlc]:
    server = ModbusPlc(size=64)
    server.start()
    yield server
    server.close()


@pytest.fixture
def plc2() -> Iterator[ModbusPlc]:
    server = ModbusPlc(size=64)
    server.start()
    yield server
    server.close()


@pytest.fixture
def agent_factory() -> Iterator[Callable[..., Agent]]:
    """Starts an agent (stopped at the end) and waits until its links have read their
    inputs (all but those named in ``failing``)."""
    agents: list[Agent] = []

    def make(cfg: dict[str, Any], failing: tuple[str, ...] = ()) -> Agent:
        agent = Agent(parse_config(cfg), http=False)
        agents.append(agent)
        agent.start()
        for link in cfg["plc"]:
            if link["name"] not in failing:
                assert settled(agent, link["name"]), line_stats(agent)
        return agent

    yield make
    for agent in agents:
        agent.stop()


# -- the tests -----------------------------------------------------------------------------


def test_a_trigger_storm_at_ten_times_the_station_rate_answers_every_trigger_once(
    tmp_path: Path, plc: ModbusPlc, agent_factory: Callable[..., Agent]
) -> None:
    agent = agent_factory(
        agent_config(tmp_path, [modbus_link("plc1", plc)], [modbus_station("gate", "plc1")])
    )
    line = Line(plc)
    # the station's own rate: triggers one after the other, each after its result
    took = []
    for _ in range(5):
        t0 = time.monotonic()
        n = line.trigger("WARM")
        assert line.wait_seq(n), line_stats(agent)
        took.append(time.monotonic() - t0)
    period_s = statistics.median(took) / 10  # ten times that rate
    storm = 200
    decided_before = len(decisions(agent, "gate"))
    next_at = time.monotonic()
    for i in range(storm):
        line.trigger(f"S-{i:04d}" if i % 20 == 0 else "")
        next_at += period_s
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    stormed = line.count
    assert wait_until(lambda: station_stats(agent, "gate")["answered"] >= stormed), line_stats(
        agent
    )
    # one more trigger after the storm: its result carries the next number, so every
    # trigger before it took exactly one (a result's write the queue could not take is
    # counted, below; the next result overwrites the same registers anyway)
    total = line.trigger("LAST")
    assert line.wait_seq(total), (line.seq(), line_stats(agent))
    assert plc.get("coil", COIL_VALID) == [1]
    assert plc.get("coil", COIL_BUSY) == [0]
    assert plc.get("hr", HR_STATUS) == [STATUS_CODES["ok"]]

    stats = station_stats(agent, "gate")
    assert stats["triggers"] == total  # every step of the counter seen, once
    assert stats["answered"] == total
    assert accounted(stats), stats
    assert stats["overruns"] > 0  # the storm outran the station
    assert stats["ok"] > 5 + 1  # ... and it kept deciding through it
    assert (
        metric(agent, "edgefleet_station_results_total", station="gate", status="overrun")
        == (stats["overruns"])
    )
    # writes the bounded queue refused are counted, by the station and the link alike
    full = stats["write_failures"].get("queue_full", 0)
    assert set(stats["write_failures"]) <= {"queue_full"}, stats["write_failures"]
    assert link_stats(agent, "plc1")["failures"] == ({"queue_full": full} if full else {})
    # the hot path kept deciding: a decision logged for each trigger that was not an
    # overrun (and got its frame), no pipeline errors
    decided = stats["ok"] + stats["deadline_missed"] - stats["no_frame"]
    assert wait_until(lambda: len(decisions(agent, "gate")) == decided), (decided, stats)
    assert decided > decided_before
    assert pipeline_errors(agent) == 0


def test_a_plc_gone_for_three_seconds_is_counted_alarmed_once_and_answered_again(
    tmp_path: Path, plc: ModbusPlc, agent_factory: Callable[..., Agent]
) -> None:
    agent = agent_factory(
        agent_config(tmp_path, [modbus_link("plc1", plc)], [modbus_station("gate", "plc1")])
    )
    line = Line(plc)
    for i in range(1, 6):
        line.trigger(f"P-{i:04d}")
        assert line.wait_seq(i), line_stats(agent)
    # the PLC goes away while the sixth decision is in flight
    hook = InFlight(agent, fault=plc.stop)
    line.trigger("P-0006")
    assert hook.fired.wait(WAIT_S)
    assert wait_until(lambda: station_stats(agent, "gate")["answered"] == 6), line_stats(agent)
    assert wait_until(lambda: not link_stats(agent, "plc1")["connected"])
    assert wait_until(lambda: link_stats(agent, "plc1")["failures"].get("refused", 0) >= 2)
    assert wait_until(lambda: sum(station_stats(agent, "gate")["write_failures"].values()) >= 1)
    gone_s = 3.0 - (time.monotonic() - hook.fired_at)
    time.sleep(max(0.0, gone_s))
    assert wait_until(lambda: metric(agent, "edgefleet_alarms_total", kind="plc_down") >= 1)
    assert metric(agent, "edgefleet_alarms_total", kind="plc_up") == 0
    plc.start()
    assert settled(agent, "plc1"), line_stats(agent)
    assert wait_until(lambda: metric(agent, "edgefleet_alarms_total", kind="plc_up") >= 1)
    assert plc.get("hr", HR_SEQ, 2) == [0, 5]  # the sixth result never reached the PLC

    for i in range(7, 11):
        line.trigger(f"P-{i:04d}")
        assert line.wait_seq(i), line_stats(agent)

    link = link_stats(agent, "plc1")
    assert link["connected"]
    assert link["connects"] >= 2
    failures = link["failures"]
    assert failures.get("disconnected", 0) >= 1, failures
    assert failures.get("refused", 0) >= 2, failures
    for reason in ("disconnected", "refused"):
        assert (
            metric(
                agent, "edgefleet_line_failures_total", link="plc1", driver="modbus", reason=reason
            )
            == failures[reason]
        )
    # raised once for the whole outage, cleared once
    assert metric(agent, "edgefleet_alarms_total", kind="plc_down") == 1
    assert metric(agent, "edgefleet_alarms_total", kind="plc_up") == 1

    stats = station_stats(agent, "gate")
    assert stats["triggers"] == 10
    assert accounted(stats), stats
    assert stats["ok"] == 10
    lost = stats["write_failures"]
    assert set(lost) <= {"disconnected", "refused", "timeout"}, lost
    # the decision in flight when the PLC went away is logged, with its part id
    rows = decisions(agent, "gate")
    assert [r["part_id"] for r in rows] == [f"P-{i:04d}" for i in range(1, 11)]
    assert hook.part_id == "P-0006"
    assert all(r["deadline_missed"] == 0 for r in rows)
    assert pipeline_errors(agent) == 0


def test_a_plc_stalled_mid_write_times_out_within_the_link_timeout_and_answers_after(
    tmp_path: Path, plc: ModbusPlc, agent_factory: Callable[..., Agent]
) -> None:
    agent = agent_factory(
        agent_config(tmp_path, [modbus_link("plc1", plc)], [modbus_station("gate", "plc1")])
    )
    line = Line(plc)
    line.trigger("P-0001")
    assert line.wait_seq(1), line_stats(agent)
    stall_s = 8.0
    hook = InFlight(agent, fault=lambda: plc.stall(stall_s))
    line.trigger("P-0002")
    assert hook.fired.wait(WAIT_S)

    def timed_out() -> bool:
        return bool(station_stats(agent, "gate")["write_failures"].get("timeout", 0) >= 1)

    assert wait_until(timed_out, timeout_s=stall_s / 2, poll_s=0.002), line_stats(agent)
    took_s = time.monotonic() - hook.fired_at
    # the write was given up at the link's timeout, not when the PLC came back; a read
    # already on the wire when the PLC stalled times out first (then the write: two)
    assert took_s <= 2 * TIMEOUT_MS / 1000 + 1.0, took_s

    # the stalled PLC's kernel still accepts connections: the link reconnects, and each
    # call times out again; that is not the PLC back (the alarm is not cleared)
    def connects_reach(n: int) -> bool:
        return bool(link_stats(agent, "plc1")["connects"] >= n)

    connects = int(link_stats(agent, "plc1")["connects"])
    for n in (connects + 1, connects + 2):
        assert wait_until(partial(connects_reach, n)), line_stats(agent)
        agent.hotpath.line.update_metrics()  # what the gauge thread does every second
    assert metric(agent, "edgefleet_alarms_total", kind="plc_down") == 1
    assert metric(agent, "edgefleet_alarms_total", kind="plc_up") == 0
    plc.resume()
    assert station_stats(agent, "gate")["answered"] == 2
    assert link_stats(agent, "plc1")["failures"].get("timeout", 0) >= 1
    assert (
        metric(
            agent, "edgefleet_line_failures_total", link="plc1", driver="modbus", reason="timeout"
        )
        >= 1
    )
    assert settled(agent, "plc1"), line_stats(agent)
    assert wait_until(lambda: metric(agent, "edgefleet_alarms_total", kind="plc_up") == 1)
    assert metric(agent, "edgefleet_alarms_total", kind="plc_down") == 1
    line.trigger("P-0003")
    assert line.wait_seq(3), line_stats(agent)
    assert plc.get("hr", HR_STATUS) == [STATUS_CODES["ok"]]

    stats = station_stats(agent, "gate")
    assert (stats["triggers"], stats["ok"]) == (3, 3)
    assert accounted(stats), stats
    rows = decisions(agent, "gate")
    assert [r["part_id"] for r in rows] == ["P-0001", "P-0002", "P-0003"]
    assert rows[1]["deadline_missed"] == 0  # decided in time; only its write was lost


def test_a_refused_result_register_counts_type_mismatch_and_leaves_other_stations_alone(
    tmp_path: Path,
    plc: ModbusPlc,
    plc2: ModbusPlc,
    agent_factory: Callable[..., Agent],
) -> None:
    agent = agent_factory(
        agent_config(
            tmp_path,
            [modbus_link("plc1", plc), modbus_link("plc2", plc2)],
            [modbus_station("gate", "plc1"), modbus_station("other", "plc2")],
        )
    )
    plc.refuse("hr", HR_CODE, ExcCodes.ILLEGAL_VALUE)  # the PLC checks the code's range
    refused, other = Line(plc), Line(plc2)
    for i in range(1, 4):
        refused.trigger(f"R-{i:04d}")
        other.trigger(f"O-{i:04d}")
        assert other.wait_seq(i), line_stats(agent)
        assert wait_until(lambda: station_stats(agent, "gate")["answered"] == refused.count)

    def mismatches() -> int:
        return int(station_stats(agent, "gate")["write_failures"].get("type_mismatch", 0))

    assert wait_until(lambda: mismatches() == 3), line_stats(agent)
    gate = station_stats(agent, "gate")
    assert gate["write_failures"] == {"type_mismatch": 3}  # one per result, nothing else
    assert accounted(gate)
    assert gate["ok"] == 3
    assert refused.seq() == 0  # a result stops at the refused register: no seq, no valid
    assert plc.get("coil", COIL_VALID) == [0]
    link1 = link_stats(agent, "plc1")
    assert link1["connected"]
    assert link1["connects"] == 1  # not a reason to reconnect
    assert link1["failures"] == {"type_mismatch": 3}
    assert metric(
        agent, "edgefleet_line_failures_total", link="plc1", driver="modbus",
        reason="type_mismatch",
    ) == 3  # fmt: skip
    assert metric(agent, "edgefleet_alarms_total", kind="plc_down") == 0
    # the decisions are logged all the same
    assert [r["part_id"] for r in decisions(agent, "gate")] == ["R-0001", "R-0002", "R-0003"]
    # the other station and its link never noticed
    st2 = station_stats(agent, "other")
    assert (st2["triggers"], st2["ok"], st2["write_failures"]) == (3, 3, {})
    assert link_stats(agent, "plc2")["failures"] == {}
    assert [r["part_id"] for r in decisions(agent, "other")] == ["O-0001", "O-0002", "O-0003"]
    # once the PLC takes the value again, the station's results get through
    plc.accept()
    refused.trigger("R-0004")
    assert refused.wait_seq(4), line_stats(agent)


@pytest.fixture
def opcua_plc(tmp_path: Path) -> Iterator[OpcUaPlc]:
    (tmp_path / "plc").mkdir()
    server = OpcUaPlc(tmp_path / "plc")
    server.start()
    yield server
    server.close()


def test_a_node_of_another_type_and_a_missing_node_are_counted_and_retried_at_the_poll_pace(
    tmp_path: Path, opcua_plc: OpcUaPlc, agent_factory: Callable[..., Agent]
) -> None:
    node = opcua_plc.node_id
    poll_ms = 50.0

    def link(name: str) -> dict[str, Any]:
        return {"name": name, "driver": "opcua", "endpoint": opcua_plc.endpoint,
                "security": "none", "timeout_ms": 2000, "reconnect_max_s": 0.5}  # fmt: skip

    def station(name: str, plc: str, trigger: str, vtype: str, **more: Any) -> dict[str, Any]:
        return {"name": name, "plc": plc, "capture": "software_trigger", "deadline_ms": 5000,
                "trigger": {"point": trigger, "type": vtype, "poll_ms": poll_ms,
                            "edge": "change" if vtype == "uint32" else "rising"},
                **more}  # fmt: skip

    good_outputs = [
        {"point": node("Seq"), "type": "uint32", "value": "seq"},
        {"point": node("ResultValid"), "type": "bool", "value": "result_valid"},
    ]
    agent = agent_factory(
        agent_config(
            tmp_path,
            [link("bad"), link("good")],
            [
                # the part id is an Int32 node configured as a string
                station(
                    "typed",
                    "bad",
                    node("TriggerCount"),
                    "uint32",
                    part_id={"point": node("Value_int32"), "type": "string"},
                ),
                # the trigger node does not exist on the server
                station("missing", "bad", node("NoSuchNode"), "bool"),
                station(
                    "good",
                    "good",
                    node("Trigger"),
                    "bool",
                    part_id={"point": node("PartId"), "type": "string"},
                    outputs=good_outputs,
                ),
            ],
        ),
        failing=("bad",),
    )

    def failures() -> dict[str, int]:
        return dict(link_stats(agent, "bad")["failures"])

    # both groups of the one link fail, each in its own way; neither starves the other
    assert wait_until(lambda: failures().get("type_mismatch", 0) >= 3), line_stats(agent)
    assert wait_until(lambda: failures().get("bad_node", 0) >= 3), failures()
    before, t0 = failures(), time.monotonic()
    time.sleep(1.0)
    after, took_s = failures(), time.monotonic() - t0
    polls = took_s / (poll_ms / 1000) + 2
    for reason in ("type_mismatch", "bad_node"):
        retried = after[reason] - before[reason]
        # the link keeps trying, at the group's poll pace (not in a spin)
        assert 1 <= retried <= 2 * polls, (reason, retried, polls)
        assert (
            metric(agent, "edgefleet_line_failures_total", link="bad", reason=reason)
            >= (after[reason])
        )
    bad = link_stats(agent, "bad")
    assert bad["connected"]
    assert bad["connects"] == 1  # neither drops the connection
    assert station_stats(agent, "typed")["triggers"] == 0
    assert station_stats(agent, "missing")["triggers"] == 0
    assert metric(agent, "edgefleet_alarms_total", kind="plc_down") == 0

    # the agent keeps running: a station on the other link is triggered and answered
    opcua_plc.set("PartId", "G-0001")
    opcua_plc.set("Trigger", True)
    assert opcua_plc.wait_for("ResultValid", True, WAIT_S), line_stats(agent)
    assert opcua_plc.get("Seq") == 1
    assert [r["part_id"] for r in decisions(agent, "good")] == ["G-0001"]
    assert link_stats(agent, "good")["failures"] == {}
    assert pipeline_errors(agent) == 0
