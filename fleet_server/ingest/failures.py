"""Why a sink call failed: a record that can never be stored, or a database that can't
store anything just now.

Ingest (:mod:`fleet_server.ingest.batch`) treats the two differently:

*Permanent* (the records of the call, one of which is bad): the batch is split in
halves until the bad record is alone, and that one is quarantined with the reason; the
rest are stored. These are

- ``sqlalchemy.exc.DataError``: a value the database refuses (NUL in PostgreSQL text or
  JSONB, ``\\u0000`` or a lone surrogate escape in JSONB, a number out of a column's
  range);
- ``sqlalchemy.exc.IntegrityError``: a constraint the record breaks;
- ``sqlalchemy.exc.StatementError`` that wraps no driver error: the value could not
  even be bound (serialising it to JSON or encoding it failed);
- ``UnicodeError`` (a lone surrogate the driver can't encode), ``OverflowError`` (an
  integer beyond 64 bits), ``RecursionError`` (nesting too deep to serialise),
  ``ValueError`` and ``TypeError`` (a value of a shape the sink can't write).

*Transient* (the database, not the record): the same call is tried again after a
growing pause, at most :attr:`RetryPolicy.attempts` times, each retry counted; after
that the records are left unacknowledged for the broker to deliver again, and the other
kinds and devices of the batch go on. These are ``OperationalError`` (connection lost,
``database is locked``, lock or statement timeout), ``DisconnectionError``, a driver
error flagged as a lost connection, SQLAlchemy's pool ``TimeoutError``, and every other
exception: ``ProgrammingError``, ``InternalError`` or a bug fail every record alike, and
quarantining them all would hide a broken server behind a full quarantine table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import sqlalchemy.exc as sa_exc

Kind = Literal["permanent", "transient"]

_PERMANENT_PLAIN = (UnicodeError, OverflowError, RecursionError, ValueError, TypeError)


@dataclass(frozen=True)
class RetryPolicy:
    """How long a transient failure is retried before its records are left to the
    broker.

    Attributes:
        attempts: calls in all (the first one included) before giving up.
        first_s: pause after the first failure; doubled after each next one.
        max_s: longest pause.
    """

    attempts: int = 5
    first_s: float = 0.1
    max_s: float = 10.0


def classify(exc: BaseException) -> Kind:
    """Whether ``exc``, raised by a sink call, condemns a record or the moment."""
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return "transient"
        if isinstance(exc, (sa_exc.DataError, sa_exc.IntegrityError)):
            return "permanent"
        return "transient"
    if isinstance(exc, (sa_exc.DisconnectionError, sa_exc.TimeoutError)):
        return "transient"
    if isinstance(exc, sa_exc.StatementError):
        # Not a driver error: binding the parameters failed (JSON, encoding).
        return "permanent" if exc.orig is None or _plain_permanent(exc.orig) else "transient"
    return "permanent" if _plain_permanent(exc) else "transient"


def _plain_permanent(exc: BaseException) -> bool:
    return isinstance(exc, _PERMANENT_PLAIN)


def describe(exc: BaseException, limit: int = 500) -> str:
    """A one-line reason naming the exception's type, cut to ``limit`` characters."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
