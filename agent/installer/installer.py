"""The installer's shell: files, locks, the pool and the clock around :mod:`.machine`.

An install runs stage → load + warm-up → self-benchmark → switch → health window →
commit under a per-bundle lock, writing the journal before each step. A failure at any
step puts the previous slot back, empties the new one, records and reports the step and
reason, and raises :class:`InstallError`. :meth:`Installer.recover` at start finishes or
undoes whatever a stop (crash, SIGKILL, power loss) interrupted. States, files and what
a power cut at each point leads to: docs/install-states.md.

``checkpoint`` (constructor) is called with the name of each point in
:data:`~agent.installer.result.CHECKPOINTS` as the install reaches it; the power-loss
tests use it to kill the process there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.installer import (
    checks,
    health,
    machine,
    recovery,
    shadowinstall,
    shadowslot,
    slots,
    store,
    view,
)
from agent.installer.config import InstallerConfig
from agent.installer.errors import InstallError
from agent.installer.machine import SLOTS, BundleId, Journal, Marker, Status, Step
from agent.installer.result import InstallResult, Report
from agent.installer.view import SlotStatus
from agent.kernel.bundle import Bundle, load_bundle
from agent.kernel.errors import BundleError
from agent.wire.base import slug
from runtime import PoolConfig

log = logging.getLogger(__name__)

Measure = Callable[[Bundle, int, float], checks.BenchResult]
"""``measure(staged, runs, run_timeout_s)``: load and warm up a staged bundle, then run
its sample ``runs`` times (:func:`checks.measure_in_pool` does it here).

Raises:
    InstallError: step "load" or "benchmark", as :func:`checks.open_trial` and
        :func:`checks.self_benchmark`."""


class Installer:
    """Installs verified bundles into A/B slots under ``<state_dir>/bundles``."""

    def __init__(
        self,
        state_dir: Path,
        *,
        profile_name: str,
        on_report: Callable[[Report], None] | None = None,
        config: InstallerConfig | None = None,
        pool_config: PoolConfig | None = None,
        checkpoint: Callable[[str], None] | None = None,
        measure: Measure | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.root = self.state_dir / "bundles"
        self.profile_name = profile_name
        self.on_report = on_report
        self.config = config or InstallerConfig()
        self.pool_config = pool_config or PoolConfig(workers=1, pin=False)
        self.measure = measure
        """Load, warm up and self-benchmark a staged bundle elsewhere (the agent's hot
        path, where the model will run, at its priority); used when the caller watches
        the health window with its own probe. None: in a one-worker pool here."""
        self._checkpoint = checkpoint
        self.report_errors = 0

    # -- helpers -----------------------------------------------------------------------
    def _cp(self, point: str) -> None:
        if self._checkpoint is not None:
            self._checkpoint(point)

    def _dir(self, name: str) -> Path:
        try:
            slug(name, "bundle name")
        except ValueError as exc:
            raise InstallError(Step.PLAN.value, str(exc), name) from None
        return self.root / name

    def names(self) -> list[str]:
        """Bundle names with a directory under ``bundles/``."""
        if not self.root.is_dir():
            return []
        out = []
        for p in sorted(self.root.iterdir()):
            try:
                out.append(slug(p.name, "bundle name"))
            except ValueError:
                log.warning("ignoring %s: not a bundle name", p)
        return [n for n in out if (self.root / n).is_dir()]

    def _report(self, j: Journal, active: BundleId | None, **extra: Any) -> Report:
        report: Report = {
            "name": j.name,
            "status": j.status.value,
            "step": j.step.value,
            "reason": j.reason,
            "source": j.source,
            "slot": j.slot,
            "target": j.target.as_dict() if j.target else None,
            "active": active.as_dict() if active else None,
            "at": time.time(),
            **extra,
        }
        if self.on_report is not None:
            try:
                self.on_report(report)
            except Exception:
                self.report_errors += 1
                log.exception("the install report callback failed (%d so far)", self.report_errors)
        return report

    def _finish(self, d: Path, j: Journal, status: Status, step: Step, reason: str) -> Journal:
        j = machine.finished(j, status, step, reason, time.time())
        try:
            store.write_journal(d, j)
        except OSError as exc:
            log.error("cannot record %s of %s in %s: %s", status.value, j.name, d, exc)  # noqa: TRY400
        return j

    def _enter(self, d: Path, j: Journal, step: Step) -> Journal:
        j = j.then(status=Status.RUNNING, step=step, reason="")
        store.write_journal(d, j)
        self._cp(step.value)
        return j

    def _mark(self, d: Path, slot: str, digest: str) -> None:
        seq = 1 + max((m.seq for s in SLOTS if (m := store.read_marker(d, s))), default=0)
        store.write_marker(d, slot, Marker(seq, digest))

    def _lock(self, d: Path, name: str, step: Step) -> store.NameLock:
        d.mkdir(parents=True, exist_ok=True)
        lock = store.NameLock(d)
        if not lock.acquire(self.config.lock_timeout_s):
            raise InstallError(step.value, "another install or rollback of it is running", name)
        return lock

    # -- install -----------------------------------------------------------------------
    def install(
        self,
        bundle_dir: Path,
        *,
        source: str,
        health_probe: health.HealthProbe | None = None,
        health_window_s: float | None = None,
        revert: bool = False,
    ) -> InstallResult:
        """Install the (already verified) bundle in ``bundle_dir``.

        ``source`` says where it came from (recorded and reported). ``health_probe``
        watches the new bundle after the switch (default: run it in the trial pool).
        ``revert``: the fleet signed a revert to this release, which may be below the
        committed one (:func:`machine.plan_install`).

        Raises:
            InstallError: refused or failed at a step; the previous slot is active again.
        """
        try:
            src = load_bundle(Path(bundle_dir))
        except BundleError as exc:
            j = Journal("", Status.FAILED, Step.STAGE, source=source, reason=str(exc))
            self._report(j, None)
            raise InstallError(Step.STAGE.value, f"the bundle does not load: {exc}") from exc
        name = src.manifest.name
        d = self._dir(name)
        try:
            lock = self._lock(d, name, Step.PLAN)
        except OSError as exc:
            raise InstallError(Step.PLAN.value, f"{d}: {exc.strerror or exc}", name) from exc
        try:
            self._recover_locked(name, d)
            window = self.config.health_window_s if health_window_s is None else health_window_s
            return self._install_locked(d, src, source, health_probe, window, revert)
        except OSError as exc:  # recovery or planning; the steps turn their own
            raise InstallError(
                Step.PLAN.value, f"{exc.strerror or exc} ({exc.filename})", name
            ) from exc
        finally:
            lock.release()

    def _install_locked(
        self,
        d: Path,
        src: Bundle,
        source: str,
        probe: health.HealthProbe | None,
        window: float,
        revert: bool = False,
    ) -> InstallResult:
        name = src.manifest.name
        target = slots.bundle_id(src)
        pointer, _ = store.read_pointer(d)
        facts = view.slot_facts(d)
        good = machine.last_known_good(pointer, facts)[0]
        committed = facts[good].bundle if good is not None else None
        old, _ = store.read_journal(d)
        j = Journal(
            name,
            Status.RUNNING,
            Step.PLAN,
            target=target,
            source=source,
            history=old.history if old else (),
        )
        try:
            src.check_profile(self.profile_name)
            plan = machine.plan_install(pointer, committed, target, revert=revert)
        except BundleError as exc:
            plan = machine.Plan(machine.PlanKind.REFUSE, reason=exc.reason)
        if plan.kind is machine.PlanKind.NOOP and good is not None and committed is not None:
            j = self._finish(d, j.then(slot=good), Status.NOOP, Step.PLAN, plan.reason)
            self._report(j, committed)
            return InstallResult("noop", committed, good, slots.slot_dir(d, good))
        if plan.kind is not machine.PlanKind.INSTALL or plan.slot is None:
            j = self._finish(d, j, Status.REFUSED, Step.PLAN, plan.reason)
            self._report(j, committed)
            raise InstallError(Step.PLAN.value, plan.reason, name)
        return self._run_steps(d, src, j.then(slot=plan.slot), pointer, committed, probe, window)

    def _run_steps(
        self,
        d: Path,
        src: Bundle,
        j: Journal,
        pointer: machine.Pointer | None,
        committed: BundleId | None,
        probe: health.HealthProbe | None,
        window: float,
    ) -> InstallResult:
        name, slot, cfg = src.manifest.name, j.slot or "", self.config
        path = slots.slot_dir(d, slot)
        step = Step.STAGE
        trial: checks.Trial | None = None
        try:
            j = self._enter(d, j, step)
            store.remove_marker(d, slot)  # from here on the slot is no rollback target
            staged = slots.stage(src, path, progress=lambda _f, _n: self._cp("stage-write"))
            step = Step.LOAD
            j = self._enter(d, j, step)
            if self.measure is not None and probe is not None:
                # where the model will run; the caller watches it there too
                bench = self.measure(staged, cfg.benchmark_runs, cfg.run_timeout_s)
                step = Step.BENCHMARK
                j = self._enter(d, j, step)
                watch: health.HealthProbe = probe
            else:
                trial = checks.open_trial(staged, self.pool_config, timeout_s=cfg.run_timeout_s)
                step = Step.BENCHMARK
                j = self._enter(d, j, step)
                bench = checks.self_benchmark(trial, runs=cfg.benchmark_runs)
                watch = probe if probe is not None else checks.PoolProbe(trial)
                if probe is not None:  # the caller watches the bundle where it really runs
                    trial.close()
                    trial = None
            step = Step.SWITCH
            j = self._enter(d, j, step)
            store.write_pointer(
                d, machine.switched(pointer, slot), before_replace=lambda: self._cp("switch-write")
            )
            step = Step.HEALTH
            j = self._enter(d, j, step)
            limits = health.HealthLimits(
                src.manifest.latency_budget_ms, cfg.max_worker_crashes, cfg.max_inference_errors
            )
            verdict = self._health(watch, limits, window, name)
            step = Step.COMMIT
            j = self._enter(d, j, step)
            store.write_pointer(
                d, machine.committed_to(slot), before_replace=lambda: self._cp("commit-write")
            )
            self._cp("commit-marker")
            self._mark(d, slot, src.digest)
        except InstallError as exc:
            self._undo(d, j, step, exc.reason, pointer, committed)
            raise
        except OSError as exc:
            reason = f"{exc.strerror or exc} ({exc.filename or 'file'})"
            self._undo(d, j, step, reason, pointer, committed)
            raise InstallError(step.value, reason, name) from exc
        except Exception as exc:
            log.exception("install of %s: unexpected error at %s", name, step.value)
            self._undo(d, j, step, f"unexpected error: {exc!r}", pointer, committed)
            raise InstallError(step.value, f"unexpected error: {exc!r}", name) from exc
        finally:
            if trial is not None:
                trial.close()
        j = self._finish(d, j, Status.COMMITTED, Step.COMMIT, "")
        counters = verdict.counters.as_dict() if verdict.counters else None
        self._report(
            j, j.target, benchmark_p95_ms=bench.p95_ms, health=counters, health_idle=verdict.idle
        )
        self._cp("done")
        assert j.target is not None  # noqa: S101 - set by _install_locked
        return InstallResult("committed", j.target, slot, path, bench, counters)

    def _health(
        self, probe: health.HealthProbe, limits: health.HealthLimits, window: float, name: str
    ) -> health.HealthVerdict:
        poll = min(self.config.health_poll_s, max(window, 0.05))
        verdict = health.run_window(
            probe, limits, window_s=window, poll_s=poll, grace_s=self.config.run_timeout_s
        )
        if not verdict.ok:
            raise InstallError(Step.HEALTH.value, f"health window: {verdict.reason}", name)
        if verdict.idle:
            log.warning("%s committed on an idle line: %s", name, verdict.reason)
        return verdict

    def _undo(
        self,
        d: Path,
        j: Journal,
        step: Step,
        reason: str,
        before: machine.Pointer | None,
        committed: BundleId | None,
    ) -> None:
        """Put the previous slot back after ``step`` failed, empty the new one, report."""
        self._cp("rollback")
        restore = machine.pointer_after_failure(step, before)
        notes = []
        if restore is not None:
            try:
                store.write_pointer(d, restore, before_replace=lambda: self._cp("rollback-write"))
            except OSError as exc:
                log.error("cannot restore the pointer in %s: %s", d, exc)  # noqa: TRY400
                notes.append(f"pointer not restored ({exc.strerror}); recovery will")
        try:
            if j.slot is not None and store.read_marker(d, j.slot) is None:
                slots.wipe(slots.slot_dir(d, j.slot))  # (a marked slot was never touched)
        except OSError as exc:
            log.error("cannot empty slot-%s in %s: %s", j.slot, d, exc)  # noqa: TRY400
            notes.append(f"slot-{j.slot} not emptied ({exc.strerror})")
        full = "; ".join([reason, *notes])
        log.warning("install of %s failed at %s: %s", j.name, step.value, full)
        j = self._finish(d, j, Status.FAILED, step, full)
        self._report(j, committed, rolled_back=restore is not None)

    # -- rollback by hand, recovery ---------------------------------------------------
    def rollback(self, name: str | None = None) -> InstallResult:
        """Return to the previous slot (committed before, still intact) by hand.

        Raises:
            InstallError: step "rollback" — no such bundle, or no previous slot.
        """
        names = self.names()
        if name is None:
            if len(names) != 1:
                which = ", ".join(names) or "none installed"
                raise InstallError(Step.ROLLBACK.value, f"name the bundle ({which})")
            name = names[0]
        d = self._dir(name)
        if name not in names:
            raise InstallError(Step.ROLLBACK.value, "no such bundle installed", name)
        lock = self._lock(d, name, Step.ROLLBACK)
        try:
            self._recover_locked(name, d)
            pointer, _ = store.read_pointer(d)
            facts = view.slot_facts(d)
            current = machine.last_known_good(pointer, facts)[0]
            plan = machine.plan_rollback(pointer, facts)
            target = facts[plan.slot].bundle if plan.slot else None
            old, _ = store.read_journal(d)
            j = Journal(
                name,
                Status.RUNNING,
                Step.ROLLBACK,
                slot=plan.slot,
                target=target,
                source="rollback",
                history=old.history if old else (),
            )
            cur = facts[current].bundle if current else None
            if plan.slot is None or target is None:
                j = self._finish(d, j, Status.REFUSED, Step.ROLLBACK, plan.reason)
                self._report(j, cur)
                raise InstallError(Step.ROLLBACK.value, plan.reason, name)
            store.write_journal(d, j)
            self._cp("rollback")
            store.write_pointer(
                d,
                machine.committed_to(plan.slot),
                before_replace=lambda: self._cp("rollback-write"),
            )
            self._mark(d, plan.slot, target.digest)
            j = self._finish(d, j, Status.ROLLED_BACK, Step.ROLLBACK, "")
            self._report(j, target)
            return InstallResult("rolled-back", target, plan.slot, slots.slot_dir(d, plan.slot))
        except OSError as exc:
            raise InstallError(Step.ROLLBACK.value, f"{exc.strerror or exc}", name) from exc
        finally:
            lock.release()

    def recover(self) -> list[Report]:
        """Finish or undo what a stop interrupted, for every bundle; never raises for a
        damaged state file (it falls back to the last known good slot)."""
        reports = []
        for name in self.names():
            d = self.root / name
            lock = store.NameLock(d)
            if not lock.acquire(0.0):
                log.info("%s: an install is running; not recovering it", name)
                continue
            try:
                report = self._recover_locked(name, d)
            except OSError as exc:
                log.error("cannot recover %s: %s", name, exc)  # noqa: TRY400
                j = Journal(name, Status.FAILED, Step.RECOVER, reason=str(exc))
                report = self._report(j, None)
            finally:
                lock.release()
            if report is not None:
                reports.append(report)
        return reports

    def _recover_locked(self, name: str, d: Path) -> Report | None:
        done = recovery.recover_name(name, d)
        report = self._report(done[0], done[1], recovered=True) if done else None
        shadowslot.recover(self.state_dir, name, self._committed(d)[1])
        return report

    def _committed(self, d: Path) -> tuple[str | None, BundleId | None]:
        """The last known good slot of a bundle directory and what it holds."""
        pointer, _ = store.read_pointer(d)
        facts = view.slot_facts(d)
        good = machine.last_known_good(pointer, facts)[0]
        return good, facts[good].bundle if good is not None else None

    # -- the shadow slot ------------------------------------------------------------------
    def install_shadow(self, bundle_dir: Path, *, source: str) -> InstallResult:
        """Install the (already verified) bundle in ``bundle_dir`` into its shadow slot:
        stage, load and warm up, self-benchmark — the checks of :meth:`install` before its
        switch — and never switch: the A/B slots, pointer, markers and install-state
        file stay as they are (:mod:`.shadowslot`). Outcome "committed" (running as
        shadow) or "noop" (the active release, or the candidate already in the slot).

        Raises:
            InstallError: refused ("plan": a release the device could never switch to,
                or another profile's bundle) or failed at "stage", "load" or
                "benchmark"; the shadow slot is empty then.
        """
        try:
            src = load_bundle(Path(bundle_dir))
        except BundleError as exc:
            state = {"name": "", "status": "failed", "step": "stage", "reason": str(exc)}
            shadowinstall.report(self, state, None)
            raise InstallError(Step.STAGE.value, f"the bundle does not load: {exc}") from exc
        name = src.manifest.name
        d = self._dir(name)
        try:
            lock = self._lock(d, name, Step.PLAN)
        except OSError as exc:
            raise InstallError(Step.PLAN.value, f"{d}: {exc.strerror or exc}", name) from exc
        try:
            self._recover_locked(name, d)
            return shadowinstall.run(self, d, src, source)
        except OSError as exc:
            raise InstallError(
                Step.PLAN.value, f"{exc.strerror or exc} ({exc.filename})", name
            ) from exc
        finally:
            lock.release()

    def clear_shadow(self, name: str) -> BundleId | None:
        """Empty ``name``'s shadow slot (a switch or a revert ended the comparison);
        the candidate removed (``None``: the slot was empty).

        Raises:
            InstallError: step "shadow" — the slot could not be emptied, or another
                install of ``name`` holds its lock.
        """
        d = self._dir(name)
        if not d.is_dir():
            return None
        lock = self._lock(d, name, Step.PLAN)
        try:
            removed = shadowslot.empty(self.state_dir, name)
        except OSError as exc:
            raise InstallError(
                shadowslot.STEP_SHADOW,
                f"cannot empty the shadow slot: {exc.strerror or exc}",
                name,
            ) from exc
        finally:
            lock.release()
        if removed is not None:
            shadowslot.write_state(
                self.state_dir,
                name,
                shadowslot.REMOVED,
                shadowslot.STEP_SHADOW,
                target=removed,
                reason="emptied: a switch or revert ended the comparison",
            )
        return removed

    def measure_staged(self, staged: Bundle) -> checks.BenchResult:
        """Load, warm up and self-benchmark a staged bundle where :meth:`install` would
        (the caller's ``measure``, else a one-worker pool here).

        Raises:
            InstallError: step "load" or "benchmark".
        """
        cfg = self.config
        if self.measure is not None:
            return self.measure(staged, cfg.benchmark_runs, cfg.run_timeout_s)
        return checks.measure_in_pool(
            staged, self.pool_config, runs=cfg.benchmark_runs, timeout_s=cfg.run_timeout_s
        )

    def committed(self, name: str) -> BundleId | None:
        """The last known good bundle of ``name`` (``None``: none installed)."""
        return self._committed(self._dir(name))[1]

    def checkpoint(self, point: str) -> None:
        """Pass ``point`` to the ``checkpoint`` callback (the power-loss tests' hook)."""
        self._cp(point)

    def shadow(self, name: str) -> BundleId | None:
        """The candidate in ``name``'s shadow slot (``None``: empty)."""
        return shadowslot.held(self.state_dir, self._dir(name).name)

    # -- what to run, and what is there -------------------------------------------------
    def active_bundle(self, name: str) -> Path | None:
        """The slot directory the agent should load for ``name``: the trial while an
        install's health window runs, else the last known good; ``None``: none."""
        return view.active_path(self._dir(name))

    def status(self) -> list[SlotStatus]:
        """Every slot of every bundle, with its state and the bundle's last result."""
        return [st for name in self.names() for st in view.name_status(name, self.root / name)]
