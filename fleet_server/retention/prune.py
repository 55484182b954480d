"""One retention pass: read the facts, plan (:mod:`fleet_server.retention.plan`), and
delete in batches of ``batch_rows``, one short transaction each
(:mod:`fleet_server.retention.queries`); then prune the bundle repository's old
metadata (:mod:`fleet_server.repository.prune`).

Every batch is timed; the :class:`PruneReport` says per table how many rows went, in how
many batches, the largest batch and the longest transaction. A pass stops early (between
batches) when ``should_go_on()`` turns False: the replica lost the lead, or the server
stops. A failure of one table is logged, counted in the report, and the pass goes on
with the next.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from fleet_server.db import store
from fleet_server.db._tx import reading, writing
from fleet_server.errors import FleetError
from fleet_server.repository import Repository
from fleet_server.repository.prune import RepoPruneResult, prune_repository
from fleet_server.retention import queries
from fleet_server.retention.config import RetentionSection
from fleet_server.retention.plan import DAY_S, Facts, Step, plan, row_budgets
from fleet_server.rollout.collect import EVENT_LOOKBACK_S
from fleet_server.rollout.state import TERMINAL

log = logging.getLogger(__name__)

MAX_BATCHES = 100_000
"""The most batches of one table in one pass (a bound; the next pass goes on)."""


@dataclass
class TableResult:
    """What a pass did to one table."""

    table: str
    cutoff: float
    reason: str
    deleted: int = 0
    batches: int = 0
    max_batch_rows: int = 0
    longest_batch_s: float = 0.0
    seconds: float = 0.0
    past_budget: int | None = None
    """Rows past the budget (a dry run counts them instead of deleting)."""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(vars(self))


@dataclass
class PruneReport:
    """One pass: per table, and the repository's."""

    started_at: float
    dry_run: bool = False
    duration_s: float = 0.0
    tables: list[TableResult] = field(default_factory=list)
    repository: RepoPruneResult | None = None
    stopped: bool = False
    """The pass stopped early (lost the lead, or the server stops)."""
    errors: list[str] = field(default_factory=list)

    @property
    def deleted(self) -> dict[str, int]:
        """Rows deleted per table (a decision's images under ``decision_images``)."""
        out: dict[str, int] = {}
        for r in self.tables:
            out[r.table] = out.get(r.table, 0) + r.deleted
        return out

    @property
    def deleted_total(self) -> int:
        """Rows deleted in all."""
        return sum(self.deleted.values())

    @property
    def longest_batch_s(self) -> float:
        """The longest single transaction of the pass."""
        return max((r.longest_batch_s for r in self.tables), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``fleetctl db prune --json``)."""
        return {
            "started_at": self.started_at,
            "dry_run": self.dry_run,
            "duration_s": round(self.duration_s, 6),
            "deleted": self.deleted,
            "deleted_total": self.deleted_total,
            "longest_batch_s": round(self.longest_batch_s, 6),
            "stopped": self.stopped,
            "errors": list(self.errors),
            "tables": [r.to_dict() for r in self.tables],
            "repository": None if self.repository is None else self.repository.to_dict(),
        }


def gather_facts(
    engine: Engine,
    section: RetentionSection,
    now: float,
    *,
    drift_reference_s: float = 24 * 3600.0,
    session_idle_s: float = 1800.0,
) -> Facts:
    """The facts :func:`fleet_server.retention.plan.plan` needs, read now."""
    running = [r for r in store.list_rollouts(engine) if r.state not in _TERMINAL_NAMES]
    with reading(engine) as conn:
        nth = {
            table: queries.nth_newest(conn, table, rows)
            for table, rows in row_budgets(section).items()
        }
    oldest = min((r.created_at for r in running), default=None)
    return Facts(
        now=now,
        nth_newest=nth,
        running_bundles=frozenset(r.bundle for r in running),
        install_floor=None if oldest is None else oldest - EVENT_LOOKBACK_S,
        drift_reference_s=drift_reference_s,
        session_idle_s=session_idle_s,
    )


_TERMINAL_NAMES = frozenset(p.value for p in TERMINAL)


def _run_step(
    engine: Engine,
    step: Step,
    batch_rows: int,
    dry_run: bool,
    should_go_on: Callable[[], bool],
    results: dict[str, TableResult],
) -> bool:
    """Run one step; False when the pass must stop."""
    result = results.setdefault(step.table, TableResult(step.table, step.cutoff, step.reason))
    result.cutoff, result.reason = step.cutoff, step.reason  # images: counted with decisions too
    began = time.monotonic()
    try:
        if dry_run:
            with reading(engine) as conn:
                result.past_budget = queries.count_past(conn, step)
            return True
        for _ in range(MAX_BATCHES):
            if not should_go_on():
                return False
            t0 = time.monotonic()
            with writing(engine) as conn:
                counts = queries.delete_batch(conn, step, batch_rows)
            took = time.monotonic() - t0
            for table, n in counts.items():
                held = results.setdefault(table, TableResult(table, step.cutoff, step.reason))
                held.deleted += n
            main = counts.get(step.table, 0)
            result.batches += 1
            result.max_batch_rows = max(result.max_batch_rows, main)
            result.longest_batch_s = max(result.longest_batch_s, took)
            if main < batch_rows:
                break
        return True
    finally:
        result.seconds += time.monotonic() - began


def prune(
    engine: Engine,
    section: RetentionSection,
    *,
    now: float | None = None,
    repository: Repository | None = None,
    dry_run: bool = False,
    should_go_on: Callable[[], bool] = lambda: True,
    drift_reference_s: float = 24 * 3600.0,
    session_idle_s: float = 1800.0,
) -> PruneReport:
    """Apply ``section``'s budgets once (see the module docstring).

    Raises:
        StorageError: the facts can't be read (nothing was deleted).
    """
    at = time.time() if now is None else now
    report = PruneReport(started_at=at, dry_run=dry_run)
    began = time.monotonic()
    facts = gather_facts(
        engine, section, at, drift_reference_s=drift_reference_s, session_idle_s=session_idle_s
    )
    results: dict[str, TableResult] = {}
    for step in plan(section, facts):
        try:
            go_on = _run_step(engine, step, section.batch_rows, dry_run, should_go_on, results)
        except (SQLAlchemyError, FleetError) as exc:
            message = f"{step.table}: {type(exc).__name__}: {exc}"
            log.exception("retention: %s", message)
            results[step.table].error = message
            report.errors.append(message)
            continue
        if not go_on:
            report.stopped = True
            break
    report.tables = [results[name] for name in results]
    repo = section.repository
    if repository is not None and repo.enabled and not report.stopped:
        try:
            report.repository = prune_repository(
                repository,
                keep_versions=repo.keep_versions,
                orphan_grace_s=repo.orphan_grace_days * DAY_S,
                now=at,
                dry_run=dry_run,
            )
        except (OSError, FleetError) as exc:
            message = f"repository: {type(exc).__name__}: {exc}"
            log.exception("retention: %s", message)
            report.errors.append(message)
    report.duration_s = time.monotonic() - began
    return report
