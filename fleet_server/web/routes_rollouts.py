"""The rollout pages: the list (``/ui/rollouts``), the new-rollout form with its preview,
one rollout's progress (``/ui/rollouts/{id}``, its live part refreshed by the page
script from ``/ui/rollouts/{id}/live``), and the operator actions as form posts.

Reading needs ``fleet:read``; the form, the preview, creating and every action need
``rollouts:write`` and the session's CSRF token, checked by the server on each post
(:func:`fleet_server.web.pages.posted`), so a line manager's post is a 403 that changes
nothing even when sent by hand. A stuck device of a rollout that is rolling back is
resolved from its page (``/ui/rollouts/{id}/devices/{device}/resolve``: retry, accept,
assign a release); every action is kept with the signed-in user's name. Creating and
acting go through the rollout service the API uses (``ServerContext.rollouts``).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from fleet_server.auth.deps import Principal
from fleet_server.db import RolloutConflict, store
from fleet_server.errors import FleetError
from fleet_server.rollout import Rollout, RolloutError, from_dict
from fleet_server.web.charts import progress_bar
from fleet_server.web.pages import PREFIX, SECURITY_HEADERS, Console, PageError, posted, signed_in
from fleet_server.web.rolloutform import RolloutForm, new_rollout_id, preview
from fleet_server.web.rolloutview import (
    ACTIONS,
    BUTTON_TEXT,
    PHASE_CSS,
    RESOLVE_TEXT,
    rollout_page,
    segments,
    status_css,
)

if TYPE_CHECKING:
    from fleet_server.api.ports import RolloutOps

LIST_BAR_WIDTH = 220
MAX_RELEASE_DIGITS = 15


def _release(how: str, raw: str) -> int | None:
    """The release a resolve form names (``assign`` only).

    Raises:
        RolloutError: an unknown ``how``, or ``assign`` without a plain release number.
    """
    if how not in RESOLVE_TEXT:
        raise RolloutError("how", f"{how[:20]!r} is not one of {', '.join(RESOLVE_TEXT)}")
    if how != "assign":
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_RELEASE_DIGITS:
        raise RolloutError("release", f"{text[:20]!r} is not a release number")
    return int(text)


def rollouts_router(console: Console) -> APIRouter:
    """The rollout pages and their form posts."""
    router = APIRouter(prefix=f"{PREFIX}/rollouts", include_in_schema=False)
    engine = console.ctx.engine

    def ops() -> RolloutOps:
        service = console.ctx.rollouts
        if service is None:
            raise PageError(503, "the rollout service is not running")
        return service

    def load(rollout_id: str) -> Rollout:
        record = store.load_rollout(engine, rollout_id)
        if record is None:
            raise PageError(404, f"no rollout {rollout_id!r}")
        return from_dict(record.controller_state)

    def detail(
        request: Request, user: Principal, rollout_id: str, *, template: str = "rollout.html",
        error: str = "", done: str = "", status: int = 200,
    ) -> HTMLResponse:  # fmt: skip
        page = rollout_page(load(rollout_id))
        values = {"p": page, "error": error, "done": done, "status_css": status_css,
                  "button_text": BUTTON_TEXT, "resolve_text": RESOLVE_TEXT}  # fmt: skip
        return console.render(request, template, values, user=user, status=status)

    def form_page(
        request: Request, user: Principal, form: RolloutForm, *, error: str = "",
        planned: Any = None, status: int = 200,
    ) -> HTMLResponse:  # fmt: skip
        bundles = console.catalog.repo.bundles() if console.catalog.repo.initialized() else []
        values = {"form": form, "error": error, "preview": planned, "bundles": bundles}
        return console.render(request, "rollout_new.html", values, user=user, status=status)

    @router.get("")
    def list_page(request: Request) -> HTMLResponse:
        user = signed_in(request)
        rows = []
        for record in reversed(store.list_rollouts(engine)):
            r = from_dict(record.controller_state)
            counts = Counter(d.status for d in r.devices.values())
            bar = progress_bar(segments(counts), len(r.devices), label=r.rollout_id,
                               width=LIST_BAR_WIDTH)  # fmt: skip
            rows.append({"record": record, "rollout": r, "bar": bar, "css": PHASE_CSS[r.phase]})
        return console.render(request, "rollouts.html", {"rows": rows}, user=user)

    @router.get("/new")
    def new_page(request: Request, bundle: str = "") -> HTMLResponse:
        """The form; ``bundle`` (name@version, from the Bundles page) comes chosen."""
        user = signed_in(request, "rollouts:write")
        return form_page(
            request, user, RolloutForm(rollout_id=new_rollout_id(), bundle=bundle[:200])
        )

    @router.post("/preview")
    async def preview_post(request: Request) -> HTMLResponse:
        user, fields = await posted(request, "rollouts:write")
        form = RolloutForm.from_fields(fields)
        try:
            planned = await run_in_threadpool(preview, engine, console.catalog, form)
        except RolloutError as exc:
            return form_page(request, user, form, error=str(exc), status=400)
        return form_page(request, user, form, planned=planned)

    @router.post("")
    async def create(request: Request) -> Response:
        user, fields = await posted(request, "rollouts:write")
        form = RolloutForm.from_fields(fields)
        service = ops()
        try:
            form.spec()
            data = form.spec_data()
            rid = await run_in_threadpool(lambda: service.create(data, rollout_id=form.rollout_id))
        except RolloutConflict:
            rid = form.rollout_id  # the same form posted twice: show what the first made
        except RolloutError as exc:
            return form_page(request, user, form, error=str(exc), status=400)
        target = f"{PREFIX}/rollouts/{rid}?done=created"
        return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)

    @router.get("/{rollout_id}")
    def show(request: Request, rollout_id: str, done: str = "") -> HTMLResponse:
        user = signed_in(request)
        shown = done if done in (*ACTIONS, "created", *RESOLVE_TEXT) else ""
        return detail(request, user, rollout_id, done=shown)

    @router.get("/{rollout_id}/live")
    def live(request: Request, rollout_id: str) -> HTMLResponse:
        user = signed_in(request)
        return detail(request, user, rollout_id, template="_rollout_live.html")

    @router.post("/{rollout_id}/{action}")
    async def act(request: Request, rollout_id: str, action: str) -> Response:
        user, fields = await posted(request, "rollouts:write")
        if action not in ACTIONS:
            raise PageError(404, f"no action {action!r} (one of {', '.join(ACTIONS)})")
        service = ops()
        await run_in_threadpool(load, rollout_id)
        reason = fields.get("reason", "").strip()[:200] or f"{action} by {user.name} (console)"
        try:
            await run_in_threadpool(
                lambda: service.act(rollout_id, action, reason, by=user.name)  # type: ignore[arg-type]
            )
        except (RolloutError, RolloutConflict) as exc:
            why = str(exc)
            return await run_in_threadpool(
                lambda: detail(request, user, rollout_id, error=why, status=409)
            )
        except FleetError as exc:
            raise PageError(503, str(exc)) from exc
        target = f"{PREFIX}/rollouts/{rollout_id}?done={action}"
        return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)

    @router.post("/{rollout_id}/devices/{device_id}/resolve")
    async def resolve(request: Request, rollout_id: str, device_id: str) -> Response:
        user, fields = await posted(request, "rollouts:write")
        service = ops()
        await run_in_threadpool(load, rollout_id)
        how = fields.get("how", "")
        reason = fields.get("reason", "").strip()[:200]
        try:
            release = _release(how, fields.get("release", ""))
            await run_in_threadpool(
                lambda: service.resolve(
                    rollout_id, device_id, how, release=release, reason=reason, by=user.name
                )
            )
        except (RolloutError, RolloutConflict) as exc:
            why = str(exc)
            return await run_in_threadpool(
                lambda: detail(request, user, rollout_id, error=why, status=409)
            )
        except FleetError as exc:
            raise PageError(503, str(exc)) from exc
        target = f"{PREFIX}/rollouts/{rollout_id}?done={how}"
        return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)

    return router
