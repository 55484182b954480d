"""Reviews: a person confirms or overrides what a device decided, and the result is the
decision's ground-truth label.

Each review is appended to ``decision_review_log`` (history: nothing is overwritten
there) and becomes the decision's current review in ``decision_reviews`` (one per
decision; the newest wins). A review's ``seq`` comes from the log and only grows; the
labels feed (:func:`labels_since`) hands out current reviews in ``seq`` order. Reviews
are written one at a time (SQLite's write lock; on PostgreSQL an advisory lock taken
before the ``seq`` is drawn), so ``seq`` order is commit order and a reader that has
seen ``seq`` n never later finds a review with a smaller one.

A decision is ``(device_id, id)``: two devices may have used the same id. Every
function here takes the device; without it, an id is looked up alone and must name
one decision (:func:`decision_row`): an id shared by several devices is a
:class:`BadQuery` on ``device`` that lists them, never another device's row.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from fleet_server.db._tx import Bind, reading, upsert, writing
from fleet_server.db.tables import decision_review_log, decision_reviews, decisions
from fleet_server.review.errors import BadQuery, BadReview, UnknownDecision
from fleet_server.review.filters import MAX_TEXT
from fleet_server.review.query import REVIEW_COLUMNS, device_labels
from fleet_server.review.rows import DecisionSummary, Review, line_of, summarize
from fleet_server.review.shadow import RightModel, ShadowComparison, shadow_comparison

Verdict = Literal["confirm", "override"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
MAX_NOTE = 2000
"""The longest note taken, in characters."""
REVIEW_LOCK_KEY = 0x6564_6765_7276  # "edgerv": serialises reviews on PostgreSQL
HISTORY_SHOWN = 50
"""Reviews of one decision shown in its detail, newest first."""
SHARED_SHOWN = 10
"""Devices named in the error about an id several devices used."""


@dataclass(frozen=True)
class DecisionDetail:
    """A stored decision as a whole.

    Attributes:
        summary: its list row (current review included).
        payload: the row the device uploaded (outputs, thresholds, latencies ...).
        labels: the device's labels ({} for a device not registered).
        history: its reviews, newest first (at most :data:`HISTORY_SHOWN`).
        shadow: what a candidate in the device's shadow slot said about the same frame
            (None: the frame was not sampled for a shadow, or no candidate ran).
    """

    summary: DecisionSummary
    payload: dict[str, Any]
    labels: dict[str, str]
    history: list[Review]
    shadow: ShadowComparison | None = None

    @property
    def label_agrees_with(self) -> RightModel | None:
        """Which model the current label agrees with (live, candidate, both, neither);
        None without a shadow record or a label."""
        review = self.summary.review
        if self.shadow is None or review is None:
            return None
        return self.shadow.right_model(review.outcome)


def check_review(
    decided: str, verdict: str, outcome: str | None, note: str
) -> tuple[Verdict, str, str]:
    """The verdict, the label and the note of a review of a decision the device decided
    as ``decided``: ``confirm`` keeps ``decided`` (an ``outcome``, if given, must be
    it); ``override`` needs an ``outcome`` other than ``decided``.

    Raises:
        BadReview: naming the field at fault.
    """
    chosen = next((v for v in VERDICTS if v == verdict), None)
    if chosen is None:
        raise BadReview("verdict", f"{verdict!r} is not one of {', '.join(VERDICTS)}")
    if len(note) > MAX_NOTE:
        raise BadReview("note", f"longer than {MAX_NOTE} characters")
    if any((ord(c) < 32 and c not in "\n\t") or ord(c) == 127 for c in note):
        raise BadReview("note", "holds a control character")
    if outcome is not None:
        if not outcome.strip() or len(outcome) > MAX_TEXT:
            raise BadReview("outcome", f"must be 1-{MAX_TEXT} characters, not blank")
        if any(ord(c) < 32 or ord(c) == 127 for c in outcome):
            raise BadReview("outcome", "holds a control character")
    if chosen == "confirm":
        if outcome is not None and outcome != decided:
            raise BadReview(
                "outcome",
                f"a confirmation keeps the device's outcome {decided!r}; "
                f"use verdict 'override' to set {outcome!r}",
            )
        return chosen, decided, note
    if outcome is None:
        raise BadReview("outcome", "an override needs the outcome that is right")
    if outcome == decided:
        raise BadReview("outcome", f"{outcome!r} is what the device decided; use verdict 'confirm'")
    return chosen, outcome, note


def decision_row(conn: Connection, decision_id: str, device_id: str | None) -> sa.Row[Any]:
    """The ``decisions`` row of ``decision_id`` made by ``device_id``; with no device,
    the one row with that id.

    Raises:
        UnknownDecision: no such decision (of that device).
        BadQuery: no device given and several devices used the id (``device`` named,
            with the devices).
    """
    query = sa.select(decisions).where(decisions.c.id == decision_id)
    if device_id is not None:
        query = query.where(decisions.c.device_id == device_id)
    rows = conn.execute(query.order_by(decisions.c.device_id).limit(SHARED_SHOWN + 1)).all()
    if not rows:
        raise UnknownDecision(decision_id)
    if len(rows) > 1:
        names = ", ".join(str(r.device_id) for r in rows[:SHARED_SHOWN])
        more = " ..." if len(rows) > SHARED_SHOWN else ""
        raise BadQuery(
            "device",
            f"decision id {decision_id!r} is used by devices {names}{more}; "
            "name the device (?device=...)",
        )
    return rows[0]


def save_review(
    bind: Bind,
    decision_id: str,
    *,
    device_id: str | None = None,
    verdict: str,
    outcome: str | None,
    note: str,
    reviewer: str,
    now: float | None = None,
) -> Review:
    """Record a review of the decision (see :func:`check_review`) by ``reviewer``; it
    replaces the decision's current review and is kept in its history.

    Raises:
        UnknownDecision: no such decision (of ``device_id``, when given).
        BadQuery: no device given and several devices used the id.
        BadReview: the review is not acceptable.
    """
    at = time.time() if now is None else now
    with writing(bind) as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(REVIEW_LOCK_KEY)))
        row = decision_row(conn, decision_id, device_id)
        decided = str(row.outcome)
        chosen, label, text = check_review(decided, verdict, outcome, note)
        entry = {
            "device_id": row.device_id,
            "decision_id": decision_id,
            "decided": decided,
            "verdict": chosen,
            "outcome": label,
            "note": text,
            "reviewer": reviewer,
            "reviewed_at": at,
        }
        seq = int(
            conn.execute(
                decision_review_log.insert().returning(decision_review_log.c.seq), entry
            ).scalar_one()
        )
        labels = device_labels(conn, [row.device_id]).get(row.device_id, {})
        current = {
            **entry,
            "seq": seq,
            "decision_ts": row.ts,
            "line": line_of(row.payload or {}, labels),
            "model_name": row.model_name,
            "model_version": row.model_version,
        }
        stmt = upsert(conn, decision_reviews).values(current)
        key = ["device_id", "decision_id"]
        changed = {k: v for k, v in current.items() if k not in key}
        conn.execute(stmt.on_conflict_do_update(index_elements=key, set_=changed))
    return Review(
        seq=seq,
        decided=decided,
        verdict=chosen,
        outcome=label,
        note=text,
        reviewer=reviewer,
        reviewed_at=at,
    )


def _review(row: Mapping[Any, Any]) -> Review:
    return Review(**{name: row[name] for name in REVIEW_COLUMNS})


def get_decision(bind: Bind, decision_id: str, device_id: str | None = None) -> DecisionDetail:
    """The decision with its device's labels, current review and review history.

    Raises:
        UnknownDecision: no such decision (of ``device_id``, when given).
        BadQuery: no device given and several devices used the id.
    """
    log = decision_review_log
    r = decision_reviews
    with reading(bind) as conn:
        row = decision_row(conn, decision_id, device_id)
        history = [
            _review(h._mapping)
            for h in conn.execute(
                sa.select(log)
                .where(log.c.device_id == row.device_id, log.c.decision_id == decision_id)
                .order_by(log.c.seq.desc())
                .limit(HISTORY_SHOWN)
            )
        ]
        current = conn.execute(
            sa.select(r).where(r.c.device_id == row.device_id, r.c.decision_id == decision_id)
        ).first()
        labels = device_labels(conn, [row.device_id]).get(row.device_id, {})
        shadow = shadow_comparison(conn, str(row.device_id), decision_id)
    review = None if current is None else _review(current._mapping)
    mapping = row._mapping
    return DecisionDetail(
        summary=summarize(mapping, labels, review),
        payload=dict(mapping["payload"] or {}),
        labels=labels,
        history=history,
        shadow=shadow,
    )
