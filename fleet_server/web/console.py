"""The web console on the API's app: :func:`install_console` adds the pages under
``/ui/``, their static files, the redirect from ``/``, and the handlers that show a
:class:`~fleet_server.web.pages.PageError`, and a ``/ui/`` path no route serves, as a
page. :func:`install_review_pages` adds
the decision review pages alone (the review bench's app)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from fleet_server.auth.deps import Principal
from fleet_server.web.pages import PREFIX, Console, PageError, Pages, signed_in
from fleet_server.web.routes_actions import actions_router
from fleet_server.web.routes_alerts import alerts_router
from fleet_server.web.routes_audit import audit_router
from fleet_server.web.routes_drift import drift_router
from fleet_server.web.routes_fleet import fleet_router
from fleet_server.web.routes_login import login_router
from fleet_server.web.routes_review import review_router
from fleet_server.web.routes_rollouts import rollouts_router
from fleet_server.web.routes_users import users_router

if TYPE_CHECKING:
    from fleet_server.api.context import ServerContext

ASSET_MAX_AGE_S = 365 * 86400


def _assets_router(pages: Pages) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    def root() -> Response:
        return RedirectResponse(f"{PREFIX}/", status_code=307)

    @router.get(f"{PREFIX}")
    def prefix() -> Response:
        return RedirectResponse(f"{PREFIX}/", status_code=307)

    @router.get(PREFIX + "/static/{name}")
    def static(request: Request, name: str) -> Response:
        held = pages.static.get(name)
        if held is None:
            return Response("no such file", status_code=404, media_type="text/plain")
        data, kind, etag = held
        headers = {
            "ETag": f'"{etag}"',
            "Cache-Control": f"public, max-age={ASSET_MAX_AGE_S}, immutable",
            "X-Content-Type-Options": "nosniff",
        }
        if request.headers.get("if-none-match") == f'"{etag}"':
            return Response(status_code=304, headers=headers)
        return Response(data, media_type=kind, headers=headers)

    return router


def _show_errors(app: FastAPI, pages: Pages) -> None:
    async def on_page_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, PageError)  # noqa: S101 (registered for it)
        return pages.error_page(request, exc)

    app.add_exception_handler(PageError, on_page_error)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        # A console path no route serves (or a method it does not take) gets the
        # console's own error page, with the menu when a session is live; the API's
        # paths keep their JSON answers.
        assert isinstance(exc, StarletteHTTPException)  # noqa: S101 (registered for it)
        if request.url.path.startswith(PREFIX + "/") and exc.status_code in (404, 405):
            user = await run_in_threadpool(_user_or_none, request)
            what = "no such page" if exc.status_code == 404 else f"no {request.method} here"
            reason = f"{what}: {request.url.path}"
            return pages.error_page(request, PageError(exc.status_code, reason, user=user))
        return await http_exception_handler(request, exc)

    app.add_exception_handler(StarletteHTTPException, on_http_error)


def _user_or_none(request: Request) -> Principal | None:
    try:
        return signed_in(request)
    except PageError:
        return None


def install_console(app: FastAPI, ctx: ServerContext) -> None:
    """Serve the console from ``app`` over ``ctx`` (see the module docstring)."""
    console = Console.build(ctx)
    _show_errors(app, console)
    for router in (
        _assets_router(console),
        login_router(console),
        fleet_router(console),
        actions_router(console),
        rollouts_router(console),
        drift_router(console),
        alerts_router(console),
        audit_router(console),
        users_router(console),
        review_router(console, ctx.engine),
    ):
        app.include_router(router)


def install_review_pages(app: FastAPI, engine: Engine) -> None:
    """Serve only the decision review pages (``/ui/decisions``) and the static files from
    ``app`` over ``engine``, as :func:`install_console` serves them. The app must have the
    sign-in gate installed (:func:`fleet_server.auth.deps.install`); the review bench
    times the pages this way."""
    pages = Pages()
    _show_errors(app, pages)
    app.include_router(_assets_router(pages))
    app.include_router(review_router(pages, engine))
