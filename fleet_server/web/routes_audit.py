"""The audit trail page (``/ui/audit``, ``audit:read``): who changed what, when, from
where and how it ended, newest first, with the API's filters (actor, action, target,
result, the last N hours) and a page at a time (``before``: the last row's seq)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from fleet_server.audit.store import RESULTS, AuditFilter, query
from fleet_server.web.pages import PREFIX, Console, PageError, signed_in

PAGE = 100
MAX_QUERY = 200
MAX_HOURS = 24 * 366 * 10


def audit_router(console: Console) -> APIRouter:
    """The audit page."""
    router = APIRouter(prefix=PREFIX, include_in_schema=False)
    engine = console.ctx.engine

    @router.get("/audit")
    def audit_page(
        request: Request,
        actor: Annotated[str, Query(max_length=MAX_QUERY)] = "",
        action: Annotated[str, Query(max_length=MAX_QUERY)] = "",
        target: Annotated[str, Query(max_length=MAX_QUERY)] = "",
        result: Annotated[str, Query(max_length=20)] = "",
        hours: Annotated[str, Query(max_length=20)] = "",
        before: Annotated[str, Query(max_length=20)] = "",
    ) -> HTMLResponse:
        user = signed_in(request, "audit:read")
        if result and result not in RESULTS:
            raise PageError(400, f"result must be one of {', '.join(RESULTS)}", user=user)
        try:
            span_h = float(hours) if hours else None
            cursor = int(before) if before else None
        except ValueError:
            why = "hours must be a number and before a whole number"
            raise PageError(400, why, user=user) from None
        if span_h is not None and not 0 < span_h <= MAX_HOURS:
            raise PageError(400, f"hours must be over 0 and at most {MAX_HOURS}", user=user)
        f = AuditFilter(
            actor=actor or None,
            action=action or None,
            target=target or None,
            result=result or None,
            since=time.time() - span_h * 3600 if span_h is not None else None,
            before_seq=cursor if cursor and cursor > 0 else None,
            limit=PAGE,
        )
        rows = query(engine, f)
        filters = {"actor": actor, "action": action, "target": target, "result": result,
                   "hours": hours}  # fmt: skip
        more = {**{k: v for k, v in filters.items() if v}, "before": str(rows[-1].seq)}
        values = {
            "rows": rows,
            "f": filters,
            "results": RESULTS,
            "next": more if len(rows) == PAGE else None,
        }
        return console.render(request, "audit.html", values, user=user)

    return router
