"""Scenarios on bundle delivery: the link cut during a download (2), and during a
rollout's install on the device (3)."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from hil.agentconf import BUNDLE
from hil.assets import RELEASE2_VERSION
from hil.device import Device
from hil.errors import DeviceError, HilError
from hil.faults import LinkDown, Throttle
from hil.report import ScenarioReport, verdict
from hil.scenario import RunContext, Scenario, bring_up, pause
from hil.shell import wait_for

TARGET = f"{BUNDLE}@{RELEASE2_VERSION}"
_RETRY = re.compile(r"fetch (\S+) at offset (\d+): (.*) \(try (\d+)\)")
STOPPED = ("paused", "rolling_back", "rolled_back", "cancelled", "completed_partial")
AFTER_SWITCH = ("switch", "health", "commit")
"""Install steps after which a failure puts the previous slot back (a local rollback)."""


def journal(dev: Device) -> dict[str, Any]:
    """The installer's journal of the bundle on the device ({} before the first)."""
    try:
        raw = dev.read_file(dev.path("state", "bundles", BUNDLE, "install-state.json"))
        data = json.loads(raw)
    except (DeviceError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def fetch_retries(dev: Device) -> list[tuple[str, int, str]]:
    """(file, offset, why) of each chunk request the agent's fetcher asked again."""
    try:
        text = dev.read_file(dev.path("agent.log")).decode(errors="replace")
    except DeviceError:
        return []
    return [(m.group(1), int(m.group(2)), m.group(3)) for m in _RETRY.finditer(text)]


def _release(ctx: RunContext, dev: Device) -> int | None:
    active = ctx.fleet.device(dev.device_id).get("active_release")
    return None if active is None else int(active)


class DownloadCut(Scenario):
    """Scenario 2: the link cut in the middle of a bundle download (throttled so that
    the download lasts long enough to be cut in the middle)."""

    name = "download-cut"
    title = "link cut during a bundle download"
    invariants = ("the download resumes where it stopped and completes",)
    KBIT = 800
    CUT_AFTER_BYTES = 330_000
    """Past the first 256 KiB chunk of the model: the resume offset is then above 0."""

    def run(self, ctx: RunContext, out: ScenarioReport) -> None:
        dev = ctx.device("hil-download")
        bring_up(ctx, dev, labels={"hil": self.name}, fetch_timeout_s=5.0)
        throttle = Throttle(dev, self.KBIT)
        throttle.apply()
        base = dev.fleet_side_tx_bytes()
        rid = ctx.fleet.create_rollout(TARGET, f"hil={self.name}")
        t0 = time.monotonic()
        ctx.say(f"rollout {rid}: {TARGET}, link throttled to {self.KBIT} kbit/s")
        if base is None:  # no counter on this device: cut a few seconds in
            time.sleep(4.0)
            sent = None
        else:

            def far_enough() -> bool:
                now = dev.fleet_side_tx_bytes()
                return now is not None and now - base >= self.CUT_AFTER_BYTES

            wait_for(far_enough, 90, "the download to pass its first chunk", poll_s=0.05)
            now_sent = dev.fleet_side_tx_bytes()
            sent = None if now_sent is None else now_sent - base
        link = LinkDown(dev)
        link.apply()
        cut_at = time.monotonic() - t0
        statuses = {ctx.fleet.rollout_status(rid, dev.device_id)}
        pause(ctx, max(12.0, ctx.size.fault_s / 2), "link cut mid-download")
        statuses.add(ctx.fleet.rollout_status(rid, dev.device_id))
        link.clear()
        try:
            wait_for(
                lambda: (
                    ctx.fleet.rollout_status(rid, dev.device_id)
                    in ("done", "failed", "rolled-back")
                ),
                180,
                "the device to report the install",
                poll_s=0.5,
            )
        except HilError as exc:
            out.error = str(exc)
        throttle.clear()
        out.faults += [throttle.record(), link.record()]
        final = ctx.fleet.rollout_status(rid, dev.device_id)
        retries = fetch_retries(dev)
        resumed = [r for r in retries if r[1] > 0]
        release = _release(ctx, dev)
        ok = final == "done" and release == 2 and bool(resumed)
        detail = ""
        if final != "done" or release != 2:
            detail = f"rollout status {final}, active release {release}: {journal(dev)}"
        elif not resumed:
            detail = f"no chunk asked again past offset 0 (retries: {retries[:3]})"
        out.checks.append(
            verdict(
                self.invariants[0],
                ok,
                {
                    "bytes_before_cut": sent,
                    "cut_after_s": round(cut_at, 1),
                    "link_down_s": round(link.applied_s, 1),
                    "resumed_at_offset": resumed[0][1] if resumed else None,
                    "chunk_retries": len(retries),
                    "completed_s": round(time.monotonic() - t0, 1),
                    "status": final,
                    "statuses_while_cut": sorted(s for s in statuses if s),
                    "active_release": release,
                },
                detail,
            )
        )


class RolloutCut(Scenario):
    """Scenario 3: the link cut while the device is in its install's health window."""

    name = "rollout-cut"
    title = "link cut during a rollout"
    invariants = (
        "the device finishes (or rolls back) locally while cut off",
        "the rollout shows it pending meanwhile, never failed",
        "the device reports its outcome on return",
    )
    WINDOW_S = 8.0

    def run(self, ctx: RunContext, out: ScenarioReport) -> None:
        dev = ctx.device("hil-rollout")
        bring_up(ctx, dev, labels={"hil": self.name}, health_window_s=self.WINDOW_S)
        rid = ctx.fleet.create_rollout(TARGET, f"hil={self.name}")
        ctx.say(f"rollout {rid}: {TARGET}; waiting for the switch to the new release")
        wait_for(
            lambda: journal(dev).get("step") in ("switch", "health"),
            120,
            "the install to switch to the new release",
            poll_s=0.1,
        )
        link = LinkDown(dev)
        link.apply()
        t_cut = time.monotonic()
        cut_step = journal(dev).get("step")
        seen: set[str] = set()
        phases: set[str] = set()
        local_done: float | None = None
        outage = max(self.WINDOW_S + 8.0, ctx.size.fault_s)
        ctx.say(f"link cut at step {cut_step} ({outage:g} s)")
        while time.monotonic() - t_cut < outage:
            seen.add(str(ctx.fleet.rollout_status(rid, dev.device_id)))
            phases.add(str(ctx.fleet.rollout(rid).get("phase")))
            j = journal(dev)
            if local_done is None and j.get("status") in ("committed", "rolled-back", "failed"):
                local_done = time.monotonic() - t_cut
            time.sleep(0.5)
        local = journal(dev)
        link.clear()
        t_up = time.monotonic()
        out.faults.append(link.record())
        try:
            wait_for(
                lambda: (
                    ctx.fleet.rollout_status(rid, dev.device_id)
                    in ("done", "failed", "rolled-back")
                ),
                90,
                "the device's report",
                poll_s=0.25,
            )
            reported_s: float | None = time.monotonic() - t_up
        except HilError:
            reported_s = None
        final = ctx.fleet.rollout_status(rid, dev.device_id)
        # a window that failed after the switch put the previous slot back: the device
        # rolled back on its own (the installer's journal says failed, at that step)
        rolled_back = local.get("status") == "failed" and local.get("step") in AFTER_SWITCH
        finished = local.get("status") in ("committed", "rolled-back") or rolled_back
        out.checks.append(
            verdict(
                self.invariants[0],
                local_done is not None and finished,
                {
                    "cut_at_step": cut_step,
                    "local_outcome": local.get("status"),
                    "local_done_after_cut_s": None if local_done is None else round(local_done, 1),
                },
                "" if local_done is not None else f"journal while cut off: {local}",
            )
        )
        bad = sorted(seen - {"assigned", "installing"})
        stopped = sorted(phases & set(STOPPED))
        out.checks.append(
            verdict(
                self.invariants[1],
                not bad and not stopped,
                {"statuses_while_cut": sorted(seen), "phases_while_cut": sorted(phases)},
                f"statuses {bad}, phases {stopped}" if bad or stopped else "",
            )
        )
        # a device that rolled back fails the rollout's gate; once the rollout has
        # reverted, the device that already runs its previous release is rolled-back
        expect = ("done",) if local.get("status") == "committed" else ("failed", "rolled-back")
        out.checks.append(
            verdict(
                self.invariants[2],
                final in expect and reported_s is not None,
                {
                    "status": final,
                    "reported_after_return_s": None if reported_s is None else round(reported_s, 1),
                    "phase": ctx.fleet.rollout(rid).get("phase"),
                },
                "" if final in expect else f"expected {expect} after a local {local.get('status')}",
            )
        )
