"""Ground-truth labels out of the reviews: the feed a training or export job pulls,
accuracy per group (with Wilson intervals and per-outcome precision and recall,
:mod:`fleet_server.review.scores`), and a model version's labelled accuracy on a set of
lines for the rollout gates (:func:`labelled_accuracy`).

A label is a decision's current review with what a training job needs to find the
input again (device, capture time, input digest, bundle digest, the thumbnail path on
the device). :func:`labels_since` hands them out in ``seq`` order: ask with the last
``seq`` you stored and you get every label set or changed since, each decision once
with its newest label (docs/decision-review.md, "Labels").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from fleet_server.db._tx import Bind, reading
from fleet_server.db.tables import decision_reviews, decisions
from fleet_server.review.errors import BadQuery
from fleet_server.review.filters import DecisionFilter
from fleet_server.review.query import devices_labelled
from fleet_server.review.scores import (
    DEFAULT_CONFIDENCE,
    OutcomeScore,
    Proportion,
    agreed,
    check_confidence,
    outcome_scores,
    proportion,
)

MAX_LABELS = 5000
"""The most labels one call returns."""
GROUP_KEYS = {
    "line": decision_reviews.c.line,
    "model_name": decision_reviews.c.model_name,
    "model_version": decision_reviews.c.model_version,
    "device": decision_reviews.c.device_id,
    "decided": decision_reviews.c.decided,
}
"""What accuracy can be grouped by (the decided outcome gives per-outcome precision)."""
_ACCURACY_FILTERS = ("line", "model_version", "device", "site", "since", "until")


@dataclass(frozen=True)
class Label:
    """A decision's ground-truth label (its current review)."""

    seq: int
    decision_id: str
    decision_ts: float
    capture_time: float | None
    device_id: str
    line: str
    source: str
    model_name: str
    model_version: str
    bundle_digest: str
    input_digest: str
    thumbnail_on_device: str | None
    decided: str
    label: str
    verdict: str
    note: str
    reviewer: str
    reviewed_at: float


@dataclass(frozen=True)
class Accuracy:
    """Reviews of one group: how many, how many confirmed the device, and which
    decided -> reviewed outcome pairs were seen (``confusion``); intervals are at
    ``confidence``."""

    key: dict[str, str]
    reviewed: int
    confirmed: int
    confusion: dict[tuple[str, str], int]
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def overridden(self) -> int:
        """Reviews that changed the device's outcome."""
        return self.reviewed - self.confirmed

    @property
    def accuracy(self) -> float:
        """confirmed / reviewed."""
        return self.confirmed / self.reviewed

    @property
    def interval(self) -> Proportion:
        """confirmed of reviewed with its Wilson interval at ``confidence``."""
        return proportion(self.confirmed, self.reviewed, self.confidence)

    @property
    def outcomes(self) -> list[OutcomeScore]:
        """Precision and recall of each outcome decided or labelled in the group."""
        return outcome_scores(self.confusion, self.confidence)


def merged(groups: Sequence[Accuracy], key: dict[str, str] | None = None) -> Accuracy | None:
    """The groups together as one (None when there are none); intervals at the first
    group's confidence."""
    if not groups:
        return None
    pairs: dict[tuple[str, str], int] = {}
    for acc in groups:
        for pair, n in acc.confusion.items():
            pairs[pair] = pairs.get(pair, 0) + n
    return Accuracy(
        key or {},
        sum(a.reviewed for a in groups),
        sum(a.confirmed for a in groups),
        pairs,
        groups[0].confidence,
    )


def _text(payload: dict[str, Any], key: str) -> str:
    value = payload.get(key)
    return value if isinstance(value, str) else ""


def labels_since(bind: Bind, since: int = 0, *, limit: int = 1000) -> list[Label]:
    """The labels with ``seq`` above ``since``, in ``seq`` order, at most ``limit``.

    Raises:
        BadQuery: ``since`` is negative or ``limit`` not within 1..MAX_LABELS.
    """
    if since < 0:
        raise BadQuery("since", f"{since} is negative (start from 0)")
    if not 1 <= limit <= MAX_LABELS:
        raise BadQuery("limit", f"{limit} is not within 1..{MAX_LABELS}")
    r = decision_reviews
    query = (
        sa.select(r, decisions.c.source, decisions.c.payload)
        .join(
            decisions,
            sa.and_(decisions.c.device_id == r.c.device_id, decisions.c.id == r.c.decision_id),
        )
        .where(r.c.seq > since)
        .order_by(r.c.seq)
        .limit(limit)
    )
    with reading(bind) as conn:
        rows = conn.execute(query).all()
    out = []
    for row in rows:
        payload: dict[str, Any] = row.payload or {}
        capture = payload.get("capture_time")
        thumb = payload.get("thumbnail")
        out.append(
            Label(
                seq=row.seq,
                decision_id=row.decision_id,
                decision_ts=row.decision_ts,
                capture_time=float(capture) if isinstance(capture, (int, float)) else None,
                device_id=row.device_id,
                line=row.line,
                source=row.source,
                model_name=row.model_name,
                model_version=row.model_version,
                bundle_digest=_text(payload, "bundle_digest"),
                input_digest=_text(payload, "input_digest"),
                thumbnail_on_device=thumb if isinstance(thumb, str) and thumb else None,
                decided=row.decided,
                label=row.outcome,
                verdict=row.verdict,
                note=row.note,
                reviewer=row.reviewer,
                reviewed_at=row.reviewed_at,
            )
        )
    return out


def parse_group(text: str) -> list[str]:
    """``"line,model_version"`` as a list of group keys (:data:`GROUP_KEYS`).

    Raises:
        BadQuery: an unknown or repeated key.
    """
    keys = [k.strip() for k in text.split(",") if k.strip()]
    for key in keys:
        if key not in GROUP_KEYS:
            raise BadQuery("group", f"{key!r} is not one of {', '.join(GROUP_KEYS)}")
    if len(set(keys)) != len(keys):
        raise BadQuery("group", f"{text!r} names a key twice")
    return keys


def accuracy(
    bind: Bind,
    group: Sequence[str],
    f: DecisionFilter,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
) -> list[Accuracy]:
    """Accuracy of the devices' decisions against the reviews, per ``group`` (an empty
    group: one total), over the reviewed decisions matching ``f`` (its ``line``,
    ``model_version``, ``device``, ``site``, ``since`` and ``until``; the line is the
    one the review recorded). Groups come sorted by key; groups without reviews are
    not listed. Their intervals (:attr:`Accuracy.interval`, :attr:`Accuracy.outcomes`)
    are at ``confidence``.

    Raises:
        BadQuery: an unknown group key, a filter accuracy does not take, or a
            ``confidence`` out of range.
    """
    check_confidence(confidence)
    for key in group:
        if key not in GROUP_KEYS:
            raise BadQuery("group", f"{key!r} is not one of {', '.join(GROUP_KEYS)}")
    for name in ("source", "outcome", "reviewed", "disagreement"):
        if getattr(f, name) is not None:
            raise BadQuery(name, f"accuracy takes only {', '.join(_ACCURACY_FILTERS)}")
    r = decision_reviews
    columns = [GROUP_KEYS[k] for k in group]
    where: list[sa.ColumnElement[bool]] = []
    for value, column in (
        (f.line, r.c.line),
        (f.model_version, r.c.model_version),
        (f.device, r.c.device_id),
    ):
        if value is not None:
            where.append(column == value)
    if f.since is not None:
        where.append(r.c.decision_ts >= f.since)
    if f.until is not None:
        where.append(r.c.decision_ts < f.until)
    with reading(bind) as conn:
        if f.site is not None:
            where.append(r.c.device_id.in_(devices_labelled(conn, "site", f.site)))
        query = (
            sa.select(*columns, r.c.decided, r.c.outcome, sa.func.count().label("n"))
            .where(*where)
            .group_by(*columns, r.c.decided, r.c.outcome)
        )
        rows = conn.execute(query).all()
    confusion: dict[tuple[str, ...], dict[tuple[str, str], int]] = {}
    for row in rows:
        values = tuple(str(v) for v in row[: len(group)])
        pairs = confusion.setdefault(values, {})
        pair = (str(row.decided), str(row.outcome))
        pairs[pair] = pairs.get(pair, 0) + int(row.n)
    return [
        Accuracy(
            key=dict(zip(group, values, strict=True)),
            reviewed=sum(pairs.values()),
            confirmed=agreed(pairs),
            confusion=pairs,
            confidence=confidence,
        )
        for values, pairs in sorted(confusion.items())
    ]


def labelled_accuracy(
    bind: Bind, model_name: str, model_version: str, lines: Sequence[str] | None
) -> tuple[int, int]:
    """``(confirmed, reviewed)``: the reviews of ``model_name`` ``model_version``'s
    decisions on ``lines`` (the line each review recorded; None: every line, ``[]``:
    none, so ``(0, 0)``), and how many of them confirmed the device. What a rollout's
    accuracy gates judge (docs/rollouts.md): a Wilson lower bound of confirmed /
    reviewed, or the drop from the previous version on the same lines.
    """
    if lines is not None and not lines:
        return 0, 0
    r = decision_reviews
    where = [r.c.model_name == model_name, r.c.model_version == model_version]
    if lines is not None:
        where.append(r.c.line.in_(sorted(set(lines))))
    confirmed = sa.func.coalesce(sa.func.sum(sa.case((r.c.decided == r.c.outcome, 1), else_=0)), 0)
    query = sa.select(confirmed, sa.func.count()).select_from(r).where(*where)
    with reading(bind) as conn:
        row = conn.execute(query).one()
    return int(row[0]), int(row[1])
