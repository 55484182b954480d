"""A device's remote actions in the console: the Logs tab (``/ui/devices/{id}/logs``:
ask for the newest lines, from a time, holding a text; see what came back, secrets taken
out), the action buttons of the device page (restart, reload, diagnostics) as form posts
(``/ui/devices/{id}/actions``), the device's requests with their state and reason,
refreshed while one is under way (``.../actions/live``), and the diagnostics archive's
download. Looking needs ``fleet:read``; asking, reading logs and downloading need
``devices:act`` and the session's CSRF token (:func:`fleet_server.web.pages.posted`).
Asking goes through the same service as the API (``ServerContext.actions``)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from agent.wire.actions import ACTION_DIAGNOSTICS, ACTION_LOGS, ACTIONS, MAX_LINES
from fleet_server.actions import store
from fleet_server.actions.errors import ActionError
from fleet_server.actions.store import ActionRecord
from fleet_server.audit.middleware import note
from fleet_server.auth.deps import Principal
from fleet_server.db import store as db
from fleet_server.web.pages import PREFIX, SECURITY_HEADERS, Console, PageError, posted, signed_in

SPANS = {"15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400}
LIVE = ("pending", "accepted", "running")
STATE_CSS = {"ok": "st-done", "refused": "st-failed", "failed": "st-failed",
             "running": "st-installing", "accepted": "st-installing", "pending": "st-pending",
             "superseded": "st-pending", "expired": "st-pending"}  # fmt: skip
RECENT = 10
MAX_GREP = 200


def _row(record: ActionRecord, got: store.Received, now: float) -> dict[str, Any]:
    state = store.state(record, now)
    return {
        "r": record,
        "state": state,
        "css": STATE_CSS.get(state, "st-pending"),
        "received": got,
        "complete": state == "ok" and got.chunks == record.chunks,
    }


def recent_rows(engine: Any, device_id: str) -> list[dict[str, Any]]:
    """The device's newest requests as the device page lists them."""
    now = time.time()
    return [
        _row(r, got, now) for r, got in store.list_with_received(engine, device_id, limit=RECENT)
    ]


def live_rows(rows: list[dict[str, Any]]) -> bool:
    """Whether one of ``rows`` is under way (the page refreshes them meanwhile)."""
    return any(x["state"] in LIVE for x in rows)


def actions_router(console: Console) -> APIRouter:
    """The Logs tab, the action buttons' posts, the live list, the archive."""
    router = APIRouter(prefix=f"{PREFIX}/devices/{{device_id}}", include_in_schema=False)
    ctx = console.ctx
    engine = ctx.engine

    def known(device_id: str, user: Principal) -> None:
        if db.get_device(engine, device_id) is None:
            raise PageError(404, f"no device {device_id!r}", user=user)

    def actions_part(request: Request, user: Principal, device_id: str) -> HTMLResponse:
        rows = recent_rows(engine, device_id)
        values = {"device_id": device_id, "rows": rows, "can_act": user.can("devices:act"),
                  "live": live_rows(rows)}  # fmt: skip
        return console.render(request, "_device_actions.html", values, user=user)

    @router.get("/actions/live")
    def live(request: Request, device_id: str) -> HTMLResponse:
        user = signed_in(request)
        return actions_part(request, user, device_id)

    @router.post("/actions")
    async def ask(request: Request, device_id: str) -> Response:
        user, fields = await posted(request, "devices:act")
        action = fields.get("action", "")
        note(request, kind=action[:40])
        if action not in ACTIONS:
            raise PageError(
                400, f"action {action[:40]!r} is not one of {', '.join(ACTIONS)}", user=user
            )
        params: dict[str, Any] = {}
        back = f"{PREFIX}/devices/{device_id}"
        if action == ACTION_LOGS:
            span = fields.get("since", "1h")
            if span not in SPANS:
                raise PageError(
                    400, f"since {span[:10]!r} is not one of {', '.join(SPANS)}", user=user
                )
            lines = fields.get("lines", "200").strip()
            if not lines.isdigit() or not 1 <= int(lines) <= MAX_LINES:
                raise PageError(
                    400, f"lines {lines[:12]!r} is not a number in [1, {MAX_LINES}]", user=user
                )
            params = {"since_s": SPANS[span], "lines": int(lines)}
            grep = fields.get("grep", "").strip()[:MAX_GREP]
            if grep:
                params["grep"] = grep
        service = ctx.actions
        if service is None:
            raise PageError(503, "the remote actions service is not running", user=user)
        try:
            record = await run_in_threadpool(
                lambda: service.request(device_id, action, params, expires_s=3600, by=user.name)
            )
        except ActionError as exc:
            raise PageError(exc.status, exc.reason, user=user) from exc
        note(request, request_id=record.request_id)
        target = (
            f"{back}/logs?request={record.request_id}" if action == ACTION_LOGS
            else f"{back}?asked={record.request_id}#actions"
        )  # fmt: skip
        return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)

    @router.get("/logs")
    def logs_tab(request: Request, device_id: str, request_id: str = "") -> HTMLResponse:
        user = signed_in(request)
        known(device_id, user)
        request_id = request.query_params.get("request", request_id)
        mine = [r for r in store.list_for_device(engine, device_id, limit=50)
                if r.action == ACTION_LOGS]  # fmt: skip
        chosen = next((r for r in mine if r.request_id == request_id), mine[0] if mine else None)
        can_act = user.can("devices:act")
        text = ""
        if chosen is not None and can_act:
            text = b"".join(d for _, d in store.read_chunks(engine, chosen.request_id)).decode(
                "utf-8", "replace"
            )
        got = store.received(engine, chosen.request_id) if chosen is not None else None
        row = _row(chosen, got, time.time()) if chosen is not None and got is not None else None
        values = {"device_id": device_id, "row": row, "text": text, "can_act": can_act,
                  "spans": list(SPANS), "others": mine[:RECENT],
                  "live": row is not None and row["state"] in LIVE}  # fmt: skip
        return console.render(request, "device_logs.html", values, user=user)

    @router.get("/actions/{request_id}/archive")
    def archive(request: Request, device_id: str, request_id: str) -> Response:
        user = signed_in(request, "devices:act")
        record = store.get(engine, request_id)
        if record is None or record.device_id != device_id:
            raise PageError(404, f"no action {request_id!r} on {device_id!r}", user=user)
        if record.action != ACTION_DIAGNOSTICS or store.state(record, time.time()) != "ok":
            raise PageError(409, f"{request_id} has no archive ({record.action}, "
                            f"{store.state(record, time.time())})", user=user)  # fmt: skip
        data = store.read_all(engine, record)
        if data is None:
            raise PageError(410, f"{request_id}: its chunks are not all here (pruned, or lost "
                            "on the way): ask for diagnostics again", user=user)  # fmt: skip
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(record.answered_at or time.time()))
        name = f"diagnostics-{device_id}-{stamp}.tar.gz"
        headers = {**SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="{name}"'}
        return Response(data, media_type="application/gzip", headers=headers)

    return router
