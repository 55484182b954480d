"""Recovery of one bundle name after a stop at any point: apply :func:`decide_recovery`."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from agent.installer import machine, slots, store
from agent.installer.machine import BundleId, Journal, Marker, Status, Step
from agent.installer.view import slot_facts

log = logging.getLogger(__name__)


def recover_name(name: str, d: Path) -> tuple[Journal, BundleId | None] | None:
    """Finish or undo what a stop left in ``d`` (the caller holds its lock).

    Returns the journal entry written and the bundle now active, or ``None`` when
    everything was consistent (then nothing is written). Idempotent.

    Raises:
        OSError: a file could not be written or removed.
    """
    store.remove_temp_files(d)
    pointer, _ = store.read_pointer(d)
    journal, problem = store.read_journal(d)
    facts = slot_facts(d)
    rec = machine.decide_recovery(
        name, pointer, journal, facts, journal_unreadable=problem is not None
    )
    if not rec.changed:
        return None
    log.warning("recovering %s: %s", name, "; ".join(rec.notes) or "an install was interrupted")
    for s in rec.wipe:
        slots.wipe(slots.slot_dir(d, s))
    if rec.write_pointer:
        store.write_pointer(d, rec.pointer)
    good = rec.pointer.committed
    active = facts[good].bundle if good is not None else None
    if rec.mark is not None and active is not None:
        store.write_marker(d, rec.mark, Marker(rec.mark_seq, active.digest))
    j = rec.journal or Journal(
        name,
        Status.RECOVERED,
        Step.RECOVER,
        slot=good,
        reason="; ".join(rec.notes) or "removed what an interrupted install left",
        history=journal.history if journal else (),
    )
    j = machine.finished(j, j.status, j.step, j.reason, time.time())
    store.write_journal(d, j)
    return j, active
