"""The figures ``/metrics`` reads from the database: devices by shard, rollouts by phase,
quarantined payloads by reason. Three ``GROUP BY`` queries, reused for ``cache_s``
seconds so that several scrapers (or a fast one) don't load the database.

The quarantine's reasons are free text (they name fields, values, devices), so they are
sorted into a few classes in SQL (:data:`REASON_CLASSES`) before counting: the label's
values stay bounded whatever a device sends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from fleet_server.db.errors import StorageError
from fleet_server.db.tables import devices, quarantine, rollouts

log = logging.getLogger(__name__)

MAIN_SHARD = "main"
"""The shard of a device whose ``shard`` is NULL (enrolled before shards existed)."""

REASON_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("too_large", ("%is over the limit of%",)),
    ("clock", ("%server's clock%", "%is not a finite time%")),
    ("unknown_model", ("%is unknown for device%",)),
    ("unstorable", ("can't store %",)),
    ("internal", ("internal error%",)),
)
"""Quarantine reason classes, first match wins (``LIKE`` patterns on ``reason``); the
rest is ``invalid`` (not JSON, not a valid message of its topic, wrong device id)."""
OTHER_REASON = "invalid"


@dataclass(frozen=True)
class DbFigures:
    """One reading of the database's figures.

    Attributes:
        devices: registered (not revoked) devices by shard.
        online: of those, online ones by shard.
        rollouts: rollouts by phase (the ``rollouts.state`` column).
        quarantine: quarantined payloads kept, by reason class.
        read_at: when they were read (``time.monotonic``).
    """

    devices: dict[str, int] = field(default_factory=dict)
    online: dict[str, int] = field(default_factory=dict)
    rollouts: dict[str, int] = field(default_factory=dict)
    quarantine: dict[str, int] = field(default_factory=dict)
    read_at: float = 0.0


def reason_class() -> sa.ColumnElement[str]:
    """The SQL expression that sorts ``quarantine.reason`` into :data:`REASON_CLASSES`."""
    whens = [
        (sa.or_(*(quarantine.c.reason.like(p) for p in patterns)), name)
        for name, patterns in REASON_CLASSES
    ]
    return sa.case(*whens, else_=OTHER_REASON)


def read_figures(engine: Engine) -> DbFigures:
    """Read every figure now (three queries on one connection).

    Raises:
        StorageError: the database did not answer.
    """
    shard = sa.func.coalesce(devices.c.shard, MAIN_SHARD).label("shard")
    online = sa.func.sum(sa.case((devices.c.online, 1), else_=0)).label("online")
    by_shard = (
        sa.select(shard, sa.func.count().label("n"), online)
        .where(sa.not_(devices.c.revoked))
        .group_by(shard)
    )
    by_phase = sa.select(rollouts.c.state, sa.func.count()).group_by(rollouts.c.state)
    cls = reason_class().label("reason")
    by_reason = sa.select(cls, sa.func.count()).group_by(cls)
    try:
        with engine.connect() as conn:
            shard_rows = conn.execute(by_shard).all()
            phase_rows = conn.execute(by_phase).all()
            reason_rows = conn.execute(by_reason).all()
    except sa.exc.SQLAlchemyError as exc:
        raise StorageError("metrics", f"reading the fleet's figures: {exc}") from exc
    return DbFigures(
        devices={str(r.shard): int(r.n) for r in shard_rows},
        online={str(r.shard): int(r.online or 0) for r in shard_rows},
        rollouts={str(state): int(n) for state, n in phase_rows},
        quarantine={str(reason): int(n) for reason, n in reason_rows},
        read_at=time.monotonic(),
    )


class CachedFigures:
    """:func:`read_figures`, reused for ``cache_s`` seconds; thread-safe (one reader at
    a time: concurrent scrapes wait for one reading instead of each querying)."""

    def __init__(
        self,
        engine: Engine,
        cache_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.cache_s = cache_s
        self.clock = clock
        self.reads = 0
        self._lock = threading.Lock()
        self._last: DbFigures | None = None
        self._at = 0.0

    def get(self) -> DbFigures:
        """The figures, read again when the last reading is older than ``cache_s``.

        Raises:
            StorageError: the database did not answer (the stale reading is not served:
                a scrape must not show old figures as current).
        """
        with self._lock:
            now = self.clock()
            if self._last is not None and now - self._at < self.cache_s:
                return self._last
            figures = read_figures(self.engine)
            self.reads += 1
            self._last, self._at = figures, now
            return figures


__all__ = ["MAIN_SHARD", "REASON_CLASSES", "CachedFigures", "DbFigures", "read_figures"]
