"""The alerts page (``/ui/alerts``, ``fleet:read``): the alerts firing now (or resolved,
or all), by rule and site, each with what it is about linked to its page, and the dead
letters: webhook deliveries that used up their tries. The menu's badge (every page)
reads the counts the alerts service keeps in memory (:class:`fleet_server.alerts.board.AlertBoard`),
not the database."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from fleet_server.alerts import store
from fleet_server.alerts.config import RULE_NAMES
from fleet_server.web.pages import PREFIX, Console, PageError, signed_in

MAX_QUERY = 200
SHOWN = 200
"""The most alerts (and dead letters) one page shows."""
SEVERITY_CSS = {"critical": "lvl-bad", "warning": "lvl-warn", "info": "lvl-unknown"}
STATES = ("firing", "resolved", "all")


def alerts_router(console: Console) -> APIRouter:
    """The alerts page."""
    router = APIRouter(prefix=PREFIX, include_in_schema=False)
    engine = console.ctx.engine

    @router.get("/alerts")
    def alerts_page(
        request: Request,
        state: Annotated[str, Query(max_length=MAX_QUERY)] = "firing",
        rule: Annotated[str, Query(max_length=MAX_QUERY)] = "",
        site: Annotated[str, Query(max_length=MAX_QUERY)] = "",
    ) -> HTMLResponse:
        user = signed_in(request)
        if state not in STATES:
            raise PageError(400, f"state {state!r} is not one of {', '.join(STATES)}", user=user)
        if rule and rule not in RULE_NAMES:
            raise PageError(400, f"rule {rule!r} is not one of the rules", user=user)
        rows = store.list_alerts(
            engine,
            state=None if state == "all" else state,
            rule=rule or None,
            site=site or None,
            limit=SHOWN,
        )
        values = {
            "alerts": rows,
            "firing": store.firing_counts(engine),
            "dead": store.list_deliveries(engine, state=store.DEAD, limit=SHOWN),
            "severity_css": SEVERITY_CSS,
            "rules": RULE_NAMES,
            "f": {"state": state, "rule": rule, "site": site},
            "shown": SHOWN,
        }
        return console.render(request, "alerts.html", values, user=user)

    return router
