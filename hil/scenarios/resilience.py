"""Scenarios where a part fails: the fleet broker restarts under load (4), the device's
disk fills up (5)."""

from __future__ import annotations

import time
from typing import Any

from hil.device import Device
from hil.errors import DeviceError, HilError
from hil.faults import BrokerRestart, LinkDown
from hil.faults_device import DiskFull
from hil.observe import drop_policy_holds, labelled, metric_samples
from hil.report import ScenarioReport, verdict
from hil.scenario import (
    RunContext,
    Scenario,
    bring_up,
    exactly_once_check,
    health_check,
    pause,
    robot_between,
    wait_drained,
)
from hil.shell import wait_for

FPS = 15.0
HEALTH_S = 1.0
DROP_ORDER = ("health", "event", "decisions")


def counters(dev: Device, name: str, label: str) -> dict[str, float]:
    """A labelled counter of the agent's /metrics ({} when it does not answer)."""
    status, body = dev.http("/metrics")
    return labelled(metric_samples(body), name, label) if status == 200 else {}


def outbox_pending(dev: Device) -> dict[str, int]:
    """Records waiting in the outbox, by kind (read from its file).

    Raises:
        DeviceError: the outbox file can't be read.
    """
    rows = dev.query(
        dev.path("state", "outbox.db"), "SELECT kind, count(*) AS n FROM outbox GROUP BY kind"
    )
    return {str(r["kind"]): int(r["n"]) for r in rows}


class BrokerRestartUnderLoad(Scenario):
    """Scenario 4: the fleet broker restarts while the device drains a backlog (a slow
    drain of small batches, so that the restart lands in the middle of it) on top of
    its live decisions and health reports."""

    name = "broker-restart"
    title = "broker restart under load"
    invariants = (
        "nothing lost, nothing duplicated: decisions (ids compared)",
        "nothing lost, nothing duplicated: health reports (seqs)",
    )
    DOWN_S = 3.0

    def run(self, ctx: RunContext, out: ScenarioReport) -> None:
        dev = ctx.device("hil-broker")
        bring_up(
            ctx,
            dev,
            labels={"hil": self.name},
            fps=FPS,
            health_interval_s=HEALTH_S,
            decisions_batch=20,
            outbox={"drain_rate_per_s": 2.0},
        )
        link = LinkDown(dev)
        link.apply()
        t_down = time.time()
        pause(ctx, ctx.size.fault_s, "building a backlog (uplink cut)")
        link.clear()
        out.faults.append(link.record())
        wait_for(lambda: bool((dev.healthz() or {}).get("outbox", {}).get("pending")), 30,
                 "the drain to start", poll_s=0.1)  # fmt: skip
        backlog = (dev.healthz() or {}).get("outbox", {})
        unacked = sum(1 for d in dev.decisions() if d.uploaded != 1)
        restart = BrokerRestart(ctx.fleet)
        restart.apply()
        ctx.say(f"broker down ({self.DOWN_S:g} s), outbox pending {backlog.get('pending')}")
        time.sleep(self.DOWN_S)
        restart.clear()
        t_back = time.time()
        out.faults.append(restart.record())
        drain_s = wait_drained(ctx.fleet, dev, t_back, 180.0)
        time.sleep(2.0)
        figures: dict[str, Any] = {
            "outbox_pending_at_restart": backlog.get("pending"),
            "decisions_unacked_at_restart": unacked,
            "drain_after_restart_s": None if drain_s is None else round(drain_s, 1),
        }
        out.checks.append(exactly_once_check(self.invariants[0], ctx.fleet, dev, t_back, **figures))
        out.checks.append(
            health_check(self.invariants[1], ctx.fleet, dev, (t_down, t_back), HEALTH_S)
        )


class DiskFullScenario(Scenario):
    """Scenario 5: the state directory (a small tmpfs) fills up while the uplink is cut,
    so that records must wait in the outbox on the full disk."""

    name = "disk-full"
    title = "disk full"
    invariants = (
        "decisions keep flowing to local actions",
        "the alarm is raised",
        "the outbox drops by the configured policy",
        "the agent recovers when space is back",
    )
    TMPFS_MB = 64

    def run(self, ctx: RunContext, out: ScenarioReport) -> None:
        dev = ctx.device("hil-disk")
        bring_up(
            ctx,
            dev,
            labels={"hil": self.name},
            tmpfs_mb=self.TMPFS_MB,
            fps=FPS,
            health_interval_s=HEALTH_S,
            drop_order=DROP_ORDER,
        )
        pause(ctx, ctx.size.baseline_s, "baseline")
        alarms_before = counters(dev, "edgefleet_alarms_total", "kind")
        decided_before = sum(counters(dev, "edgefleet_decisions_total", "outcome").values())
        link, full = LinkDown(dev), DiskFull(dev)
        link.apply()
        full.apply()
        t_full = time.time()
        window = max(30.0, ctx.size.fault_s)
        pause(ctx, window, "disk full, uplink cut")
        t_end = time.time()
        health = dev.healthz() or {}
        unreadable = ""
        try:
            pending: dict[str, int] | None = outbox_pending(dev)
        except DeviceError as exc:
            pending, unreadable = None, str(exc)
        alarms = counters(dev, "edgefleet_alarms_total", "kind")
        decided = sum(counters(dev, "edgefleet_decisions_total", "outcome").values())
        written_full = int(health.get("decision_log", {}).get("written", 0))
        full.clear()
        link.clear()
        out.faults += [full.record(), link.record()]

        robot = robot_between(dev, t_full, t_end)
        made = decided - decided_before
        fps = len(robot) / (t_end - t_full)
        out.checks.append(
            verdict(
                self.invariants[0],
                made > 0 and len(robot) >= 0.9 * made and fps >= 0.8 * FPS,
                {"decisions": int(made), "at_robot": len(robot), "robot_fps": round(fps, 1)},
                "" if len(robot) >= 0.9 * made else "decisions did not reach the robot",
            )
        )
        raised = {k: int(v - alarms_before.get(k, 0)) for k, v in alarms.items()}
        raised = {k: v for k, v in raised.items() if v > 0}
        out.checks.append(
            verdict(
                self.invariants[1],
                bool(raised),
                {"alarms": raised},
                "" if raised else "no alarm counted on /metrics",
            ),
        )
        box = health.get("outbox", {})
        dropped = {str(k): int(v) for k, v in box.get("dropped", {}).items()}
        holds, why = (
            drop_policy_holds(dropped, pending, DROP_ORDER)
            if pending is not None
            else (False, f"the outbox's waiting records can't be read: {unreadable}")
        )
        acted = sum(dropped.values()) > 0
        out.checks.append(
            verdict(
                self.invariants[2],
                holds and acted,
                {
                    "drop_order": list(DROP_ORDER),
                    "dropped": dropped,
                    "pending": pending,
                    "dropping": box.get("dropping"),
                },
                why or ("" if acted else "nothing dropped: the policy was never exercised"),
            )
        )

        t_back = time.time()

        def writing() -> bool:
            now = (dev.healthz() or {}).get("decision_log", {}).get("written", 0)
            return int(now) > written_full + 2 * FPS

        try:
            recover_s: float | None = wait_for(writing, 60, "the decision log to write again")
            wait_for(
                lambda: any(s.ts > t_back for s in ctx.fleet.health(dev.device_id)),
                60,
                "health reports at the fleet",
            )
        except HilError as exc:
            recover_s = None
            out.error = str(exc)
        out.checks.append(
            verdict(
                self.invariants[3],
                recover_s is not None,
                {
                    "recovered_s": None if recover_s is None else round(recover_s, 1),
                    "log_write_errors": health.get("decision_log", {}).get("write_errors"),
                },
                "" if recover_s is not None else out.error,
            )
        )
