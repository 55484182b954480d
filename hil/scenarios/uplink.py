"""Scenarios on the uplink: a long outage (1), and a lossy link (6)."""

from __future__ import annotations

import time
from typing import Any

from hil.faults import LinkDown, PacketLoss
from hil.observe import percentile, rounded
from hil.report import ScenarioReport, verdict
from hil.scenario import (
    RunContext,
    Scenario,
    bring_up,
    e2e_p99,
    exactly_once_check,
    health_check,
    pause,
    robot_between,
    wait_drained,
)

FPS = 15.0
HEALTH_S = 1.0


class Offline(Scenario):
    """Scenario 1: the uplink cut for 10 minutes (CI: 60 s) at 15 fps, then back."""

    name = "offline"
    title = "10 minutes offline at 15 fps, then reconnect"
    invariants = (
        "local actions get every decision while offline",
        "every decision arrives at the fleet exactly once (ids compared)",
        "every health report made offline arrives once, in sequence",
        "the backlog drains after the reconnect",
    )

    def run(self, ctx: RunContext, out: ScenarioReport) -> None:
        dev = ctx.device("hil-offline")
        bring_up(ctx, dev, labels={"hil": self.name}, fps=FPS, health_interval_s=HEALTH_S)
        pause(ctx, ctx.size.baseline_s, "online baseline")
        link = LinkDown(dev)
        out.faults.append(link.record())
        link.apply()
        t_down = time.time()
        pause(ctx, ctx.size.offline_s, "uplink cut")
        t_up = time.time()
        backlog = dev.healthz() or {}
        waiting = sum(1 for d in dev.decisions() if d.uploaded != 1)
        link.clear()
        out.faults[-1] = link.record()
        ctx.say("uplink back: waiting for the backlog to drain")
        drain_s = wait_drained(ctx.fleet, dev, t_up, max(90.0, ctx.size.offline_s))
        time.sleep(2.0)  # the robot's last lines, the fleet's last batch

        offline = [d for d in dev.decisions() if t_down <= d.decision_time < t_up]
        robot_ids = {m.decision_id for m in robot_between(dev, t_down, t_up + 2.0)}
        not_acted = [d.id for d in offline if d.id not in robot_ids]
        out.checks.append(
            verdict(
                self.invariants[0],
                bool(offline) and not not_acted,
                {
                    "decided_offline": len(offline),
                    "not_at_robot": len(not_acted),
                    "fps_offline": round(len(offline) / (t_up - t_down), 1),
                },
                f"{len(not_acted)} offline decisions never reached the robot" if not_acted else "",
            )
        )
        out.checks.append(exactly_once_check(self.invariants[1], ctx.fleet, dev, t_up))
        out.checks.append(
            health_check(self.invariants[2], ctx.fleet, dev, (t_down, t_up), HEALTH_S)
        )
        outbox = backlog.get("outbox", {})
        out.checks.append(
            verdict(
                self.invariants[3],
                drain_s is not None,
                {
                    "drain_s": None if drain_s is None else round(drain_s, 1),
                    "offline_s": round(t_up - t_down, 1),
                    "decisions_waiting": waiting,
                    "outbox_pending": outbox.get("pending"),
                    "outbox_bytes": outbox.get("bytes"),
                    "outbox_dropped": outbox.get("dropped"),
                },
                "" if drain_s is not None else "the fleet did not catch up in time",
            )
        )
        p99_before, _ = e2e_p99(dev, t_down - ctx.size.baseline_s, t_down)
        p99_off, _ = e2e_p99(dev, t_down, t_up)
        out.figures.update(e2e_p99_ms_online=p99_before, e2e_p99_ms_offline=p99_off)


class Lossy(Scenario):
    """Scenario 6: 30 % packet loss for 5 minutes (CI: 60 s).

    Local latency is compared A-B-A: the loss window against the windows just before
    and just after it together, so that a drift of the agent's latency over its run is
    not taken for an effect of the loss.
    """

    name = "packet-loss"
    title = "30 % packet loss for 5 minutes"
    invariants = (
        "every health report made during the loss arrives once, in sequence",
        "every decision arrives at the fleet exactly once (ids compared)",
        "local decision latency unchanged (e2e p50 and p99, every decision at the robot)",
    )
    LOSS = 30
    P50 = (1.5, 2.0)
    """p50 during the loss may be at most this factor of the baseline, or this many ms
    above it, whichever is more."""
    P99 = (2.0, 10.0)
    """Likewise p99: its baseline is a few samples, so the band is wider."""

    def run(self, ctx: RunContext, out: ScenarioReport) -> None:
        dev = ctx.device("hil-loss")
        bring_up(ctx, dev, labels={"hil": self.name}, fps=FPS, health_interval_s=HEALTH_S)
        side = max(ctx.size.baseline_s, 15.0)
        t_a = time.time()
        pause(ctx, side, "baseline before the loss")
        loss = PacketLoss(dev, self.LOSS)
        loss.apply()
        t_on = time.time()
        pause(ctx, ctx.size.loss_s, f"{self.LOSS} % packet loss")
        t_off = time.time()
        loss.clear()
        out.faults.append(loss.record())
        t_b = pause(ctx, side, "baseline after the loss")
        drain_s = wait_drained(ctx.fleet, dev, t_off, 120.0)
        time.sleep(2.0)

        check = health_check(self.invariants[0], ctx.fleet, dev, (t_on, t_off), HEALTH_S)
        check.figures["catch_up_s"] = None if drain_s is None else round(drain_s, 1)
        out.checks.append(check)
        out.checks.append(exactly_once_check(self.invariants[1], ctx.fleet, dev, t_off))
        decided = dev.decisions()
        base = [d.e2e_ms for d in decided if d.e2e_ms is not None and
                (t_a <= d.decision_time < t_on or t_off <= d.decision_time < t_b)]  # fmt: skip
        during = [d.e2e_ms for d in decided if d.e2e_ms is not None and
                  t_on <= d.decision_time < t_off]  # fmt: skip
        lossy = [d for d in decided if t_on <= d.decision_time < t_off]
        robot_ids = {m.decision_id for m in robot_between(dev, t_on, t_off + 2.0)}
        not_acted = sum(1 for d in lossy if d.id not in robot_ids)
        figures: dict[str, Any] = {"decisions_base": len(base), "decisions_during": len(during)}
        problems = []
        for q, (factor, slack) in ((50, self.P50), (99, self.P99)):
            b, d = rounded(percentile(base, q)), rounded(percentile(during, q))
            figures[f"p{q}_ms_base"], figures[f"p{q}_ms_during"] = b, d
            if b is None or d is None:
                problems.append(f"no p{q}: too few decisions")
                continue
            limit = max(b * factor, b + slack)
            if d > limit:
                problems.append(f"p{q} {d} ms during the loss is over {limit:.1f} ms")
        figures["not_at_robot"] = not_acted
        if not_acted:
            problems.append(f"{not_acted} decisions never reached the robot")
        out.checks.append(verdict(self.invariants[2], not problems, figures, "; ".join(problems)))
