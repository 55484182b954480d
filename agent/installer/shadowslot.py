"""The shadow slot's rules and files: what a shadow install of a release means, staging
and checking a candidate beside the slot and renaming it in, emptying the slot, and what
recovery removes.

A shadow install never touches the A/B slots, the active-slot pointer, the commit
markers or the install-state file: the candidate is staged into
:func:`~agent.installer.shadow.shadow_staging_dir` (model files first, manifest last, as
:func:`agent.installer.slots.stage` does), loaded, warmed up and self-benchmarked there,
and only then renamed into :func:`~agent.installer.shadow.shadow_dir`. A candidate it
replaces is renamed aside first and removed after, so at every instant the slot is either
absent or holds a complete, checked bundle — a stop (crash, SIGKILL, power loss) at any
point leaves at most a staging or retired directory, which :func:`recover` removes.

``<name>/shadow-state.json`` records the shadow install in progress or its last result
(``status``: running, committed, noop, refused, failed, removed).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.installer import slots, store
from agent.installer.checks import BenchResult
from agent.installer.machine import BundleId, Plan, PlanKind
from agent.installer.shadow import (
    SHADOW_STATE_FILE,
    shadow_dir,
    shadow_retired_dir,
    shadow_staging_dir,
)
from agent.kernel.bundle import Bundle
from agent.kernel.durable import fsync_dir

log = logging.getLogger(__name__)

RUNNING = "running"
COMMITTED = "committed"
NOOP = "noop"
REFUSED = "refused"
FAILED = "failed"
REMOVED = "removed"
STEP_SHADOW = "shadow"
"""The step a shadow install ends on when it succeeds: running as shadow."""

Measure = Callable[[Bundle], BenchResult]
"""Load, warm up and self-benchmark a staged candidate (InstallError "load" or
"benchmark" when it does not pass)."""
Checkpoint = Callable[[str], None]

SHADOW_CHECKPOINTS = (
    # Named points of a shadow install, in order, passed to the installer's ``checkpoint``.
    "shadow-stage",  # state file says "stage"; nothing copied yet
    "shadow-stage-write",  # a file of the candidate half copied into the staging directory
    "shadow-check",  # staged; load, warm-up and self-benchmark about to run
    "shadow-publish",  # checked; the renames into the slot about to happen
    "shadow-done",
)


# -- rules (no files) -------------------------------------------------------------------


def plan_shadow(committed: BundleId | None, current: BundleId | None, target: BundleId) -> Plan:
    """Decide what running ``target`` as shadow means beside the ``committed`` bundle and
    the ``current`` candidate in the shadow slot.

    The committed release itself is a no-op (nothing to compare), and so is the candidate
    already in the slot; a release below the committed one, or the committed release with
    other content, is refused: the device could never switch to it (rollback
    protection). Anything else is staged into the shadow slot (replacing ``current``).
    """
    if committed is not None:
        if target.release == committed.release and target.digest == committed.digest:
            return Plan(
                PlanKind.NOOP,
                reason=f"release {target.release} is the active release: nothing to compare",
            )
        if target.release < committed.release:
            return Plan(
                PlanKind.REFUSE,
                reason=f"release {target.release} ({target.version}) is lower than the "
                f"committed release {committed.release} ({committed.version}): the device "
                "could never switch to it (rollback protection)",
            )
        if target.release == committed.release:
            return Plan(
                PlanKind.REFUSE,
                reason=f"release {target.release} is already committed with other content "
                f"(digest {committed.digest[:12]}, not {target.digest[:12]})",
            )
    if current is not None and current.digest == target.digest:
        return Plan(PlanKind.NOOP, reason=f"release {target.release} already runs as shadow")
    return Plan(PlanKind.INSTALL, slot=STEP_SHADOW)


def stale_reason(
    present: bool, candidate: BundleId | None, committed: BundleId | None
) -> str | None:
    """Why recovery must empty the shadow slot, or ``None`` to keep it: a slot that holds
    no loadable bundle, or a candidate that is not above the committed release (it was
    switched to, or the device moved past it)."""
    if present and candidate is None:
        return "slot-shadow holds no complete, loadable bundle"
    if candidate is not None and committed is not None and candidate.release <= committed.release:
        return (
            f"its release {candidate.release} is not above the committed release "
            f"{committed.release}: nothing to compare"
        )
    return None


# -- files -------------------------------------------------------------------------------


def held(state_dir: Path, name: str) -> BundleId | None:
    """The candidate in ``name``'s shadow slot (``None``: empty or not loadable)."""
    bundle = slots.inspect(shadow_dir(state_dir, name))
    return slots.bundle_id(bundle) if bundle is not None else None


def read_state(state_dir: Path, name: str) -> dict[str, Any]:
    """The shadow install-state file of ``name`` (``{}``: none, ``{"problem"}``: unreadable)."""
    raw, problem = store.read_json(shadow_dir(state_dir, name).parent / SHADOW_STATE_FILE)
    if raw is None:
        return {"problem": problem} if problem else {}
    raw.pop("format", None)
    return raw


def write_state(
    state_dir: Path,
    name: str,
    status: str,
    step: str,
    *,
    target: BundleId | None,
    source: str = "",
    reason: str = "",
) -> dict[str, Any]:
    """Record the shadow install of ``name`` (durably); returns what was written. A write
    that fails is logged, never raised: the slot, not this file, says what runs."""
    state = {
        "name": name,
        "status": status,
        "step": step,
        "slot": STEP_SHADOW,
        "target": target.as_dict() if target else None,
        "source": source,
        "reason": reason,
        "at": time.time(),
    }
    d = shadow_dir(state_dir, name).parent
    try:
        store.write_json(d / SHADOW_STATE_FILE, state)
    except OSError as exc:
        log.error("cannot record the shadow install of %s in %s: %s", name, d, exc)  # noqa: TRY400
    return state


def _remove_tree(path: Path) -> bool:
    """Remove directory ``path`` (absent: nothing to do); whether there was one.

    Raises:
        OSError: it could not be removed.
    """
    if not path.exists():
        return False
    shutil.rmtree(path)
    fsync_dir(path.parent)
    return True


def _retire(state_dir: Path, name: str) -> bool:
    """Rename the shadow slot aside (one atomic step: the hot path sees a complete slot
    or none), then remove it; whether there was one.

    Raises:
        OSError: a rename or removal failed.
    """
    slot, retired = shadow_dir(state_dir, name), shadow_retired_dir(state_dir, name)
    _remove_tree(retired)
    if not slot.exists():
        return False
    os.replace(slot, retired)
    fsync_dir(slot.parent)
    _remove_tree(retired)
    return True


def stage_and_check(
    src: Bundle,
    state_dir: Path,
    *,
    measure: Measure,
    checkpoint: Checkpoint,
    on_step: Callable[[str], None],
) -> tuple[Bundle, BenchResult]:
    """Stage ``src`` beside the shadow slot, load, warm up and self-benchmark it there,
    then rename it into the slot (replacing the candidate there). ``on_step`` is called
    with "stage", "load" as each starts. Returns the bundle as staged and the figures.

    On any failure the staging directory is removed and the slot is emptied (the
    candidate there was superseded by this one).

    Raises:
        InstallError: step "stage", "load" or "benchmark".
        OSError: a rename or removal failed (the caller reports it at "stage").
    """
    name = src.manifest.name
    staging = shadow_staging_dir(state_dir, name)
    try:
        on_step("stage")
        checkpoint("shadow-stage")
        _remove_tree(staging)
        staged = slots.stage(src, staging, progress=lambda _f, _n: checkpoint("shadow-stage-write"))
        on_step("load")
        checkpoint("shadow-check")
        bench = measure(staged)
        checkpoint("shadow-publish")
        _retire(state_dir, name)
        os.replace(staging, shadow_dir(state_dir, name))
        fsync_dir(staging.parent)
    except BaseException:
        _clean_after_failure(state_dir, name)
        raise
    checkpoint("shadow-done")
    return staged, bench


def _clean_after_failure(state_dir: Path, name: str) -> None:
    try:
        _remove_tree(shadow_staging_dir(state_dir, name))
    except OSError as exc:
        log.error("shadow install of %s: cannot remove its staging: %s", name, exc)  # noqa: TRY400
    try:
        _retire(state_dir, name)  # superseded by the candidate that failed
    except OSError as exc:
        log.error("shadow install of %s: cannot empty the slot: %s", name, exc)  # noqa: TRY400


def empty(state_dir: Path, name: str) -> BundleId | None:
    """Empty ``name``'s shadow slot (and any staging left); the candidate removed.

    Raises:
        OSError: it could not be removed.
    """
    candidate = held(state_dir, name)
    _remove_tree(shadow_staging_dir(state_dir, name))
    _retire(state_dir, name)
    return candidate


def recover(state_dir: Path, name: str, committed: BundleId | None) -> list[str]:
    """After a stop: remove a staging or retired directory left behind, empty a slot that
    :func:`stale_reason` condemns, and mark an interrupted shadow install failed. Returns
    notes on what it did (empty: nothing to do). Idempotent; the caller holds the lock.

    Raises:
        OSError: something could not be removed or written.
    """
    notes = []
    if _remove_tree(shadow_staging_dir(state_dir, name)):
        notes.append("removed a half-staged shadow candidate")
    if _remove_tree(shadow_retired_dir(state_dir, name)):
        notes.append("removed a replaced shadow candidate")
    slot = shadow_dir(state_dir, name)
    candidate = held(state_dir, name)
    why = stale_reason(slots.is_present(slot), candidate, committed)
    if why is not None:
        _retire(state_dir, name)
        notes.append(f"emptied the shadow slot: {why}")
    state = read_state(state_dir, name)
    if state.get("status") == RUNNING:
        step = str(state.get("step") or "stage")
        raw_target = state.get("target")
        try:
            target = BundleId.from_dict(raw_target) if raw_target is not None else None
        except (TypeError, ValueError):
            target = None
        reason = f"interrupted during {step} (restart or power loss)"
        write_state(
            state_dir,
            name,
            FAILED,
            step,
            target=target,
            source=str(state.get("source", "")),
            reason=reason,
        )
        notes.append(f"the shadow install was {reason}")
    if notes:
        log.warning("recovering the shadow slot of %s: %s", name, "; ".join(notes))
    return notes
