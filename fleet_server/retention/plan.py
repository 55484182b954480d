"""What a retention pass deletes, decided without I/O.

:func:`plan` turns the ``[retention]`` budgets and a few facts read from the database
(:class:`Facts`: the time of the N-th newest row of each table with a row budget, the
bundles of the rollouts still running) into one :class:`Step` per table: "delete the
rows whose time is before ``cutoff``", with what a step must keep whatever its age.
:mod:`fleet_server.retention.prune` reads the facts and runs the steps in batches.

A row budget keeps the newest ``max_rows`` rows: the cutoff is the time of the
``max_rows``-th newest row, so rows that share that time are kept too. With an age and a
row budget, the later of the two cutoffs wins (a row goes when it is past either).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet_server.retention.config import RetentionSection

DAY_S = 86_400.0

DECISIONS = "decisions"
IMAGES = "decision_images"
SESSIONS = "user_sessions"
TOKENS = "enrollment_tokens"
EVENTS = "events"

BUDGETED = {
    DECISIONS: "decisions",
    IMAGES: "images",
    "heartbeats": "heartbeats",
    "telemetry": "telemetry",
    EVENTS: "events",
    "shadow_results": "shadow_results",
    "drift_hours": "drift_hours",
    "quarantine": "quarantine",
    "audit_log": "audit_log",
    "alerts": "alerts",
    "device_actions": "device_actions",
    "action_chunks": "action_chunks",
}
"""Tables with an age / row budget, in pruning order, and their ``[retention]`` field
(decisions before their images, so an image goes in its decision's transaction)."""

ORDER = (*BUDGETED, SESSIONS, TOKENS)
"""Every table a pass prunes, in order."""


@dataclass(frozen=True)
class Facts:
    """What the planner needs from the database and the rest of the configuration.

    Attributes:
        now: the pass's time (Unix s).
        nth_newest: per table with a row budget, the time of its ``max_rows``-th newest
            row (None: it holds no more rows than that).
        running_bundles: bundle names of the rollouts not in a terminal phase (their
            accuracy gates count the reviews of every version of that model).
        install_floor: install events at or after this time are read by a running
            rollout (None: no rollout is running).
        drift_reference_s: ``[drift] reference_hours`` in seconds.
        session_idle_s: ``[auth] session_idle_s``.
    """

    now: float
    nth_newest: Mapping[str, float | None] = field(default_factory=dict)
    running_bundles: frozenset[str] = frozenset()
    install_floor: float | None = None
    drift_reference_s: float = 24 * 3600.0
    session_idle_s: float = 1800.0


@dataclass(frozen=True)
class Step:
    """Delete the rows of ``table`` whose time is before ``cutoff``, except:

    - decisions and images: those whose decision has a review with a decision time at or
      after ``labelled_cutoff`` (None: every reviewed one), or a review of a model in
      ``keep_models``;
    - events: install events at or after ``install_floor``;
    - drift_hours: the reference windows (pinned, or the first ``drift_reference_s`` of
      each model version and line);
    - user_sessions: ``cutoff`` applies to ``expires_at``, and ``idle_s`` before it to
      ``last_seen``; enrollment_tokens: to ``expires_at`` and ``used_at``.

    ``reason``: "age", "rows", or "expired".
    """

    table: str
    cutoff: float
    reason: str
    labelled_cutoff: float | None = None
    keep_models: tuple[str, ...] = ()
    install_floor: float | None = None
    drift_reference_s: float = 0.0
    idle_s: float = 0.0


def row_budgets(section: RetentionSection) -> dict[str, int]:
    """The tables with a row budget and its size (what :class:`Facts` must hold)."""
    out = {}
    for table, name in BUDGETED.items():
        rows = getattr(section, name).max_rows
        if rows is not None:
            out[table] = int(rows)
    return out


def age_budget_s(section: RetentionSection, table: str) -> float | None:
    """``max_age_days`` of ``table`` in seconds (None: no age budget or not budgeted)."""
    name = BUDGETED.get(table)
    days = None if name is None else getattr(section, name).max_age_days
    return None if days is None else float(days) * DAY_S


def _cutoff(section: RetentionSection, table: str, facts: Facts) -> tuple[float, str] | None:
    age_s = age_budget_s(section, table)
    candidates: list[tuple[float, str]] = []
    if age_s is not None:
        candidates.append((facts.now - age_s, "age"))
    if table in row_budgets(section):
        nth = facts.nth_newest.get(table)
        if nth is not None:
            candidates.append((float(nth), "rows"))
    return max(candidates) if candidates else None


def plan(section: RetentionSection, facts: Facts) -> list[Step]:
    """The pass's steps, in :data:`ORDER` (a table with nothing to do has none)."""
    decisions = section.decisions
    labelled = decisions.labelled_days
    labelled_cutoff = None if labelled is None else facts.now - float(labelled) * DAY_S
    keep_models = tuple(sorted(facts.running_bundles))
    steps: list[Step] = []
    for table in BUDGETED:
        found = _cutoff(section, table, facts)
        if found is None:
            continue
        cutoff, reason = found
        if table in (DECISIONS, IMAGES):
            steps.append(Step(table, cutoff, reason, labelled_cutoff, keep_models))
        elif table == EVENTS:
            steps.append(Step(table, cutoff, reason, install_floor=facts.install_floor))
        elif table == "drift_hours":
            steps.append(Step(table, cutoff, reason, drift_reference_s=facts.drift_reference_s))
        else:
            steps.append(Step(table, cutoff, reason))
    expired = section.expired
    steps.append(
        Step(
            SESSIONS,
            facts.now - expired.sessions_after_days * DAY_S,
            "expired",
            idle_s=facts.session_idle_s,
        )
    )
    steps.append(Step(TOKENS, facts.now - expired.tokens_after_days * DAY_S, "expired"))
    return steps
