"""Replica slots: which service identities a fleet-server replica connects to the
brokers with.

The managed brokers force a client's id to its certificate's name
(``use_username_as_clientid``), so two replicas connecting as ``fleet:ingest-0`` would
take each other's session over, again and again. Each replica therefore claims a slot
``0 .. [broker] replica_slots - 1`` for as long as it runs: an exclusive ``flock`` on
``state_dir/replica-slots/slot-<k>.lock`` (the replicas share one state directory on one
host). The lock goes with the process, a killed one's included, and the next replica to
start takes the lowest free slot, and with it the dead one's persistent sessions (its
ingest workers' queued messages are read, not lost). Slot 0 has the one-replica names
(:mod:`fleet_server.broker.identity`).
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from fleet_server.errors import FleetError
from fleet_server.repository._files import make_dirs

log = logging.getLogger(__name__)

SLOTS_DIR = "replica-slots"


class SlotError(FleetError):
    """No replica slot can be claimed.

    Attributes:
        reason: why (every slot held, the directory unwritable).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"replica slot: {reason}")


class ReplicaSlot:
    """A claimed slot; :meth:`release` (or the process's end) frees it."""

    def __init__(self, index: int, path: Path, fd: int) -> None:
        self.index = index
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        """Whether this process still holds the slot."""
        return self._fd is not None

    def release(self) -> None:
        """Free the slot (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock


def claim_slot(state_dir: Path, slots: int, replica: str = "") -> ReplicaSlot:
    """The lowest free slot below ``slots``, held until released.

    Raises:
        SlotError: every slot is held by a running replica, or the lock files can't be
            made.
    """
    directory = state_dir / SLOTS_DIR
    try:
        make_dirs(directory, mode=0o700)
    except OSError as exc:
        raise SlotError(f"cannot create {directory}: {exc}") from exc
    for index in range(slots):
        path = directory / f"slot-{index}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise SlotError(f"cannot open {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except OSError as exc:
            os.close(fd)
            raise SlotError(f"cannot lock {path}: {exc}") from exc
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{replica or os.getpid()}\n".encode())
        except OSError as exc:
            log.warning("replica slot %d: cannot note the holder in %s: %s", index, path, exc)
        log.info("replica slot %d claimed (%s)", index, replica or os.getpid())
        return ReplicaSlot(index, path, fd)
    raise SlotError(
        f"all {slots} slots in {directory} are held by running replicas: raise "
        "[broker] replica_slots (on the brokers too: their ACL grants each slot)"
    )
