"""How one device report changes one device's record (pure).

The rules, whatever the rollout's phase:

- a device not yet assigned follows its online flag (``pending`` / ``offline``) and becomes
  ``done`` when it reports the target as active (it already had it, or got it some other
  way); its ``previous`` follows what it reports, so a revert restores what it really ran;
- an assigned device becomes ``installing``, then ``done`` (target active, install not
  running or failed) or ``failed`` (the install of the target failed or was rolled back);
- an install outcome counts only when it is about the target, so a stale failure of an
  earlier release never fails this rollout, and going offline never fails a device;
- a ``reverting`` (or ``stuck``) device becomes ``rolled-back`` when it reports what
  the revert returns it to (its previous bundle, or the release an operator named), and
  ``stuck`` (with the device's reason) when it reports that install failed;
- a ``shadow-assigned`` device becomes ``shadowing`` when it reports the target in its
  shadow slot (the health's shadow summary names it) or a committed shadow install of the
  target, ``failed`` when the install of the target failed, and ``done`` if it reports the
  target active (got it some other way). The shadow totals of the target are kept (the
  newest report's; a report without them keeps the last known).

Metrics under the target feed the gates; metrics under the previous bundle, reported
before the device was switched, are its baseline.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fleet_server.rollout.events import DeviceReport, InstallOutcome, ShadowReport
from fleet_server.rollout.state import (
    REVERT_OPEN,
    SHADOW,
    UNASSIGNED,
    UNSETTLED,
    BundleRef,
    DeviceState,
)
from fleet_server.rollout.state import DeviceStatus as S

REVERT_CLOCK_SLACK_S = 30.0
"""An install failure dated this long before the revert was sent still counts as its
answer (device clocks are bounded by ingest, not exact)."""


def revert_target(device: DeviceState) -> BundleRef | None:
    """What a revert returns ``device`` to: the release an operator named, else the
    bundle it ran before the rollout."""
    return device.revert_to or device.previous


def _revert_report(
    device: DeviceState,
    report: DeviceReport,
    active: BundleRef | None,
    now: float,
) -> dict[str, Any]:
    """A ``reverting`` or ``stuck`` device's change: ``rolled-back`` once it runs what
    the revert returns it to (a stuck one too: it came back late); ``stuck``, with the
    device's reason, when it reports that install failed after the revert was sent."""
    back = device.previous if device.shadow_only else revert_target(device)
    if active == back and (back is not None or device.shadow_only):
        return {"status": S.ROLLED_BACK, "settled_at": now, "deadline": None, "why": ""}
    if device.status is not S.REVERTING or back is None or device.shadow_only:
        return {}
    # the device's answer to the revert: a failed install of that release, or a directive
    # it refused before reading what it names (an agent that does not know the mode)
    about = (report.install_bundle, report.install_release) in (
        (back.name, back.release),
        (None, None),
    )
    answered = (
        report.install is InstallOutcome.FAILED
        and about
        and report.install_at is not None
        and device.reverted_at is not None
        and report.install_at >= device.reverted_at - REVERT_CLOCK_SLACK_S
    )
    if not answered:
        return {}
    why = f"the device could not revert to {back.name} release {back.release}"
    if report.install_reason:
        why += f": {report.install_reason}"
    return {"status": S.STUCK, "deadline": None, "why": why}


def reported_active(report: DeviceReport) -> BundleRef | None:
    """The bundle release the report names as active (None when it names none)."""
    if report.active_bundle is None or report.active_release is None:
        return None
    return BundleRef(report.active_bundle, report.active_release)


def shadow_is_target(shadow: ShadowReport | None, target: BundleRef, version: str | None) -> bool:
    """Whether ``shadow`` names the target: same bundle and release, or, when it gives no
    release, the target's ``version``."""
    if shadow is None or shadow.bundle != target.name:
        return False
    if shadow.release is not None:
        return shadow.release == target.release
    return version is not None and shadow.version == version


def apply_report(
    device: DeviceState,
    report: DeviceReport,
    target: BundleRef,
    now: float,
    version: str | None = None,
) -> DeviceState:
    """``device`` after ``report`` (at ``now``) in a rollout of ``target`` (whose version
    is ``version``; it matches a shadow summary that names no release)."""
    active = reported_active(report) or device.active
    about = (
        report.install is not None
        and report.install_bundle == target.name
        and report.install_release == target.release
    )
    outcome = report.install if about else None
    failed = about and (outcome is InstallOutcome.FAILED or report.auto_rollback)
    on_target = active == target and outcome not in (InstallOutcome.RUNNING, InstallOutcome.FAILED)
    shadow = report.shadow if shadow_is_target(report.shadow, target, version) else None
    shadow_up = shadow is not None or (
        about and report.install_shadow and outcome is InstallOutcome.COMMITTED
    )
    new: dict[str, Any] = {
        "online": report.online,
        "active": active,
        "reports": device.reports + 1,
        "last_report_at": now,
    }
    status = device.status
    if status in UNASSIGNED:
        if on_target:
            new |= {"status": S.DONE, "settled_at": now}
        else:
            new["status"] = S.PENDING if report.online else S.OFFLINE
            if active is not None and active != target:
                new["previous"] = active
    elif status in UNSETTLED or status is S.DONE:
        if failed:
            new |= {
                "status": S.FAILED,
                "install_failed": True,
                "auto_rollback": report.auto_rollback,
                "settled_at": now,
            }
        elif on_target and status is not S.DONE:
            new |= {"status": S.DONE, "settled_at": now}
        elif outcome is InstallOutcome.RUNNING and status is S.ASSIGNED:
            new["status"] = S.INSTALLING
    elif status is S.FAILED:
        if on_target and outcome is InstallOutcome.COMMITTED:
            new |= {
                "status": S.DONE,
                "install_failed": False,
                "auto_rollback": False,
                "settled_at": now,
            }
    elif status in SHADOW:
        if failed:
            new |= {"status": S.FAILED, "install_failed": True, "settled_at": now}
        elif on_target:
            new |= {"status": S.DONE, "settled_at": now}
        elif shadow_up and status is S.SHADOW_ASSIGNED:
            new["status"] = S.SHADOWING
    elif status in REVERT_OPEN:
        new |= _revert_report(device, report, active, now)

    if active == target and (on_target or about):
        new["worker_crashes"] = max(device.worker_crashes, report.worker_crashes)
        if report.p99_ms is not None:
            new["p99_ms"] = report.p99_ms
        if report.outcome_counts:
            new["outcomes"] = dict(report.outcome_counts)
    elif about and failed:
        new["worker_crashes"] = max(device.worker_crashes, report.worker_crashes)
    elif (
        active is not None
        and active == new.get("previous", device.previous)
        and (status in UNASSIGNED or status is S.ASSIGNED)
    ):
        if report.p99_ms is not None:
            new["base_p99_ms"] = report.p99_ms
        if report.outcome_counts:
            new["base_outcomes"] = dict(report.outcome_counts)
    if shadow is not None:
        new |= {"shadow_n": shadow.n, "shadow_agree": min(shadow.agree, shadow.n)}
        if shadow.p99_ms is not None:
            new["shadow_p99_ms"] = shadow.p99_ms
    return replace(device, **new)
