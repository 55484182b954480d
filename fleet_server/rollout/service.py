"""The rollout controller's I/O shell: create, show and steer rollouts, and the
reconciliation loop that drives the pure machine (:mod:`fleet_server.rollout.machine`).

State lives in the fleet database: one ``rollouts`` row per rollout (the machine's state as
JSON, saved compare-and-swap on ``revision``) and one ``rollout_devices`` row per selected
device (``wave``: the 1-based wave that assigned it, 0 while unassigned). Every change is
saved before its commands are carried out, so two fleet-server processes never both send
what one step decided: the one whose save is refused reloads and steps again (once).

Commands: :class:`AssignDirective` becomes a signed directive published retained on the
device's directive topic, with a message expiry equal to the directive's validity (its
``mode`` goes into the directive: ``shadow`` puts the target in the shadow slot);
:class:`RevertDirective` a directive for the release the device returns to: ``active``
when its reported previous slot holds it (the agent takes that as a rollback to the
slot), ``revert`` otherwise (the agent fetches and installs it like any assign, though
it is lower than what it runs: e.g. the bundle it was set up with), or, for a device that
never switched (shadow only), an empty retained payload that clears the directive. A
revert that cannot be sent (the release is not published, the bundle is not for the
device's profile) is stepped back into the machine as :class:`RevertRefused`: the device
is ``stuck`` with why. :class:`Notify` becomes a log line and an event of kind
``rollout`` whose ``device_id`` is the rollout id (with ``by``: the operator, where one
acted). A command that fails is logged and counted; the rollout's timeouts then pause it.

A new rollout is refused (:class:`RolloutOverlap`, naming the other rollout) when another
active rollout holds any device it selects: every device of a running one, the
reverting and stuck ones of one rolling back. :meth:`RolloutService.resolve` is the
operator's way out of a stuck revert: retry, assign a named release, accept.

With replicas (docs/scaling-replicas.md) only the leader runs :meth:`tick`, and it is
fenced: each save of the reconciler checks, in its transaction, that the stored epoch of
the ``rollouts`` role is still the one of this replica's term
(:func:`fleet_server.db.cluster.check_epoch`), and each directive is published only while
the leader's lease is fresh (``leader.check()``). A fenced save saves and publishes
nothing (:class:`NotLeader`); a lease that runs out stops the commands left, counted in
:attr:`ServiceStats.fenced`. Operator actions (:meth:`act`, :meth:`create`) work on any
replica: compare-and-swap saves, not fenced.

A rollout with an accuracy gate also gets a :class:`LabelReport` on each tick where the
review labels changed (:func:`fleet_server.rollout.collect.label_counts`; the versions the
devices ran before are looked up in the repository by release).
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from agent.kernel.errors import BundleError
from agent.wire import topics
from agent.wire.manifest import parse_manifest
from fleet_server.cluster import Leadership, NotLeader
from fleet_server.db import RolloutConflict, store
from fleet_server.db.cluster import ROLLOUTS_ROLE, EpochMismatch, check_epoch
from fleet_server.db.rollouts import rollouts_on_devices
from fleet_server.db.store import EventRecord, RolloutDevice, RolloutRecord
from fleet_server.errors import DirectiveError
from fleet_server.repository import KeyStore, Repository, issue_directive
from fleet_server.repository.director import DEFAULT_EXPIRY
from fleet_server.rollout.collect import collect, health_facts, label_counts
from fleet_server.rollout.errors import RolloutError
from fleet_server.rollout.events import (
    MODE_ACTIVE,
    Approve,
    AssignDirective,
    Cancel,
    Command,
    DeviceReport,
    LabelReport,
    Notify,
    Operator,
    Pause,
    Resolve,
    Resume,
    RevertDirective,
    RevertRefused,
    Rollback,
)
from fleet_server.rollout.machine import outstanding, refusal, step, step_all
from fleet_server.rollout.plan import DeviceInfo, plan
from fleet_server.rollout.serialize import from_dict, to_dict
from fleet_server.rollout.spec import RolloutSpec, parse_spec
from fleet_server.rollout.state import REVERT_OPEN, TERMINAL, BundleRef, Phase, Rollout
from fleet_server.rollout.view import view as _view

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes, bool, int | None], None]
"""(topic, payload, retain, message expiry in seconds or None): hand a message to MQTT."""

ACTIONS = ("pause", "resume", "approve", "cancel", "rollback")
NOTIFY_EVENT = "rollout"
RUNNING_PHASES = tuple(p.value for p in Phase if p not in TERMINAL)
MODE_REVERT = "revert"
"""The directive mode of a revert to a release the device no longer has in a slot: it
fetches and installs it like any assign, though it is lower than the one it runs."""


class RolloutOverlap(RolloutError):
    """A new rollout selects devices that another active rollout holds (every device of
    a running one; the reverting and stuck devices of one rolling back).

    Attributes:
        other: the other rollout's id.
        devices: the held devices it selects (sorted).
    """

    def __init__(self, other: str, phase: str, devices: builtins.list[str]) -> None:
        self.other = other
        self.devices = devices
        shown = ", ".join(devices[:5]) + (
            f" and {len(devices) - 5} more" if len(devices) > 5 else ""
        )
        super().__init__(
            "selector",
            f"{len(devices)} selected devices are held by rollout {other} ({phase}): {shown}; "
            f"wait for it to end, or cancel it (or resolve its stuck devices) first",
        )


class RolloutNotFound(RolloutError):
    """No rollout has this id.

    Attributes:
        rollout_id: the id asked for.
    """

    def __init__(self, rollout_id: str) -> None:
        self.rollout_id = rollout_id
        super().__init__("rollout_id", f"no rollout {rollout_id!r}")


@dataclass
class ServiceStats:
    """Counters of one service: loop passes, saves refused (another process saved
    first), saves and publishes fenced (this replica no longer leads), directives
    published, commands and rollouts that failed."""

    ticks: int = 0
    resent: int = 0
    """Directives sent again at the start of a term (:func:`outstanding`)."""
    conflicts: int = 0
    fenced: int = 0
    directives: int = 0
    command_errors: int = 0
    tick_errors: int = 0


class RolloutService:
    """Rollouts over the fleet database ``engine`` and the bundle repository ``repo``.

    Args:
        keystore: holds the director key that signs directives.
        publish: hands a message to the broker (see :data:`Publish`); may raise.
        clock: POSIX time; the machine never reads one itself.
        directive_expiry: validity of each directive, and the expiry of its message.
        leader: the replica's leadership; the reconciler's saves and publishes are fenced
            by it (None: unfenced, one process).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        repo: Repository,
        keystore: KeyStore,
        publish: Publish,
        clock: Callable[[], float] = time.time,
        directive_expiry: timedelta = DEFAULT_EXPIRY,
        leader: Leadership | None = None,
    ) -> None:
        if directive_expiry.total_seconds() < 1:
            raise RolloutError("directive_expiry", f"{directive_expiry} is under one second")
        self.engine = engine
        self.repo = repo
        self.keystore = keystore
        self.publish = publish
        self.clock = clock
        self.directive_expiry = directive_expiry
        self.leader = leader
        self.stats = ServiceStats()
        self._resent: dict[str, int] = {}
        """Rollout id -> the term (fencing epoch; 0 unfenced) whose tick re-sent its
        outstanding directives."""

    # -- operator side ----------------------------------------------------------------

    def create(self, spec: Mapping[str, Any], *, rollout_id: str | None = None) -> str:
        """Plan and store a rollout (phase ``planned``; the next tick starts it).

        Raises:
            RolloutError: an invalid spec (naming the field), NAME@VERSION not published,
                or a selector that matches no device.
            RolloutConflict: a rollout with ``rollout_id`` exists.
            StorageError: the database refused the write.
        """
        parsed = parse_spec(spec)
        release, budget = self._release(parsed)
        rid = rollout_id or f"ro-{uuid.uuid4().hex[:12]}"
        infos = []
        for d in store.list_devices(self.engine, parsed.selector, include_revoked=False):
            active = None
            if d.active_bundle is not None and d.active_release is not None:
                active = BundleRef(d.active_bundle, d.active_release)
            _, p99, outcomes = health_facts(d.health)
            labels = {**d.labels, store.PROFILE_KEY: d.profile}
            infos.append(DeviceInfo(d.device_id, labels, d.online, active, p99, outcomes))
        now = self.clock()
        rollout = plan(rid, parsed, release, infos, now, budget)
        with store.write_transaction(self.engine) as conn:
            _refuse_overlap(conn, rollout)
            store.save_rollout(conn, _record(rollout, 0), now=now)
            store.set_rollout_devices(conn, rid, _device_rows(rollout, None), now=now)
        log.info(
            "rollout %s: %s@%s (release %d) to %d devices in waves %s",
            rid, parsed.bundle, parsed.version, release, len(rollout.devices),
            [w.target for w in rollout.waves],
        )  # fmt: skip
        return rid

    def get(self, rollout_id: str) -> dict[str, Any]:
        """The rollout: phase, wave, reason, gate metrics, history and every device.

        Raises:
            RolloutNotFound: no such rollout.
        """
        record, rollout = self._load(rollout_id)
        return _view(record, rollout, full=True)

    def list(self) -> builtins.list[dict[str, Any]]:
        """Every rollout, oldest first, without devices and history."""
        return [
            _view(rec, from_dict(rec.controller_state), full=False)
            for rec in store.list_rollouts(self.engine)
        ]

    def act(
        self, rollout_id: str, action: str, reason: str = "", *, by: str = ""
    ) -> dict[str, Any]:
        """Apply an operator action (one of :data:`ACTIONS`); returns :meth:`get`'s view.

        Raises:
            RolloutNotFound: no such rollout.
            RolloutError: an unknown action, or one the rollout's phase does not accept
                (nothing changes).
            RolloutConflict: saved by someone else twice in a row.
        """
        if action not in ACTIONS:
            raise RolloutError("action", f"{action!r} is not one of {', '.join(ACTIONS)}")
        for attempt in range(2):
            record, rollout = self._load(rollout_id)
            now = self.clock()
            event = _operator(action, now, reason, by)
            result = self._apply(record, rollout, event, now, last=attempt == 1)
            if result is not None:
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    def resolve(
        self,
        rollout_id: str,
        device_id: str,
        how: str,
        *,
        release: int | None = None,
        reason: str = "",
        by: str = "",
    ) -> dict[str, Any]:
        """Resolve one stuck (or still reverting) device of a rollout that is rolling
        back: ``how`` is ``retry`` (send its revert again), ``assign`` (send it to
        ``release`` of the rollout's bundle) or ``accept`` (keep what it runs). Kept in
        the rollout's events with ``by``. Returns :meth:`get`'s view.

        Raises:
            RolloutNotFound: no such rollout.
            RolloutError: the rollout is not rolling back, the device is not in it or not
                stuck or reverting, an unknown ``how``, or ``assign`` without a release
                (nothing changes).
            RolloutConflict: saved by someone else twice in a row.
        """
        for attempt in range(2):
            record, rollout = self._load(rollout_id)
            now = self.clock()
            event = Resolve(now, device_id, how, release, by, reason)
            result = self._apply(record, rollout, event, now, last=attempt == 1)
            if result is not None:
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _apply(
        self, record: RolloutRecord, rollout: Rollout, event: Operator, now: float, *, last: bool
    ) -> dict[str, Any] | None:
        """Step an operator event, save, carry the commands out; None: saved elsewhere
        meanwhile (load and try again)."""
        why = refusal(rollout, event)
        if why is not None:
            raise RolloutError("action", why)
        new, commands = step(rollout, event)
        try:
            saved = self._save(record, rollout, new, now)
        except RolloutConflict:
            self.stats.conflicts += 1
            if last:
                raise
            return None
        refused = self._execute(saved, commands, now)
        saved, new = self._settle(saved, new, refused, now)
        return _view(saved, new, full=True)

    # -- the reconciliation loop ------------------------------------------------------

    def tick(self) -> int:
        """One pass: every running rollout gets its devices' changed reports, then its
        phases advance once (:func:`fleet_server.rollout.machine.step_all`);
        returns how many rollouts changed. A rollout that fails is logged and counted,
        the others go on; a fenced one ends the pass (this replica no longer leads)."""
        now = self.clock()
        self.stats.ticks += 1
        changed = 0
        for record in store.list_rollouts(self.engine, states=RUNNING_PHASES):
            try:
                changed += self._tick_one(record.rollout_id, now)
            except NotLeader as exc:
                self.stats.fenced += 1
                log.warning("rollout %s: not saved: %s", record.rollout_id, exc)
                break
            except Exception:
                self.stats.tick_errors += 1
                log.exception("rollout %s: tick failed", record.rollout_id)
        return changed

    def run(self, stop: threading.Event, tick_s: float = 5.0) -> None:
        """Call :meth:`tick` every ``tick_s`` until ``stop`` is set."""
        if tick_s <= 0:
            raise RolloutError("tick_s", f"{tick_s} is not a positive number of seconds")
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:
                self.stats.tick_errors += 1
                log.exception("rollout loop: tick failed")
            stop.wait(max(0.0, tick_s - (time.monotonic() - started)))

    def _tick_one(self, rollout_id: str, now: float) -> int:
        for attempt in range(2):
            record, rollout = self._load(rollout_id)
            if rollout.phase in TERMINAL:
                return 0
            self._resend(record, rollout, now)
            reports: builtins.list[DeviceReport | LabelReport] = [
                *collect(self.engine, rollout, now)
            ]
            labels = self._labels(rollout)
            if labels is not None:
                reports.append(labels)
            new, commands = step_all(rollout, reports, now)
            if not commands and replace(new, clock=rollout.clock) == rollout:
                return 0
            try:
                saved = self._save(record, rollout, new, now, fenced=True)
            except RolloutConflict:
                self.stats.conflicts += 1
                if attempt:
                    raise
                log.info("rollout %s: saved elsewhere meanwhile; stepping again", rollout_id)
                continue
            refused = self._execute(saved, commands, now, fenced=True)
            self._settle(saved, new, refused, now, fenced=True)
            return 1
        return 0  # pragma: no cover

    def _resend(self, record: RolloutRecord, rollout: Rollout, now: float) -> None:
        """Once per term and rollout, before its first step: send again the directives
        the stored state says are unanswered. The previous leader (or this process
        before a restart) may have saved them and never published them."""
        term = 0 if self.leader is None else self.leader.check()
        if self._resent.get(rollout.rollout_id) == term:
            return
        again = outstanding(rollout)
        if again:
            log.info(
                "rollout %s: a new term sends %d unanswered directives again",
                rollout.rollout_id, len(again),
            )  # fmt: skip
            sent = self.stats.directives
            refused = self._execute(record, again, now, fenced=True)
            self._settle(record, rollout, refused, now, fenced=True)
            self.stats.resent += self.stats.directives - sent
        self._resent[rollout.rollout_id] = term

    def _labels(self, rollout: Rollout) -> LabelReport | None:
        """The review labels, when the rollout has an accuracy gate and they changed."""
        gates = rollout.spec.policy.gates
        if gates.min_accuracy is None and gates.accuracy_drop is None:
            return None
        name = rollout.target.name
        releases = {
            d.previous.release
            for d in rollout.devices.values()
            if d.previous is not None and d.previous.name == name
        }
        versions = {b.version for b in self.repo.bundles(name) if b.release in releases}
        counts = label_counts(self.engine, rollout, versions)
        return None if counts == rollout.labels else LabelReport(self.clock(), counts)

    # -- storage and commands ---------------------------------------------------------

    def _load(self, rollout_id: str) -> tuple[RolloutRecord, Rollout]:
        record = store.load_rollout(self.engine, rollout_id)
        if record is None:
            raise RolloutNotFound(rollout_id)
        return record, from_dict(record.controller_state)

    def _save(
        self, record: RolloutRecord, old: Rollout, new: Rollout, now: float, *, fenced: bool = False
    ) -> RolloutRecord:
        """Save ``new`` over ``record`` (compare-and-swap); ``fenced``: only while this
        replica's term is the stored one.

        Raises:
            RolloutConflict: saved elsewhere since ``record`` was loaded.
            NotLeader: fenced, and the lease ran out or another term started.
        """
        leader = self.leader if fenced else None
        epoch = None if leader is None else leader.check()
        with store.write_transaction(self.engine) as conn:
            if leader is not None and epoch is not None:
                try:
                    check_epoch(conn, ROLLOUTS_ROLE, epoch)
                except EpochMismatch as exc:
                    raise NotLeader(leader.replica_id, exc.reason) from exc
            saved = store.save_rollout(conn, _record(new, record.revision), now=now)
            store.set_rollout_devices(conn, new.rollout_id, _device_rows(new, old), now=now)
        return saved

    def _release(self, spec: RolloutSpec) -> tuple[int, float]:
        """The release of ``spec``'s NAME@VERSION and its manifest's latency budget."""
        found = [b for b in self.repo.bundles(spec.bundle) if b.version == spec.version]
        if not found:
            have = ", ".join(b.version for b in self.repo.bundles(spec.bundle)) or "none"
            raise RolloutError(
                "bundle", f"{spec.bundle}@{spec.version} is not published (versions: {have})"
            )
        bundle = max(found, key=lambda b: b.release)
        (manifest,) = [f for f in bundle.files if f.file == "manifest.json"]
        parent, _, base = manifest.target.rpartition("/")
        path = self.repo.targets_dir / parent / f"{manifest.sha256}.{base}"
        try:
            budget = parse_manifest(path.read_bytes(), str(path)).latency_budget_ms
        except (OSError, BundleError) as exc:
            raise RolloutError("bundle", f"cannot read the manifest of {bundle.name} "
                               f"release {bundle.release}: {exc}") from exc  # fmt: skip
        return bundle.release, budget

    def _execute(
        self,
        record: RolloutRecord,
        commands: builtins.list[Command],
        now: float,
        *,
        fenced: bool = False,
    ) -> builtins.list[RevertRefused]:
        """Carry the commands out; ``fenced``: each directive only while the lease is
        fresh, and none once it is not. Returns the reverts that could not be sent (for
        :meth:`_settle`)."""
        notes: builtins.list[EventRecord] = []
        refused: builtins.list[RevertRefused] = []
        for i, command in enumerate(commands):
            if fenced and self.leader is not None and not isinstance(command, Notify):
                try:
                    self.leader.check()
                except NotLeader as exc:
                    self.stats.fenced += 1
                    left = len(commands) - i
                    log.warning(
                        "rollout %s: %d commands not carried out: %s", record.rollout_id, left, exc
                    )
                    break
            try:
                if isinstance(command, Notify):
                    log.info(
                        "rollout %s [%s, wave %d] %s: %s", record.rollout_id, command.phase,
                        command.wave, command.kind, command.message,
                    )  # fmt: skip
                    notes.append(_note(record, i, now, command))
                elif isinstance(command, AssignDirective):
                    self._direct(command.device_id, command.bundle, command.release, command.mode)
                else:
                    why = self._revert(command)
                    if why is not None:
                        log.warning("rollout %s: %s", record.rollout_id, why)
                        refused.append(RevertRefused(now, command.device_id, why))
            except Exception as exc:
                self.stats.command_errors += 1
                log.exception("rollout %s: %s failed", record.rollout_id, command)
                failed = Notify("command_failed", record.state, 0, f"{command}: {exc}")
                notes.append(_note(record, i, now, failed))
        if notes:
            store.insert_events(self.engine, notes)
        return refused

    def _revert(self, command: RevertDirective) -> str | None:
        """Send a revert: a device that never switched (shadow only) gets its directive
        cleared (its shadow slot is emptied); one whose previous slot holds the release
        (as its reported state says) an active directive, which the agent takes as a
        rollback to that slot; any other a ``revert`` directive, which it fetches and
        installs like any assign. One that runs it already gets an active one too (a
        no-op). Returns why it could not be sent (None: sent)."""
        device_id = command.device_id
        if command.shadow_only or command.bundle is None or command.release is None:
            self.publish(topics.directive(device_id), b"", True, None)
            return None
        device = store.get_device(self.engine, device_id)
        if device is None:
            return "the device is not registered"
        back = (command.bundle, command.release)
        in_slot = back in (
            (device.previous_bundle, device.previous_release),
            (device.active_bundle, device.active_release),
        )
        try:
            self._direct(
                device_id, command.bundle, command.release, MODE_ACTIVE if in_slot else MODE_REVERT
            )
        except DirectiveError as exc:
            return exc.reason
        return None

    def _settle(
        self,
        record: RolloutRecord,
        rollout: Rollout,
        refused: builtins.list[RevertRefused],
        now: float,
        *,
        fenced: bool = False,
    ) -> tuple[RolloutRecord, Rollout]:
        """Step the reverts that could not be sent into the rollout (each device stuck,
        with why) and save it; returns the record and rollout saved last. A save refused
        twice is logged: the device's deadline makes it stuck then."""
        if not refused:
            return record, rollout
        for attempt in range(2):
            new, commands = rollout, builtins.list[Command]()
            for event in refused:
                new, out = step(new, event)
                commands += out
            try:
                saved = self._save(record, rollout, new, now, fenced=fenced)
            except RolloutConflict:
                self.stats.conflicts += 1
                if attempt:
                    log.warning("rollout %s: unsent reverts not saved", rollout.rollout_id)
                    return record, rollout
                record, rollout = self._load(rollout.rollout_id)
                continue
            self._execute(saved, commands, now, fenced=fenced)  # notes only
            return saved, new
        return record, rollout  # pragma: no cover

    def _direct(self, device_id: str, bundle: str, release: int, mode: str = MODE_ACTIVE) -> None:
        device = store.get_device(self.engine, device_id)
        if device is None:
            raise DirectiveError(device_id, "not registered")
        payload = issue_directive(
            self.repo, self.keystore, device_id, device.profile, bundle, release,
            expires_in=self.directive_expiry, mode=mode,
        )  # fmt: skip
        expiry = int(self.directive_expiry.total_seconds())
        self.publish(topics.directive(device_id), payload, True, expiry)
        self.stats.directives += 1
        log.info(
            "directive: %s %s release %d %s (expires in %d s)",
            device_id, bundle, release, mode, expiry,
        )  # fmt: skip


def _operator(action: str, now: float, reason: str, by: str) -> Operator:
    if action == "pause":
        return Pause(now, reason, by)
    if action == "resume":
        return Resume(now, by)
    if action == "approve":
        return Approve(now, by)
    if action == "cancel":
        return Cancel(now, reason, by)
    return Rollback(now, reason, by)


HELD_IN_ROLLBACK = tuple(s.value for s in REVERT_OPEN)
"""The devices a rollout that is rolling back still holds: those whose revert is open."""


CREATE_LOCK_KEY = 0x6564_6765_726F  # "edgero": serialises rollout creation on PostgreSQL
"""Two replicas creating rollouts on the same devices at once would each see the other's
rows as not yet there (PostgreSQL's read committed; SQLite's write lock already orders
them): the overlap check and the insert run under this transaction-scoped lock."""


def _refuse_overlap(conn: Any, rollout: Rollout) -> None:
    """Raise :class:`RolloutOverlap` when another active rollout holds any of the new
    rollout's devices (checked in the transaction that stores it, serialised with every
    other creation on PostgreSQL by :data:`CREATE_LOCK_KEY`)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(CREATE_LOCK_KEY)))
    held: dict[tuple[str, str], builtins.list[str]] = {}
    for other, phase, device_id, status in rollouts_on_devices(
        conn, rollout.devices, RUNNING_PHASES
    ):
        if other == rollout.rollout_id:
            continue
        if phase == Phase.ROLLING_BACK.value and status not in HELD_IN_ROLLBACK:
            continue
        held.setdefault((other, phase), []).append(device_id)
    if held:
        (other, phase), devices = min(held.items())
        raise RolloutOverlap(other, phase, sorted(devices))


def _record(rollout: Rollout, revision: int) -> RolloutRecord:
    spec = rollout.spec
    return RolloutRecord(
        rollout_id=rollout.rollout_id,
        bundle=rollout.target.name,
        release=rollout.target.release,
        version=spec.version,
        selector=dict(spec.selector),
        waves=list(spec.waves),
        soak_s=float(spec.soak_s),
        policy=spec.policy.model_dump(mode="json"),
        state=rollout.phase.value,
        controller_state=to_dict(rollout),
        revision=revision,
    )


def _device_rows(new: Rollout, old: Rollout | None) -> builtins.list[RolloutDevice]:
    """Rows of the devices whose status or wave changed (all when ``old`` is None)."""
    rows = []
    for device_id, d in new.devices.items():
        before = old.devices.get(device_id) if old is not None else None
        if before is None or (before.status, before.wave) != (d.status, d.wave):
            wave = 0 if d.wave is None else d.wave + 1
            rows.append(RolloutDevice(device_id, wave, d.status.value))
    return rows


def _note(record: RolloutRecord, index: int, now: float, note: Notify) -> EventRecord:
    payload = {"rollout_id": record.rollout_id, "kind": note.kind, "phase": note.phase,
               "wave": note.wave, "message": note.message}  # fmt: skip
    if note.by:
        payload["by"] = note.by
    event_id = f"{record.rollout_id}:{record.revision}:{index}"
    return EventRecord(record.rollout_id, event_id, now, NOTIFY_EVENT, payload)
