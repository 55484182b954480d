"""A shadow install's steps and reports, run by :meth:`Installer.install_shadow` under the
bundle's lock: plan (:func:`~agent.installer.shadowslot.plan_shadow`), stage, load and
warm up, self-benchmark, rename into the shadow slot — never a switch.

Each result is recorded in ``shadow-state.json`` and handed to the installer's
``on_report`` as a report with ``"mode": "shadow"`` and ``"slot": "shadow"`` (status
committed: staged, checked and running as shadow; noop; refused; failed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agent.installer import shadowslot, slots
from agent.installer.checks import BenchResult
from agent.installer.errors import InstallError
from agent.installer.machine import BundleId, Plan, PlanKind, Step
from agent.installer.result import InstallResult, Report
from agent.installer.shadow import SHADOW_SLOT, shadow_dir
from agent.kernel.bundle import Bundle
from agent.kernel.errors import BundleError


class Installer(Protocol):
    """What a shadow install needs of :class:`agent.installer.installer.Installer` (a
    protocol, so that this module does not import the installer that calls it)."""

    state_dir: Path
    profile_name: str
    on_report: Callable[[Report], None] | None
    report_errors: int

    def checkpoint(self, point: str) -> None: ...
    def committed(self, name: str) -> BundleId | None: ...
    def measure_staged(self, staged: Bundle) -> BenchResult: ...


log = logging.getLogger(__name__)


def run(inst: Installer, d: Path, src: Bundle, source: str) -> InstallResult:
    """Plan and, unless it is a no-op or refused, stage and check ``src`` into its
    shadow slot. ``d`` is the bundle's directory, whose lock the caller holds.

    Raises:
        InstallError: refused at "plan", or failed at "stage", "load" or "benchmark"
            (the shadow slot is empty then).
    """
    name, sd = src.manifest.name, inst.state_dir
    target = slots.bundle_id(src)
    committed = inst.committed(name)
    try:
        src.check_profile(inst.profile_name)
        plan = shadowslot.plan_shadow(committed, shadowslot.held(sd, name), target)
    except BundleError as exc:
        plan = Plan(PlanKind.REFUSE, reason=exc.reason)
    path = shadow_dir(sd, name)
    if plan.kind is not PlanKind.INSTALL:
        status = shadowslot.NOOP if plan.kind is PlanKind.NOOP else shadowslot.REFUSED
        state = shadowslot.write_state(
            sd, name, status, Step.PLAN.value, target=target, source=source, reason=plan.reason
        )
        report(inst, state, committed)
        if plan.kind is PlanKind.NOOP:
            return InstallResult("noop", target, SHADOW_SLOT, path)
        raise InstallError(Step.PLAN.value, plan.reason, name)
    step = [Step.STAGE.value]

    def entered(s: str) -> None:
        step[0] = s
        shadowslot.write_state(sd, name, shadowslot.RUNNING, s, target=target, source=source)

    try:
        _, bench = shadowslot.stage_and_check(
            src, sd, measure=inst.measure_staged, checkpoint=inst.checkpoint, on_step=entered
        )
    except InstallError as exc:
        _failed(inst, name, exc.step, exc.reason, target, source, committed)
        raise
    except OSError as exc:
        reason = f"{exc.strerror or exc} ({exc.filename or 'file'})"
        _failed(inst, name, step[0], reason, target, source, committed)
        raise InstallError(step[0], reason, name) from exc
    except Exception as exc:
        log.exception("shadow install of %s: unexpected error at %s", name, step[0])
        reason = f"unexpected error: {exc!r}"
        _failed(inst, name, step[0], reason, target, source, committed)
        raise InstallError(step[0], reason, name) from exc
    state = shadowslot.write_state(
        sd, name, shadowslot.COMMITTED, shadowslot.STEP_SHADOW, target=target, source=source
    )
    report(inst, state, committed, benchmark_p95_ms=bench.p95_ms)
    log.info("%s release %d runs as shadow beside %s", name, target.release, committed)
    return InstallResult("committed", target, SHADOW_SLOT, path, bench)


def _failed(
    inst: Installer,
    name: str,
    step: str,
    reason: str,
    target: BundleId,
    source: str,
    committed: BundleId | None,
) -> None:
    log.warning("shadow install of %s failed at %s: %s", name, step, reason)
    state = shadowslot.write_state(
        inst.state_dir,
        name,
        shadowslot.FAILED,
        step,
        target=target,
        source=source,
        reason=reason,
    )
    report(inst, state, committed)


def report(
    inst: Installer, state: dict[str, Any], committed: BundleId | None, **extra: Any
) -> Report:
    """Hand a shadow install's result to the installer's ``on_report`` (a failing
    callback is logged and counted, never raised)."""
    out: Report = {
        **state,
        "slot": SHADOW_SLOT,
        "mode": SHADOW_SLOT,
        "active": committed.as_dict() if committed else None,
        "at": time.time(),
        **extra,
    }
    if inst.on_report is not None:
        try:
            inst.on_report(out)
        except Exception:
            inst.report_errors += 1
            log.exception("the install report callback failed (%d so far)", inst.report_errors)
    return out
