"""Signing in and out: ``POST /login``, ``POST /logout``, ``GET /api/v1/me``.

``POST /login`` takes ``username`` and ``password`` as JSON or as an HTML form
(URL-encoded), sets the session cookie and answers the user, the role, its permissions
and the session's CSRF token. A failure is a 401 that does not say which part was
wrong; too many failures for one user name from one address are a 429 with
``Retry-After``. A request naming a foreign Origin or Referer is refused (403), so that
another site can't sign a browser in as someone else. See docs/users-and-roles.md.
"""

from __future__ import annotations

import math
import urllib.parse
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from agent.wire.untrusted import UntrustedInputError, loads_object
from fleet_server.api.models import ApiModel, error_responses
from fleet_server.audit.middleware import note
from fleet_server.auth import csrf
from fleet_server.auth.deps import (
    Principal,
    authenticated,
    clear_session_cookie,
    form_csrf_token,
    gate_of,
    session_cookie,
    set_session_cookie,
)
from fleet_server.auth.errors import LoginLocked, LoginRefused
from fleet_server.auth.passwords import MAX_PASSWORD

MAX_LOGIN_BODY = 16 * 1024
NO_STORE = {"Cache-Control": "no-store"}

_CREDENTIALS_SCHEMA = {
    "type": "object",
    "required": ["username", "password"],
    "properties": {"username": {"type": "string"}, "password": {"type": "string"}},
}


class MeOut(ApiModel):
    """Who is signed in, and what they may do."""

    username: str = Field(description="User name ('@operator-token' for the bearer token).")
    role: str = Field(description="operator, line-manager or viewer.")
    permissions: list[str] = Field(description="What the role may do (docs/users-and-roles.md).")
    via: str = Field(description="'session' (cookie) or 'token' (bearer).")
    csrf_token: str | None = Field(
        description="Send it as X-CSRF-Token (or form field csrf_token) on every POST, PUT, "
        "PATCH and DELETE made with the session cookie; null for the bearer token."
    )
    expires_at: float | None = Field(description="When the session ends at the latest.")
    idle_timeout_s: int | None = Field(description="The session ends after this long unused.")


def _me(principal: Principal, idle_s: int) -> MeOut:
    s = principal.session
    return MeOut(
        username=principal.name,
        role=principal.role,
        permissions=principal.permissions,
        via=principal.via,
        csrf_token=s.csrf_token if s is not None else None,
        expires_at=s.expires_at if s is not None else None,
        idle_timeout_s=idle_s if s is not None else None,
    )


async def _credentials(request: Request) -> tuple[str, str]:
    body = await request.body()
    if len(body) > MAX_LOGIN_BODY:
        raise HTTPException(413, f"the sign-in body is over {MAX_LOGIN_BODY} bytes")
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    fields: dict[str, Any]
    if media == "application/json":
        try:
            fields = loads_object(body, what="the sign-in body", max_bytes=MAX_LOGIN_BODY)
        except UntrustedInputError as exc:
            raise HTTPException(400, str(exc)) from None
    elif media == csrf.FORM_TYPE:
        try:
            pairs = urllib.parse.parse_qsl(body.decode("utf-8"), max_num_fields=20)
        except (UnicodeDecodeError, ValueError):
            raise HTTPException(400, "the form is not valid URL-encoded UTF-8") from None
        fields = dict(pairs)
    else:
        raise HTTPException(415, "send username and password as JSON or as a URL-encoded form")
    username, password = fields.get("username"), fields.get("password")
    if not isinstance(username, str) or not isinstance(password, str):
        raise HTTPException(400, "username and password are required (strings)")
    if not username or not password or len(username) > 64 or len(password) > MAX_PASSWORD:
        raise HTTPException(401, LoginRefused().reason)
    return username, password


def login_router() -> APIRouter:
    """The sign-in endpoints."""
    router = APIRouter(tags=["users"])

    @router.post(
        "/login",
        responses=error_responses(
            e400="The body is not a JSON object (too deep, too large, NUL or a lone "
            "surrogate in a string: named) or the fields are not strings",
            e401="Wrong user name or password (not told apart)",
            e403="Cross-site request",
            e415="Neither JSON nor a URL-encoded form",
            e429="Too many failed sign-ins for this name from this address",
            e503="Too many password checks at once",
        ),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": _CREDENTIALS_SCHEMA},
                    csrf.FORM_TYPE: {"schema": _CREDENTIALS_SCHEMA},
                },
            }
        },
    )
    async def login(request: Request, response: Response) -> MeOut:
        """Sign in: sets the session cookie; answers the role and the CSRF token."""
        gate = gate_of(request)
        refusal = gate.origin_refusal(request)
        if refusal is not None:
            raise HTTPException(403, refusal)
        username, password = await _credentials(request)
        note(request, actor=username[:64] or "anonymous")
        try:
            signed = await run_in_threadpool(
                gate.service.login, username, password, gate.client(request)
            )
        except LoginLocked as exc:
            retry = str(max(1, math.ceil(exc.retry_after_s)))
            raise HTTPException(429, exc.reason, headers={"Retry-After": retry}) from None
        except LoginRefused as exc:
            raise HTTPException(401, exc.reason) from None
        set_session_cookie(response, request, signed.session_id, gate.settings)
        response.headers.update(NO_STORE)
        s = signed.session
        principal = Principal(s.username, s.role, "session", s)
        return _me(principal, gate.settings.session_idle_s)

    @router.post(
        "/logout",
        status_code=204,
        response_class=Response,
        responses=error_responses(e403="CSRF token missing or wrong, or a cross-site request"),
    )
    async def logout(
        request: Request,
        cookie: Annotated[str | None, Depends(session_cookie)],
        form_token: Annotated[str | None, Depends(form_csrf_token)],
    ) -> Response:
        """End the session (CSRF token required) and drop the cookie; without a live
        session there is nothing to end and the cookie is dropped all the same."""
        gate = gate_of(request)
        if cookie:
            session = await run_in_threadpool(gate.service.session, cookie)
            if session is not None:
                gate.check_unsafe(request, session, form_token)
                await run_in_threadpool(gate.service.logout, cookie)
        answer = Response(status_code=204)
        clear_session_cookie(answer, request)
        return answer

    @router.get(
        "/api/v1/me",
        responses=error_responses(e401="Not signed in"),
    )
    def me(
        request: Request,
        principal: Annotated[Principal, Depends(authenticated)],
        response: Response,
    ) -> MeOut:
        """Who is signed in: name, role, permissions, and the session's CSRF token."""
        response.headers.update(NO_STORE)
        return _me(principal, gate_of(request).settings.session_idle_s)

    return router
