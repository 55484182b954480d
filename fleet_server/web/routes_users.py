"""The users page (``/ui/users``, ``users:admin``: operators): every user with role,
state, sessions and password age; add a user, change a role, disable or enable, reset a
password. ``fleetctl users`` does the same on the database.

A new user's first password and a reset one are made here (random, 20 characters) and
shown once on the answer to that post, for the operator to hand over; the server keeps
only its argon2id hash, as for any password. An operator can't disable themselves or
change their own role (a fleet must keep an operator who can sign in). Every post is in
the audit trail (``user.add``, ``user.role``, ``user.disable``, ``user.enable``,
``user.password``).
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from fleet_server.audit.middleware import note
from fleet_server.auth import (
    AuthError,
    UnknownUser,
    add_user,
    count_sessions,
    list_users,
    set_disabled,
    set_password,
    set_role,
)
from fleet_server.auth.deps import Principal, gate_of
from fleet_server.auth.roles import ROLES
from fleet_server.web.pages import PREFIX, SECURITY_HEADERS, Console, PageError, posted, signed_in

PASSWORD_BYTES = 15
"""A made password: 15 random bytes, 20 URL-safe characters."""
DONE = {"role": "Role changed.", "disable": "User disabled; their sessions ended.",
        "enable": "User enabled."}  # fmt: skip


def users_router(console: Console) -> APIRouter:
    """The users page and its forms."""
    router = APIRouter(prefix=f"{PREFIX}/users", include_in_schema=False)
    engine = console.ctx.engine

    def page(
        request: Request, user: Principal, *, status: int = 200, error: str = "",
        done: str = "", made: tuple[str, str] | None = None,
    ) -> HTMLResponse:  # fmt: skip
        values: dict[str, Any] = {
            "users": list_users(engine),
            "sessions": count_sessions(engine),
            "roles": ROLES,
            "error": error,
            "done": done,
            "made": made,
        }
        return console.render(request, "users.html", values, user=user, status=status)

    @router.get("")
    def users_page(request: Request, done: str = "") -> HTMLResponse:
        user = signed_in(request, "users:admin")
        return page(request, user, done=DONE.get(done, ""))

    @router.post("")
    async def add(request: Request) -> Response:
        user, fields = await posted(request, "users:admin")
        name = fields.get("username", "").strip()
        role = fields.get("role", "")
        note(request, target=f"user:{name}", new_role=role)
        password = secrets.token_urlsafe(PASSWORD_BYTES)
        hasher = gate_of(request).service.hasher
        try:
            await run_in_threadpool(add_user, engine, hasher, name, role, password)
        except AuthError as exc:
            why = str(exc)
            return await run_in_threadpool(
                lambda: page(request, user, status=400, error=f"Not added: {why}")
            )
        return await run_in_threadpool(lambda: page(request, user, made=(name, password)))

    @router.post("/{username}/{action}")
    async def change(request: Request, username: str, action: str) -> Response:
        user, fields = await posted(request, "users:admin")
        if action not in ("role", "disable", "enable", "password"):
            raise PageError(404, f"no action {action!r} on a user", user=user)
        if username == user.name and action in ("role", "disable"):
            why = "you can't change your own role or disable yourself: ask another operator"
            return await run_in_threadpool(lambda: page(request, user, status=409, error=why))
        if action == "role":
            note(request, new_role=fields.get("role", ""))
        try:
            if action == "role":
                await run_in_threadpool(set_role, engine, username, fields.get("role", ""))
            elif action in ("disable", "enable"):
                await run_in_threadpool(set_disabled, engine, username, action == "disable")
            else:
                password = secrets.token_urlsafe(PASSWORD_BYTES)
                hasher = gate_of(request).service.hasher
                await run_in_threadpool(set_password, engine, hasher, username, password)
                return await run_in_threadpool(
                    lambda: page(request, user, made=(username, password))
                )
        except UnknownUser:
            raise PageError(404, f"no user {username!r}", user=user) from None
        except AuthError as exc:
            why = str(exc)
            return await run_in_threadpool(lambda: page(request, user, status=400, error=why))
        target = f"{PREFIX}/users?done={action}"
        return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)

    return router
