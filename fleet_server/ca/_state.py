"""The CA's small mutable state (``ca.json``: CRL number, revoked serials) and its lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from cryptography import x509
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleet_server.ca.names import CAError
from fleet_server.repository._files import write_durable

STATE_NAME = "ca.json"
LOCK_NAME = ".lock"
LOCK_TIMEOUT_S = 10.0
_LOCK_POLL_S = 0.05


class Revoked(BaseModel):
    """A revoked certificate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    serial: str = Field(description="Serial number, upper-case hex.")
    common_name: str = Field(description="CN of the revoked certificate.")
    revoked_at: datetime = Field(description="When it was revoked (UTC).")
    reason: x509.ReasonFlags = Field(description="RFC 5280 revocation reason.")


class State(BaseModel):
    """Contents of ``ca.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = Field(1, description="State file format version.")
    crl_valid_days: int = Field(ge=1, description="How long each CRL is valid.")
    crl_number: int = Field(0, ge=0, description="Number of the last CRL written.")
    crl_last_update: datetime | None = Field(None, description="thisUpdate of the last CRL.")
    revoked: list[Revoked] = Field(default_factory=list, description="Revoked certificates.")


def read_state(directory: Path) -> State:
    """The state of the CA in ``directory``.

    Raises:
        CAError: no CA there, or an unreadable state file.
    """
    path = directory / STATE_NAME
    try:
        return State.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise CAError(str(directory), "no CA here (create one first)") from None
    except (OSError, ValueError, ValidationError) as exc:
        raise CAError(str(path), f"unreadable: {exc}") from exc


def write_state(directory: Path, state: State) -> None:
    """Write the state durably (mode 0600).

    Raises:
        CAError: the write failed.
    """
    path = directory / STATE_NAME
    try:
        write_durable(path, state.model_dump_json(indent=2).encode() + b"\n", mode=0o600)
    except OSError as exc:
        raise CAError(str(path), f"cannot write: {exc}") from exc


@contextlib.contextmanager
def locked(
    directory: Path, timeout_s: float = LOCK_TIMEOUT_S, name: str = LOCK_NAME
) -> Iterator[None]:
    """Hold the CA's lock (one writer across processes) for the ``with`` block: the
    ``flock`` of ``directory/name``.

    Raises:
        CAError: the lock can't be opened, or is held elsewhere past ``timeout_s``.
    """
    path = directory / name
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise CAError(str(path), f"cannot open the lock: {exc}") from exc
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CAError(
                        str(path), f"still locked by another process after {timeout_s} s"
                    ) from None
                time.sleep(_LOCK_POLL_S)
        yield
    finally:
        os.close(fd)
