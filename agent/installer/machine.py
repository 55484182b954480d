"""The installer's rules as plain data and functions: no files, no clock, no runtime.

Two slots per bundle name ("a" and "b"). The *pointer* says which slot is active and
which is committed (the last known good); they differ only between switch and commit.
A *marker* next to a slot says it was committed once (with a sequence number and the
bundle's digest); staging removes it first, so a half-written slot is never a rollback
target. The *journal* (install-state file) records the install in progress and the last
result. Every decision here takes what the shell read and returns what it must write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

SLOTS = ("a", "b")
HISTORY = 20
"""Past results kept in the journal."""


class Step(str, Enum):
    """Steps of an install, in order ("plan" decides before anything is written)."""

    PLAN = "plan"
    STAGE = "stage"
    LOAD = "load"
    BENCHMARK = "benchmark"
    SWITCH = "switch"
    HEALTH = "health"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    RECOVER = "recover"


INSTALL_STEPS = (Step.STAGE, Step.LOAD, Step.BENCHMARK, Step.SWITCH, Step.HEALTH, Step.COMMIT)
_AFTER_SWITCH = (Step.SWITCH, Step.HEALTH, Step.COMMIT)


class Status(str, Enum):
    """What the journal's last entry says."""

    RUNNING = "running"
    COMMITTED = "committed"
    NOOP = "noop"
    REFUSED = "refused"
    FAILED = "failed"
    ROLLED_BACK = "rolled-back"
    RECOVERED = "recovered"


def other_slot(slot: str) -> str:
    """The slot that is not ``slot``."""
    return SLOTS[1] if slot == SLOTS[0] else SLOTS[0]


def _slot(value: Any, what: str) -> str | None:
    if value is None or value in SLOTS:
        return value  # type: ignore[no-any-return]
    raise ValueError(f"{what}: {value!r} is not a slot ({', '.join(SLOTS)}) or null")


@dataclass(frozen=True)
class BundleId:
    """What identifies an installed bundle."""

    name: str
    version: str
    release: int
    digest: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "release": self.release,
            "digest": self.digest,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> BundleId:
        """Raises TypeError or ValueError when ``raw`` is not a bundle id."""
        if not isinstance(raw, dict):
            raise TypeError("bundle id is not an object")
        name, version, release, digest = (
            raw.get(k) for k in ("name", "version", "release", "digest")
        )
        if not (isinstance(name, str) and isinstance(version, str) and isinstance(digest, str)):
            raise TypeError("bundle id: name, version and digest must be strings")
        if not isinstance(release, int) or isinstance(release, bool):
            raise TypeError("bundle id: release must be an integer")
        return cls(name, version, release, digest)


@dataclass(frozen=True)
class Pointer:
    """Which slot the agent runs (``active``) and which is the last known good."""

    active: str | None
    committed: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"active": self.active, "committed": self.committed}

    @classmethod
    def from_dict(cls, raw: Any) -> Pointer:
        """Raises TypeError or ValueError when ``raw`` is not a pointer."""
        if not isinstance(raw, dict):
            raise TypeError("pointer is not an object")
        return cls(_slot(raw.get("active"), "active"), _slot(raw.get("committed"), "committed"))


@dataclass(frozen=True)
class Marker:
    """A slot's commit marker: the commit's sequence number and the bundle's digest."""

    seq: int
    digest: str

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "digest": self.digest}

    @classmethod
    def from_dict(cls, raw: Any) -> Marker:
        """Raises TypeError when ``raw`` is not a marker."""
        if not isinstance(raw, dict):
            raise TypeError("marker is not an object")
        seq, digest = raw.get("seq"), raw.get("digest")
        if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(digest, str):
            raise TypeError("marker: seq must be an integer and digest a string")
        return cls(seq, digest)


@dataclass(frozen=True)
class SlotFacts:
    """What the shell found in one slot: the bundle that loads there (``None``: empty or
    not loadable), its commit marker, and whether the directory holds anything."""

    bundle: BundleId | None = None
    marker: Marker | None = None
    present: bool = False

    @property
    def good(self) -> bool:
        """Committed once, and still holds exactly that bundle."""
        return (
            self.bundle is not None
            and self.marker is not None
            and self.marker.digest == self.bundle.digest
        )


@dataclass(frozen=True)
class Journal:
    """The install-state file: the install in progress or the last result."""

    name: str
    status: Status
    step: Step
    slot: str | None = None
    target: BundleId | None = None
    source: str = ""
    reason: str = ""
    history: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "step": self.step.value,
            "slot": self.slot,
            "target": self.target.as_dict() if self.target else None,
            "source": self.source,
            "reason": self.reason,
            "history": list(self.history),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Journal:
        """Raises TypeError or ValueError when ``raw`` is not a journal."""
        if not isinstance(raw, dict):
            raise TypeError("journal is not an object")
        target = raw.get("target")
        history = raw.get("history", [])
        if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
            raise TypeError("journal: history is not a list of objects")
        name, source, reason = raw.get("name"), raw.get("source", ""), raw.get("reason", "")
        if not all(isinstance(v, str) for v in (name, source, reason)):
            raise TypeError("journal: name, source and reason must be strings")
        return cls(
            name=str(name),
            status=Status(raw.get("status")),
            step=Step(raw.get("step")),
            slot=_slot(raw.get("slot"), "slot"),
            target=BundleId.from_dict(target) if target is not None else None,
            source=str(source),
            reason=str(reason),
            history=tuple(history[-HISTORY:]),
        )

    def then(self, **changes: Any) -> Journal:
        """A copy with ``changes``."""
        return replace(self, **changes)


# -- install ------------------------------------------------------------------------


class PlanKind(str, Enum):
    INSTALL = "install"
    NOOP = "noop"
    REFUSE = "refuse"


@dataclass(frozen=True)
class Plan:
    kind: PlanKind
    slot: str | None = None
    reason: str = ""


def plan_install(
    pointer: Pointer | None, committed: BundleId | None, target: BundleId, *, revert: bool = False
) -> Plan:
    """Decide what installing ``target`` means given the committed bundle.

    The same release with the same digest is a no-op; a lower release, or the same
    release with other content, is refused (rollback protection); anything else is
    installed into the slot that is not the committed one. ``revert``: the fleet signed
    a directive sending the device back to ``target`` (``mode = "revert"``), so a lower
    release is installed too (the same release with other content is still refused).
    """
    if committed is not None:
        if target.release == committed.release and target.digest == committed.digest:
            return Plan(PlanKind.NOOP, reason=f"release {target.release} is already committed")
        if target.release < committed.release and not revert:
            return Plan(
                PlanKind.REFUSE,
                reason=f"release {target.release} ({target.version}) is lower than the "
                f"committed release {committed.release} ({committed.version}): rollback "
                "protection (use rollback to return to the previous slot)",
            )
        if target.release == committed.release:
            return Plan(
                PlanKind.REFUSE,
                reason=f"release {target.release} is already committed with other content "
                f"(digest {committed.digest[:12]}, not {target.digest[:12]})",
            )
    current = pointer.committed if pointer is not None else None
    slot = other_slot(current) if current is not None else SLOTS[0]
    return Plan(PlanKind.INSTALL, slot=slot)


def switched(pointer: Pointer | None, slot: str) -> Pointer:
    """The pointer during the health window: ``slot`` active, the old one still good."""
    return Pointer(slot, pointer.committed if pointer is not None else None)


def committed_to(slot: str) -> Pointer:
    """The pointer once ``slot`` is committed (or chosen by a rollback)."""
    return Pointer(slot, slot)


def pointer_after_failure(step: Step, before: Pointer | None) -> Pointer | None:
    """The pointer to write after ``step`` failed: the one from before the switch when
    the switch may have happened, else ``None`` (nothing to write)."""
    if step not in _AFTER_SWITCH:
        return None
    committed = before.committed if before is not None else None
    return Pointer(committed, committed)


def next_seq(facts: Mapping[str, SlotFacts]) -> int:
    """The sequence number for the next commit marker."""
    return 1 + max((f.marker.seq for f in facts.values() if f.marker is not None), default=0)


# -- recovery -------------------------------------------------------------------------


@dataclass(frozen=True)
class Recovery:
    """What recovery must write: the pointer, a marker, slots to empty, the journal."""

    pointer: Pointer
    write_pointer: bool
    mark: str | None
    mark_seq: int
    wipe: tuple[str, ...]
    journal: Journal | None
    notes: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return (
            self.write_pointer
            or self.mark is not None
            or bool(self.wipe)
            or self.journal is not None
        )


def last_known_good(
    pointer: Pointer | None, facts: Mapping[str, SlotFacts]
) -> tuple[str | None, list[str]]:
    """The slot to run when no install is in progress, and notes on what was odd.

    The pointer's committed slot if it loads; else the other slot if it is good; with no
    readable pointer, the good slot with the highest marker.
    """
    notes: list[str] = []
    if pointer is None:
        if any(f.present for f in facts.values()):
            notes.append("the active-slot pointer is missing or unreadable")
        good = sorted((s for s in SLOTS if facts[s].good), key=lambda s: _seq(facts[s]))
        return (good[-1] if good else None), notes
    c = pointer.committed
    if c is None or facts[c].bundle is not None:
        return c, notes
    notes.append(f"the committed slot-{c} does not load")
    alt = other_slot(c)
    return (alt if facts[alt].good else None), notes


def _seq(f: SlotFacts) -> int:
    return f.marker.seq if f.marker is not None else 0


def decide_recovery(
    name: str,
    pointer: Pointer | None,
    journal: Journal | None,
    facts: Mapping[str, SlotFacts],
    *,
    journal_unreadable: bool = False,
) -> Recovery:
    """Bring one bundle name back to a consistent state after a stop at any point.

    Before commit the old slot wins (an interrupted trial is undone and its slot
    emptied); once the commit pointer is on disk the new slot wins and gets its marker.
    A corrupt or missing journal or pointer falls back to the last known good slot.
    """
    good, notes = last_known_good(pointer, facts)
    want = committed_to(good) if good is not None else Pointer(None, None)
    if pointer is not None and pointer.active != pointer.committed:
        notes.append(f"slot-{pointer.active} was on trial when the installer stopped")
    mark = None
    if good is not None and (not facts[good].good or _seq(facts[good]) < next_seq(facts) - 1):
        mark = good
    wipe = tuple(s for s in SLOTS if s != good and facts[s].present and not facts[s].good)
    new_journal: Journal | None = None
    where = f"slot-{good}" if good is not None else "no installed bundle"
    if journal is not None and journal.status is Status.RUNNING:
        done = {Step.COMMIT: Status.COMMITTED, Step.ROLLBACK: Status.ROLLED_BACK}
        if journal.step in done and good is not None and good == journal.slot:
            new_journal = journal.then(
                status=done[journal.step], reason=f"{journal.step.value} completed at recovery"
            )
        else:
            new_journal = journal.then(
                status=Status.FAILED,
                reason=f"interrupted during {journal.step.value} (restart or power loss); "
                f"back on {where}",
            )
    elif journal_unreadable:
        notes.append("the install-state file is unreadable")
        new_journal = Journal(name, Status.RECOVERED, Step.RECOVER, slot=good, reason="")
    if new_journal is not None and notes:
        extra = "; ".join(notes)
        reason = f"{new_journal.reason}; {extra}" if new_journal.reason else f"{extra}; on {where}"
        new_journal = new_journal.then(reason=reason)
    return Recovery(
        pointer=want,
        write_pointer=pointer != want and (pointer is not None or good is not None),
        mark=mark,
        mark_seq=next_seq(facts),
        wipe=wipe,
        journal=new_journal,
        notes=tuple(notes),
    )


def active_slot(
    pointer: Pointer | None, facts: Mapping[str, SlotFacts], *, install_running: bool
) -> str | None:
    """The slot the agent should load: the trial while an install holds the lock (its
    health window), else the last known good."""
    if install_running and pointer is not None and pointer.active is not None:
        return pointer.active
    return last_known_good(pointer, facts)[0]


def plan_rollback(pointer: Pointer | None, facts: Mapping[str, SlotFacts]) -> Plan:
    """A rollback by hand: to the other slot, if it holds a bundle committed before."""
    current = last_known_good(pointer, facts)[0]
    if current is None:
        return Plan(PlanKind.REFUSE, reason="no bundle is installed")
    target = other_slot(current)
    if not facts[target].good:
        return Plan(
            PlanKind.REFUSE,
            reason=f"slot-{target} holds no previously committed bundle to return to",
        )
    return Plan(PlanKind.INSTALL, slot=target)


def finished(journal: Journal, status: Status, step: Step, reason: str, at: float) -> Journal:
    """``journal`` with its result set and added to its bounded history."""
    entry = {
        "status": status.value,
        "step": step.value,
        "version": journal.target.version if journal.target else None,
        "release": journal.target.release if journal.target else None,
        "reason": reason,
        "at": at,
    }
    history = (*journal.history, entry)[-HISTORY:]
    return journal.then(status=status, step=step, reason=reason, history=history)
