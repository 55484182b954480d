"""One ``hil run``: clean up after a crashed run, make the assets, the LAN (simulated
devices) and the fleet, run each scenario against fresh devices, and write the report
after every scenario (so a run cut short still leaves one)."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hil import assets as assets_mod
from hil import netns
from hil.device import Device
from hil.errors import FaultUnavailable, HilError, UsageError
from hil.fleet import Fleet, stop_stale
from hil.report import ERROR, UNAVAILABLE, Check, Report, ScenarioReport
from hil.scenario import RunContext, Size
from hil.scenarios import SCENARIOS
from hil.sim import SimDevice
from hil.ssh import SshDevice, SshTarget
from runtime.profiles import load_profile

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """What to run, against what.

    Attributes:
        scenarios: scenario names, in order.
        device: "sim", or an ssh:// URL (:class:`~hil.ssh.SshTarget`).
        size: phase durations.
        workdir: where devices, the fleet and logs live.
        report: where the JSON report goes (None: not written).
        models: the pretrained models (``make models``).
        fleet_host: with a real device, this machine's address the device reaches.
    """

    scenarios: list[str]
    device: str = "sim"
    size: Size = field(default_factory=Size.full)
    workdir: Path = Path(".cache/hil")
    report: Path | None = None
    models: Path = assets_mod.DEFAULT_MODELS
    fleet_host: str | None = None


def check_names(names: list[str]) -> list[str]:
    """The scenario names, ``all`` (every scenario) and ``ci`` (those ``make hil`` runs)
    expanded.

    Raises:
        UsageError: an unknown name.
    """
    if not names or names == ["all"]:
        return list(SCENARIOS)
    if names == ["ci"]:
        return [name for name, s in SCENARIOS.items() if s.in_ci]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        known = ", ".join(SCENARIOS)
        raise UsageError("scenario", f"unknown {', '.join(unknown)} (known: {known}, all, ci)")
    return names


def _profile_here() -> str:
    return load_profile("auto").name


def run(opts: RunOptions, say: Callable[[str], None]) -> Report:
    """Run the scenarios and return the report.

    Raises:
        HilError: the run can't start (no network namespaces, no models, a fleet that
            does not start, a bad device URL).
    """
    names = check_names(opts.scenarios)
    report = Report()
    start = time.monotonic()
    workdir = opts.workdir.resolve()
    target = None if opts.device == "sim" else SshTarget.parse(opts.device)
    if target is None:
        why = netns.netns_supported()
        if why is not None:
            raise HilError(f"simulated devices need network namespaces: {why}")
        for what in netns.cleanup_stale():
            say(f"cleaned up after an earlier run: {what}")
    elif opts.fleet_host is None:
        raise UsageError("--fleet-host", "a real device needs this machine's address on its LAN")
    stale = stop_stale(workdir / "fleet")
    if stale:
        say(stale)
    say("assets: video and bundles")
    assets = assets_mod.prepare(workdir / "assets", opts.models)
    lan: netns.Lan | None = None
    fleet: Fleet | None = None
    try:
        if target is None:
            lan = netns.create_lan()
            fleet = Fleet(workdir / "fleet", broker_host=lan.host_ip)
        else:
            host = str(opts.fleet_host)
            fleet = Fleet(workdir / "fleet", broker_host=host, api_host=host)
        fleet.prepare([assets.release2])
        say(f"fleet-server up in {fleet.start():.1f} s (broker {fleet.broker_host})")
        counter = iter(range(netns.MAX_DEVICES))

        def make_device(device_id: str) -> Device:
            if target is not None:
                assert fleet is not None
                ports = [fleet.broker_port, fleet.api_port]
                return SshDevice(target, device_id, (fleet.broker_host, ports))
            assert lan is not None
            return SimDevice(device_id, lan, next(counter), workdir)

        profile = _profile_here() if target is None else SshDevice(target, "probe").profile()
        for name in names:
            report.scenarios.append(_one(name, opts, fleet, assets, make_device, profile, say))
            report.wall_s = time.monotonic() - start
            if opts.report is not None:
                report.write(opts.report)
    finally:
        if fleet is not None:
            fleet.stop()
        if lan is not None:
            lan.destroy()
    report.wall_s = time.monotonic() - start
    if opts.report is not None:
        report.write(opts.report)
    return report


def _one(
    name: str,
    opts: RunOptions,
    fleet: Fleet,
    assets: assets_mod.Assets,
    make_device: Callable[[str], Device],
    profile: str,
    say: Callable[[str], None],
) -> ScenarioReport:
    scenario = SCENARIOS[name]()
    kind = "sim" if opts.device == "sim" else opts.device
    out = ScenarioReport(name, scenario.title, kind, opts.size.name)
    t0 = time.monotonic()

    def tell(message: str) -> None:
        say(f"{name}: {message}")

    ctx = RunContext(fleet, assets, make_device, opts.size, opts.workdir, profile, tell)
    tell(scenario.title)
    result = ERROR
    try:
        scenario.run(ctx, out)
    except FaultUnavailable as exc:
        out.error = str(exc)
        result = UNAVAILABLE
    except HilError as exc:
        out.error = str(exc)
    except Exception as exc:  # a harness bug: keep going with the next scenario
        log.exception("scenario %s", name)
        out.error = f"{type(exc).__name__}: {exc} ({traceback.format_exc(limit=3)})"
    finally:  # also on Ctrl-C: no namespace, mount or agent is left behind
        for dev in ctx.devices:
            out.logs = dev.home
            try:
                dev.teardown()
            except HilError as exc:
                tell(f"teardown of {dev.device_id}: {exc}")
    judged = {c.invariant for c in out.checks}
    for invariant in scenario.invariants:
        if invariant not in judged:
            out.checks.append(Check(invariant, result, detail=out.error or "not judged"))
    if not fleet.healthy():
        tell("the fleet server is down: starting it again for the next scenario")
        fleet.stop()
        fleet.start()
    out.wall_s = round(time.monotonic() - t0, 1)
    tell(f"{out.result} in {out.wall_s:.0f} s")
    return out
