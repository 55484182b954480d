"""The alerts and their deliveries in the database (``alerts``, ``alert_deliveries``).

:func:`apply` writes what an evaluation changed in one transaction fenced by the
leader's epoch (:func:`fleet_server.db.cluster.check_epoch`): the alerts that fire, with
one ``firing`` delivery per webhook routed to, and the alerts that resolve, with one
``resolved`` delivery per webhook their ``firing`` went to. A replica that lost the lead
can't write either, so an alert fires once and resolves once across restarts and
failovers: what fired is in the table, not in a process's memory.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from fleet_server.alerts.rules import Changes, Condition, OpenAlert
from fleet_server.db._tx import Bind, reading, writing
from fleet_server.db.cluster import ROLLOUTS_ROLE, check_epoch
from fleet_server.db.tables import alert_deliveries, alerts

FIRING = "firing"
RESOLVED = "resolved"
PENDING = "pending"
DELIVERED = "delivered"
DEAD = "dead"
STATES = (FIRING, RESOLVED)
MAX_ERROR = 500
"""The most characters of a delivery's last error kept."""


@dataclass(frozen=True)
class AlertRow:
    """One stored alert."""

    alert_id: int
    rule: str
    key: str
    severity: str
    summary: str
    labels: dict[str, str]
    sites: list[str]
    detail: dict[str, Any]
    fired_at: float
    resolved_at: float | None
    epoch: int

    @property
    def state(self) -> str:
        """``firing`` or ``resolved``."""
        return FIRING if self.resolved_at is None else RESOLVED

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the API's and the webhook's ``alert``)."""
        out = dict(vars(self))
        out["state"] = self.state
        return out


@dataclass(frozen=True)
class DeliveryRow:
    """One delivery with its alert."""

    delivery_id: str
    alert: AlertRow
    event: str
    webhook: str
    state: str
    attempts: int
    created_at: float
    next_at: float
    done_at: float | None
    last_status: int | None
    last_error: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the API's dead letters)."""
        out = {k: v for k, v in vars(self).items() if k != "alert"}
        out["alert"] = self.alert.to_dict()
        return out


@dataclass(frozen=True)
class Applied:
    """What :func:`apply` wrote: alert ids fired and resolved, deliveries queued."""

    fired: tuple[int, ...] = ()
    resolved: tuple[int, ...] = ()
    deliveries: int = 0


Router = Callable[[Condition], Sequence[str]]
"""The webhooks (names) a condition's alert goes to."""


def _alert(row: Any, prefix: str = "") -> AlertRow:
    m = row._mapping
    resolved = m[f"{prefix}resolved_at"]
    return AlertRow(
        alert_id=int(m[f"{prefix}alert_id"]),
        rule=m[f"{prefix}rule"],
        key=m[f"{prefix}key"],
        severity=m[f"{prefix}severity"],
        summary=m[f"{prefix}summary"],
        labels=dict(m[f"{prefix}labels"] or {}),
        sites=list(m[f"{prefix}sites"] or []),
        detail=dict(m[f"{prefix}detail"] or {}),
        fired_at=float(m[f"{prefix}fired_at"]),
        resolved_at=None if resolved is None else float(resolved),
        epoch=int(m[f"{prefix}epoch"]),
    )


def open_alerts(bind: Bind) -> list[OpenAlert]:
    """The alerts firing now."""
    a = alerts.c
    query = sa.select(a.alert_id, a.rule, a.key).where(a.resolved_at.is_(None))
    with reading(bind) as conn:
        return [OpenAlert(int(r[0]), r[1], r[2]) for r in conn.execute(query)]


def _delivery_rows(alert_id: int, event: str, webhooks: Iterable[str], now: float
                   ) -> list[dict[str, Any]]:  # fmt: skip
    return [
        {"delivery_id": uuid.uuid4().hex, "alert_id": alert_id, "event": event,
         "webhook": name, "state": PENDING, "attempts": 0, "created_at": now, "next_at": now,
         "done_at": None, "last_status": None, "last_error": ""}
        for name in sorted(set(webhooks))
    ]  # fmt: skip


def apply(
    bind: Bind,
    changes: Changes,
    route: Router,
    *,
    epoch: int,
    now: float,
    role: str = ROLLOUTS_ROLE,
) -> Applied:
    """Fire and resolve as ``changes`` says, in one transaction fenced by ``epoch``.

    An alert already open for a condition's (rule, key) is not fired again, and an
    alert already resolved is not resolved again (the transaction reads them under the
    fence's lock): a second writer changes nothing.

    Raises:
        EpochMismatch: another replica leads since ``epoch`` (nothing is written).
    """
    if not changes:
        return Applied()
    a, d = alerts.c, alert_deliveries.c
    fired: list[int] = []
    resolved: list[int] = []
    queued: list[dict[str, Any]] = []
    with writing(bind) as conn:
        check_epoch(conn, role, epoch)
        held = {
            (r[0], r[1])
            for r in conn.execute(sa.select(a.rule, a.key).where(a.resolved_at.is_(None)))
        }
        for c in changes.fire:
            if (c.rule, c.key) in held:
                continue
            held.add((c.rule, c.key))
            alert_id = _insert(conn, c, epoch, now)
            fired.append(alert_id)
            queued += _delivery_rows(alert_id, FIRING, route(c), now)
        ids = [x.alert_id for x in changes.resolve]
        if ids:
            done = conn.execute(
                alerts.update()
                .where(a.alert_id.in_(ids), a.resolved_at.is_(None))
                .values(resolved_at=now)
                .returning(a.alert_id)
            )
            resolved = sorted(int(r[0]) for r in done)
        if resolved:
            sent = conn.execute(
                sa.select(d.alert_id, d.webhook).where(d.alert_id.in_(resolved), d.event == FIRING)
            ).all()
            by_alert: dict[int, list[str]] = {}
            for alert_id, webhook in sent:
                by_alert.setdefault(int(alert_id), []).append(webhook)
            for alert_id in resolved:
                queued += _delivery_rows(alert_id, RESOLVED, by_alert.get(alert_id, []), now)
        if queued:
            conn.execute(alert_deliveries.insert(), queued)
    return Applied(tuple(fired), tuple(resolved), len(queued))


def _insert(conn: Connection, c: Condition, epoch: int, now: float) -> int:
    values = {"rule": c.rule, "key": c.key, "severity": c.severity, "summary": c.summary,
              "labels": dict(c.labels), "sites": list(c.sites), "detail": dict(c.detail),
              "fired_at": now, "resolved_at": None, "epoch": epoch}  # fmt: skip
    row = conn.execute(alerts.insert().values(**values).returning(alerts.c.alert_id)).first()
    assert row is not None  # noqa: S101 (an INSERT ... RETURNING returns its row)
    return int(row[0])


def list_alerts(
    bind: Bind,
    *,
    state: str | None = None,
    rule: str | None = None,
    site: str | None = None,
    before: int | None = None,
    limit: int = 100,
) -> list[AlertRow]:
    """Alerts newest first (by id): ``state`` firing or resolved (None: both), of
    ``rule``, about ``site``; ``before`` an alert id (the next page)."""
    a = alerts.c
    query = sa.select(alerts).order_by(a.alert_id.desc())
    if state == FIRING:
        query = query.where(a.resolved_at.is_(None))
    elif state == RESOLVED:
        query = query.where(a.resolved_at.is_not(None))
    if rule is not None:
        query = query.where(a.rule == rule)
    if before is not None:
        query = query.where(a.alert_id < before)
    with reading(bind) as conn:
        if site is None:
            return [_alert(r) for r in conn.execute(query.limit(limit))]
        # sites is a JSON list: filtered here, page by page (few alerts name a site)
        out: list[AlertRow] = []
        for row in conn.execute(query):
            alert = _alert(row)
            if site in alert.sites:
                out.append(alert)
                if len(out) >= limit:
                    break
        return out


def get_alert(bind: Bind, alert_id: int) -> AlertRow | None:
    """One alert, or None."""
    with reading(bind) as conn:
        row = conn.execute(sa.select(alerts).where(alerts.c.alert_id == alert_id)).first()
    return None if row is None else _alert(row)


def firing_counts(bind: Bind) -> dict[str, int]:
    """Alerts firing now, by severity."""
    a = alerts.c
    query = (
        sa.select(a.severity, sa.func.count()).where(a.resolved_at.is_(None)).group_by(a.severity)
    )
    with reading(bind) as conn:
        return {str(s): int(n) for s, n in conn.execute(query)}


def _deliveries_query() -> sa.Select[Any]:
    d = alert_deliveries
    return sa.select(d, *[c.label(f"a_{c.name}") for c in alerts.c]).join(
        alerts, alerts.c.alert_id == d.c.alert_id
    )


def _delivery(row: Any) -> DeliveryRow:
    m = row._mapping
    return DeliveryRow(
        delivery_id=m["delivery_id"], alert=_alert(row, "a_"), event=m["event"],
        webhook=m["webhook"], state=m["state"], attempts=int(m["attempts"]),
        created_at=float(m["created_at"]),
        next_at=float(m["next_at"]), done_at=m["done_at"], last_status=m["last_status"],
        last_error=m["last_error"],
    )  # fmt: skip


def due_deliveries(bind: Bind, now: float, limit: int) -> list[DeliveryRow]:
    """Pending deliveries due at ``now``, oldest due first (a firing before its
    resolved: same ``next_at``, the firing was created first)."""
    d = alert_deliveries.c
    query = (
        _deliveries_query()
        .where(d.state == PENDING, d.next_at <= now)
        .order_by(d.next_at, d.created_at, d.event)
        .limit(limit)
    )
    with reading(bind) as conn:
        return [_delivery(r) for r in conn.execute(query)]


def list_deliveries(
    bind: Bind, *, state: str | None = None, alert_id: int | None = None, limit: int = 100
) -> list[DeliveryRow]:
    """Deliveries newest first: in ``state`` (``dead``: the dead letters), of an alert."""
    d = alert_deliveries.c
    query = _deliveries_query().order_by(d.created_at.desc(), d.delivery_id).limit(limit)
    if state is not None:
        query = query.where(d.state == state)
    if alert_id is not None:
        query = query.where(d.alert_id == alert_id)
    with reading(bind) as conn:
        return [_delivery(r) for r in conn.execute(query)]


def count_deliveries(bind: Bind) -> dict[str, int]:
    """Deliveries by state."""
    d = alert_deliveries.c
    query = sa.select(d.state, sa.func.count()).group_by(d.state)
    with reading(bind) as conn:
        return {str(s): int(n) for s, n in conn.execute(query)}


def mark_delivered(bind: Bind, delivery_id: str, *, attempts: int, status: int, now: float) -> None:
    """A 2xx came back."""
    d = alert_deliveries
    with writing(bind) as conn:
        conn.execute(
            d.update()
            .where(d.c.delivery_id == delivery_id, d.c.state == PENDING)
            .values(
                state=DELIVERED, attempts=attempts, done_at=now, last_status=status, last_error=""
            )
        )


def mark_failed(
    bind: Bind,
    delivery_id: str,
    *,
    attempts: int,
    status: int | None,
    error: str,
    next_at: float | None,
    now: float,
) -> None:
    """A try failed: again at ``next_at``, or (None) dead."""
    d = alert_deliveries
    values: dict[str, Any] = {"attempts": attempts, "last_status": status,
                              "last_error": error[:MAX_ERROR]}  # fmt: skip
    if next_at is None:
        values |= {"state": DEAD, "done_at": now}
    else:
        values["next_at"] = next_at
    with writing(bind) as conn:
        conn.execute(
            d.update().where(d.c.delivery_id == delivery_id, d.c.state == PENDING).values(**values)
        )


def retry_dead(bind: Bind, delivery_id: str, now: float) -> bool:
    """Send a dead letter again (pending, due now, its tries counted afresh); whether it
    was one."""
    d = alert_deliveries
    with writing(bind) as conn:
        done = conn.execute(
            d.update()
            .where(d.c.delivery_id == delivery_id, d.c.state == DEAD)
            .values(state=PENDING, attempts=0, next_at=now, done_at=None)
        )
        return int(done.rowcount) == 1


__all__ = [
    "DEAD",
    "DELIVERED",
    "FIRING",
    "PENDING",
    "RESOLVED",
    "AlertRow",
    "Applied",
    "DeliveryRow",
    "Router",
    "apply",
    "count_deliveries",
    "due_deliveries",
    "firing_counts",
    "get_alert",
    "list_alerts",
    "list_deliveries",
    "mark_delivered",
    "mark_failed",
    "open_alerts",
    "retry_dead",
]
