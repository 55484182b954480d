"""The sign-in page and signing out.

``GET /ui/login`` shows the form; ``POST /ui/login`` signs in through the same service
as the API's ``POST /login`` (failure limits, lockout, argon2id) and sends the browser on
to the page it came from. The sign-in form has a CSRF token of its own before any
session exists: a random value in a short-lived ``SameSite=Strict`` cookie that the form
must repeat (double submit), besides the origin check the API makes, so another site
can't sign a browser in as someone else. ``POST /ui/logout`` needs the session's CSRF
token.
"""

from __future__ import annotations

import math
import secrets
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from fleet_server.audit.middleware import note
from fleet_server.auth import csrf
from fleet_server.auth.deps import (
    COOKIE_NAME,
    clear_session_cookie,
    cookie_secure,
    gate_of,
    set_session_cookie,
)
from fleet_server.auth.errors import AuthBusy, LoginLocked, LoginRefused
from fleet_server.auth.passwords import MAX_PASSWORD
from fleet_server.web.pages import (
    PREFIX,
    SECURITY_HEADERS,
    Console,
    PageError,
    posted,
    read_form,
    safe_next,
)

LOGIN_CSRF_COOKIE = "edgefleet_login_csrf"
LOGIN_CSRF_TTL_S = 3600


def login_router(console: Console) -> APIRouter:
    """``/ui/login`` and ``/ui/logout``."""
    router = APIRouter(prefix=PREFIX, include_in_schema=False)

    def form(
        request: Request, next_url: str, *, error: str = "", username: str = "", status: int = 200
    ) -> HTMLResponse:
        token = secrets.token_urlsafe(24)
        page = console.render(
            request,
            "login.html",
            {"next_url": next_url, "error": error, "username": username, "login_token": token},
            user=None,
            status=status,
        )
        page.set_cookie(
            LOGIN_CSRF_COOKIE, token, max_age=LOGIN_CSRF_TTL_S, path=f"{PREFIX}/login",
            httponly=True, samesite="strict",
            secure=cookie_secure(request, gate_of(request).settings),
        )  # fmt: skip
        return page

    @router.get("/login")
    def login_page(
        request: Request, next_url: Annotated[str | None, Query(alias="next")] = None
    ) -> Response:
        cookie = request.cookies.get(COOKIE_NAME)
        target = safe_next(next_url)
        if cookie and gate_of(request).service.session(cookie) is not None:
            return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
        return form(request, target)

    @router.post("/login")
    async def login(request: Request) -> Response:
        gate = gate_of(request)
        refusal = gate.origin_refusal(request)
        if refusal is not None:
            raise PageError(403, refusal)
        fields = await read_form(request)
        target = safe_next(fields.get("next"))
        username = fields.get("username", "").strip()
        password = fields.get("password", "")
        note(request, actor=username[:64] or "anonymous")
        expected = request.cookies.get(LOGIN_CSRF_COOKIE)
        if not expected or not csrf.tokens_match(expected, fields.get("login_token")):
            return form(
                request, target, username=username, status=403,
                error="The sign-in form was out of date (or came from elsewhere): try again.",
            )  # fmt: skip
        if not username or not password or len(username) > 64 or len(password) > MAX_PASSWORD:
            return form(request, target, username=username, status=401,
                        error=LoginRefused().reason)  # fmt: skip
        try:
            signed = await run_in_threadpool(
                gate.service.login, username, password, gate.client(request)
            )
        except LoginLocked as exc:
            wait = max(1, math.ceil(exc.retry_after_s))
            page = form(request, target, username=username, status=429,
                        error=f"Too many failed sign-ins: try again in {wait} s.")  # fmt: skip
            page.headers["Retry-After"] = str(wait)
            return page
        except LoginRefused as exc:
            return form(request, target, username=username, status=401, error=exc.reason)
        except AuthBusy:
            return form(request, target, username=username, status=503,
                        error="The server is busy checking passwords: try again.")  # fmt: skip
        answer = RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
        set_session_cookie(answer, request, signed.session_id, gate.settings)
        answer.delete_cookie(LOGIN_CSRF_COOKIE, path=f"{PREFIX}/login")
        return answer

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        await posted(request, "fleet:read")
        cookie = request.cookies.get(COOKIE_NAME)
        if cookie:
            await run_in_threadpool(gate_of(request).service.logout, cookie)
        answer = RedirectResponse(f"{PREFIX}/login", status_code=303, headers=SECURITY_HEADERS)
        clear_session_cookie(answer, request)
        return answer

    return router
