"""Read-only views of a bundle name's directory: slot facts, status, what to load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.installer import machine, shadowslot, slots, store
from agent.installer.machine import SLOTS, BundleId, SlotFacts
from agent.installer.shadow import SHADOW_SLOT, shadow_dir


def slot_facts(d: Path) -> dict[str, SlotFacts]:
    """What each slot of ``d`` holds (every bundle is loaded, so its files are hashed)."""
    facts = {}
    for s in SLOTS:
        path = slots.slot_dir(d, s)
        b = slots.inspect(path)
        facts[s] = SlotFacts(
            slots.bundle_id(b) if b else None, store.read_marker(d, s), slots.is_present(path)
        )
    return facts


def active_path(d: Path) -> Path | None:
    """The slot to load: the trial while an install holds the lock, else the last known
    good (which needs no install-state file); ``None`` when there is none."""
    if not d.is_dir():
        return None
    pointer, _ = store.read_pointer(d)
    if store.lock_held(d) and pointer is not None and pointer.active is not None:
        return slots.slot_dir(d, pointer.active)
    slot = machine.active_slot(pointer, slot_facts(d), install_running=False)
    return slots.slot_dir(d, slot) if slot is not None else None


@dataclass(frozen=True)
class SlotStatus:
    """One slot: "committed", "trial", "previous", "installing", "empty" or "unusable";
    the shadow slot (``slot`` "shadow", listed while it holds anything): "shadow" (a
    checked candidate running beside the active bundle, never acting) or "unusable"."""

    name: str
    slot: str
    path: Path
    state: str
    active: bool
    bundle: BundleId | None
    last: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        b = self.bundle.as_dict() if self.bundle else {"version": None, "release": None}
        return {
            **b,
            "name": self.name,
            "slot": self.slot,
            "path": str(self.path),
            "state": self.state,
            "active": self.active,
            "last": self.last,
        }


def name_status(name: str, d: Path) -> list[SlotStatus]:
    """Both slots of ``name``, with the last result from its install-state file, and its
    shadow slot when it holds anything, with the last shadow install's result."""
    pointer, _ = store.read_pointer(d)
    journal, problem = store.read_journal(d)
    facts = slot_facts(d)
    running = store.lock_held(d)
    good = machine.last_known_good(pointer, facts)[0]
    active = machine.active_slot(pointer, facts, install_running=running)
    last = journal.as_dict() if journal else {"problem": problem}
    last.pop("history", None)
    out = []
    for s in SLOTS:
        f = facts[s]
        if s == good:
            state = "committed"
        elif running and s == active:
            state = "trial"
        elif f.good:
            state = "previous"
        elif running and journal is not None and journal.slot == s:
            state = "installing"
        else:
            state = "empty" if not f.present else "unusable"
        path = slots.slot_dir(d, s)
        out.append(SlotStatus(name, s, path, state, s == active, f.bundle, last))
    shadow = shadow_status(name, d)
    return [*out, shadow] if shadow is not None else out


def shadow_status(name: str, d: Path) -> SlotStatus | None:
    """The shadow slot of ``name`` (``d`` its directory); ``None`` while it is empty."""
    state_dir = d.parent.parent
    path = shadow_dir(state_dir, name)
    if not slots.is_present(path):
        return None
    candidate = shadowslot.held(state_dir, name)
    state = SHADOW_SLOT if candidate is not None else "unusable"
    last = shadowslot.read_state(state_dir, name)
    return SlotStatus(name, SHADOW_SLOT, path, state, False, candidate, last)
