"""The alerts (``fleet:read``): ``GET /api/v1/alerts`` (firing, resolved or all, by rule
and site, newest first, paged by ``before``), ``GET /api/v1/alerts/{alert_id}`` (one, with
its webhook deliveries) and ``GET /api/v1/alerts/dead-letters`` (deliveries that used
up their tries). Read only: alerts are made by the rules, never through the API."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query
from pydantic import Field

from fleet_server.alerts import store
from fleet_server.alerts.config import RULE_NAMES
from fleet_server.api.context import ServerContext
from fleet_server.api.models import ApiModel, error_responses
from fleet_server.auth.deps import require
from fleet_server.params import MAX_INT, whole

READ = [require("fleet:read")]
MAX_ALERTS = 500


class AlertOut(ApiModel):
    """One alert."""

    alert_id: int = Field(description="Its id (never reused).")
    rule: str = Field(description="The rule that found it.")
    key: str = Field(description="What it is about, unique within the rule while firing.")
    state: str = Field(description="firing or resolved.")
    severity: str = Field(description="info, warning or critical.")
    summary: str = Field(description="One line for a person.")
    labels: dict[str, str] = Field(description="What it is about (device, rollout, line, site).")
    sites: list[str] = Field(description="The sites it concerns (routing to site webhooks).")
    detail: dict[str, Any] = Field(description="Figures that say why.")
    fired_at: float = Field(description="When it fired (Unix s).")
    resolved_at: float | None = Field(description="When it resolved (null while firing).")
    epoch: int = Field(description="The leader's term that fired it.")


class DeliveryOut(ApiModel):
    """One webhook POST owed for an alert's event."""

    delivery_id: str = Field(description="Sent as X-Edgefleet-Delivery on every try.")
    alert_id: int = Field(description="Its alert.")
    event: str = Field(description="firing or resolved.")
    webhook: str = Field(description="The webhook's name.")
    state: str = Field(description="pending, delivered or dead.")
    attempts: int = Field(description="Tries so far.")
    created_at: float = Field(description="When it was owed.")
    next_at: float = Field(description="When the next try is due (pending).")
    done_at: float | None = Field(description="When it was delivered or given up.")
    last_status: int | None = Field(description="The last answer's HTTP status (null: none).")
    last_error: str = Field(description="Why the last try failed.")
    summary: str = Field(description="Its alert's summary.")


class AlertsOut(ApiModel):
    """A page of alerts, newest first."""

    alerts: list[AlertOut] = Field(description="Newest first.")
    firing: dict[str, int] = Field(description="Alerts firing now, by severity.")
    next_before: int | None = Field(description="Pass as before= for the next page.")


class AlertDetailOut(ApiModel):
    """One alert and its deliveries."""

    alert: AlertOut = Field(description="The alert.")
    deliveries: list[DeliveryOut] = Field(description="Its webhook POSTs, newest first.")


class DeadLettersOut(ApiModel):
    """Deliveries that used up their tries, newest first."""

    dead_letters: list[DeliveryOut] = Field(description="Newest first.")


def alert_out(a: store.AlertRow) -> AlertOut:
    return AlertOut(**a.to_dict())


def delivery_out(d: store.DeliveryRow) -> DeliveryOut:
    values = {k: v for k, v in vars(d).items() if k != "alert"}
    return DeliveryOut(**values, alert_id=d.alert.alert_id, summary=d.alert.summary)


def alerts_router(ctx: ServerContext) -> APIRouter:
    """The alerts endpoints."""
    router = APIRouter(prefix="/api/v1/alerts", tags=["alerts"])

    @router.get("", dependencies=READ)
    def alerts(
        state: Annotated[
            Literal["firing", "resolved", "all"], Query(description="Which alerts.")
        ] = "firing",
        rule: Annotated[
            str | None,
            Query(max_length=64, description=f"Only this rule ({', '.join(RULE_NAMES)})."),
        ] = None,
        site: Annotated[
            str | None, Query(max_length=200, description="Only about this site.")
        ] = None,
        before: Annotated[
            int | None, whole("Only alerts with a lower id", ge=1, le=MAX_INT)
        ] = None,
        limit: Annotated[int, whole("At most", ge=1, le=MAX_ALERTS)] = 100,
    ) -> AlertsOut:
        """Alerts newest first (firing ones by default)."""
        if rule is not None and rule not in RULE_NAMES:
            raise HTTPException(400, f"rule: {rule!r} is not one of {', '.join(RULE_NAMES)}")
        rows = store.list_alerts(
            ctx.engine,
            state=None if state == "all" else state,
            rule=rule,
            site=site,
            before=before,
            limit=limit,
        )
        more = len(rows) == limit
        return AlertsOut(
            alerts=[alert_out(a) for a in rows],
            firing=store.firing_counts(ctx.engine),
            next_before=rows[-1].alert_id if more and rows else None,
        )

    @router.get("/dead-letters", dependencies=READ)
    def dead_letters(
        limit: Annotated[int, whole("At most", ge=1, le=MAX_ALERTS)] = 100,
    ) -> DeadLettersOut:
        """Webhook deliveries that used up their tries (or whose webhook is gone)."""
        rows = store.list_deliveries(ctx.engine, state=store.DEAD, limit=limit)
        return DeadLettersOut(dead_letters=[delivery_out(d) for d in rows])

    @router.get("/{alert_id}", dependencies=READ, responses=error_responses(e404="No such alert"))
    def alert(
        alert_id: Annotated[int, Path(ge=1, le=MAX_INT, description="The alert's id.")],
    ) -> AlertDetailOut:
        """One alert with its webhook deliveries."""
        row = store.get_alert(ctx.engine, alert_id)
        if row is None:
            raise HTTPException(404, f"no alert {alert_id}")
        deliveries = store.list_deliveries(ctx.engine, alert_id=alert_id, limit=MAX_ALERTS)
        return AlertDetailOut(
            alert=alert_out(row), deliveries=[delivery_out(d) for d in deliveries]
        )

    return router


__all__ = ["alerts_router"]
