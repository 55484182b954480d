"""What every scenario shares: the run's context, bringing a device up on the fleet, and
the common figures (decision ids, health reports, local latency) read from both ends.

A scenario is a class with a ``name``, a ``title``, its ``invariants`` and ``run(ctx,
out)``, which puts faults on, reads, and appends one :class:`~hil.report.Check` per
invariant to ``out``; ``in_ci`` says whether ``hil run ci`` (what ``make hil`` runs)
includes it. Durations come from :class:`Size`: the full sizes of the issue, or
the CI sizes (``--short``), with the same invariants.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from hil import agentconf
from hil.assets import Assets
from hil.device import Device
from hil.errors import DeviceError, HilError
from hil.fleet import Fleet
from hil.observe import IdComparison, compare_ids, judge_health, percentile, rounded
from hil.report import Check, ScenarioReport, verdict
from hil.shell import wait_for

DeviceFactory = Callable[[str], Device]


@dataclass(frozen=True)
class Size:
    """How long each phase lasts; ``short`` is the CI size."""

    name: str
    offline_s: float
    loss_s: float
    fault_s: float
    baseline_s: float

    @classmethod
    def full(cls) -> Size:
        return cls("full", offline_s=600, loss_s=300, fault_s=60, baseline_s=30)

    @classmethod
    def short(cls) -> Size:
        return cls("short", offline_s=60, loss_s=60, fault_s=20, baseline_s=10)

    def scaled(self, factor: float) -> Size:
        """Every phase times ``factor`` (at least 5 s each)."""
        return replace(
            self,
            name=f"{self.name} x{factor:g}",
            offline_s=max(5.0, self.offline_s * factor),
            loss_s=max(5.0, self.loss_s * factor),
            fault_s=max(5.0, self.fault_s * factor),
            baseline_s=max(5.0, self.baseline_s * factor),
        )


@dataclass
class RunContext:
    """What a scenario runs against."""

    fleet: Fleet
    assets: Assets
    make_device: DeviceFactory
    size: Size
    workdir: Path
    profile: str
    say: Callable[[str], None] = print
    devices: list[Device] = field(default_factory=list)

    def device(self, device_id: str) -> Device:
        """A new device (torn down when the scenario ends)."""
        dev = self.make_device(device_id)
        self.devices.append(dev)
        return dev


class Scenario(ABC):
    """One scenario (see the module docstring)."""

    name: ClassVar[str]
    title: ClassVar[str]
    invariants: ClassVar[tuple[str, ...]]
    in_ci: ClassVar[bool] = True
    """Run by ``hil run ci`` (``make hil``); a scenario too long for CI says False and
    runs by name (or with ``all``)."""

    @abstractmethod
    def run(self, ctx: RunContext, out: ScenarioReport) -> None:
        """Run, appending one check per invariant to ``out.checks``.

        Raises:
            HilError: the scenario could not be carried out (a set-up step failed).
        """


def bring_up(
    ctx: RunContext,
    dev: Device,
    *,
    labels: dict[str, str],
    tmpfs_mb: int | None = None,
    before_start: Callable[[Device], None] | None = None,
    **settings: Any,
) -> agentconf.AgentSettings:
    """Set the device up, write its agent.toml, enroll it, start its agent, and wait
    until the fleet sees it online and the robot gets decisions.

    Raises:
        HilError: a step failed or did not happen in time.
    """
    dev.setup()
    video, bundle = dev.stage_assets(ctx.assets)
    conf = agentconf.AgentSettings(
        device_id=dev.device_id, video=video, bundle_dir=bundle, profile=ctx.profile, **settings
    )
    if tmpfs_mb is not None:
        dev.mount_tmpfs(dev.state_dir, tmpfs_mb)
    dev.write_file(dev.config_path, agentconf.render(conf).encode())
    token = ctx.fleet.enrollment_token(dev.device_id, labels, ctx.profile)
    dev.enroll(ctx.fleet.url, token)
    if before_start is not None:
        before_start(dev)
    dev.start_agent()
    try:
        wait_for(lambda: ctx.fleet.online(dev.device_id), 90, f"{dev.device_id} online")
        wait_for(lambda: len(dev.robot_messages()) >= 5, 60, f"decisions from {dev.device_id}")
    except HilError as exc:
        tail = dev.agent.tail(10) if dev.agent else ""
        raise DeviceError(dev.device_id, f"{exc}; agent log: {tail}") from exc
    return conf


def decisions_exactly_once(fleet: Fleet, dev: Device, until: float) -> IdComparison:
    """The device's decision log against the fleet's decisions of the device: every
    decision made up to ``until`` at the fleet once, and nothing the log does not hold."""
    mine = dev.decisions()
    cmp = compare_ids((d.id for d in mine), fleet.decision_ids(dev.device_id))
    due = {d.id for d in mine if d.decision_time <= until}
    cmp.missing = [i for i in cmp.missing if i in due]
    cmp.local = len(due)
    return cmp


def wait_drained(
    fleet: Fleet, dev: Device, since: float, timeout_s: float, *, health: bool = True
) -> float | None:
    """Seconds until the fleet holds every decision the device made before ``since``
    and (with ``health``) a gap-free run of health reports reaching past ``since``;
    None if not within ``timeout_s``."""

    def drained() -> bool:
        local = {d.id for d in dev.decisions() if d.decision_time <= since}
        if not local <= set(fleet.decision_ids(dev.device_id)):
            return False
        if not health:
            return True
        samples = fleet.health(dev.device_id)
        verdict_now = judge_health(samples, (since, since), 1.0)
        return verdict_now.figures["gaps"] == 0 and any(s.ts >= since for s in samples)

    try:
        return wait_for(drained, timeout_s, "the backlog to drain", poll_s=0.5)
    except HilError:
        return None


def exactly_once_check(
    invariant: str, fleet: Fleet, dev: Device, until: float, **more: Any
) -> Check:
    """The decision ids check (see :func:`decisions_exactly_once`), with extra figures."""
    cmp = decisions_exactly_once(fleet, dev, until)
    return verdict(invariant, cmp.exactly_once and cmp.local > 0, cmp.figures() | more,
                   cmp.detail() or ("" if cmp.local else "no decisions logged"))  # fmt: skip


def health_check(
    invariant: str, fleet: Fleet, dev: Device, window: tuple[float, float], interval_s: float
) -> Check:
    """Health reports complete over ``window`` (see :func:`hil.observe.judge_health`)."""
    v = judge_health(fleet.health(dev.device_id), window, interval_s)
    return verdict(invariant, v.ok, v.figures, v.detail)


def e2e_p99(dev: Device, start: float, end: float) -> tuple[float | None, int]:
    """p99 of the decision log's capture-to-decision latency (ms) over [start, end)."""
    values = [
        d.e2e_ms for d in dev.decisions() if start <= d.decision_time < end and d.e2e_ms is not None
    ]
    return rounded(percentile(values, 99)), len(values)


def robot_between(dev: Device, start: float, end: float) -> Sequence[Any]:
    """Robot messages that arrived in [start, end)."""
    return [m for m in dev.robot_messages() if start <= m.arrived < end]


def pause(ctx: RunContext, seconds: float, what: str) -> float:
    """Sleep ``seconds`` saying what for; returns the Unix time it ended."""
    ctx.say(f"{what} ({seconds:g} s)")
    time.sleep(seconds)
    return time.time()
