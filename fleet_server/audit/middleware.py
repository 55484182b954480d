"""Every request that may change something, recorded in the audit trail: one pure ASGI
middleware.

A POST, PUT, PATCH or DELETE under ``/api/``, ``/ui/``, ``/login`` or ``/logout`` gets a
row (:mod:`fleet_server.audit.store`) with:

- ``actor`` and ``role``: the principal the request was authenticated as (the API's and
  the console's :class:`~fleet_server.auth.deps.Gate` leave it in the request's state),
  or what the handler named (:func:`note`: the user name a sign-in tried, the device an
  enrollment made), else ``anonymous``;
- ``source``: the client's address (after ``[auth] trusted_proxies``: this middleware
  sits inside the forwarded-headers one);
- ``action`` and ``target``: from the route (:mod:`fleet_server.audit.names`) or the
  handler's :func:`note`;
- ``result``: ``ok`` (status below 400), ``refused`` (4xx: not signed in, a role without
  the permission, a bad request, a conflict), ``failed`` (5xx or an exception); the
  ``detail`` has the status and, for a refusal, the API's one-line reason.

The row is written before the answer's last byte is sent, and an answer in one piece (a
redirect, a JSON object) is held whole until then, its status line too: once a client
has its whole answer, the row is there. A row that can't be written is logged as an error and the
answer still goes out (the change itself is done or refused by then).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import anyio.to_thread
from sqlalchemy.engine import Engine
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleet_server.audit.names import NOT_CHANGES, action_name, target_of
from fleet_server.audit.store import AuditEntry, record

log = logging.getLogger(__name__)

UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
PATHS = ("/api/", "/ui/", "/login", "/logout")
MAX_REASON_BODY = 2048
"""An error answer's body is read for its reason up to this size."""
NOTE_KEY = "audit"
PRINCIPAL_KEY = "principal"


def note(request: Request, **fields: Any) -> None:
    """What the handler knows of its change, for its audit row: ``actor``, ``role``,
    ``target``, ``action`` replace the middleware's; anything else goes into ``detail``.
    ``skip=True`` records nothing (a post that changes nothing)."""
    state = request.scope.setdefault("state", {})
    state.setdefault(NOTE_KEY, {}).update(fields)


def set_principal(request: Request, principal: Any) -> None:
    """The principal a request was authenticated as (called by the auth gate)."""
    request.scope.setdefault("state", {})[PRINCIPAL_KEY] = principal


def _reason(body: bytes, content_type: str) -> str | None:
    if "json" not in content_type or not body:
        return None
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        return None
    return str(detail)[:300] if detail else None


class AuditMiddleware:
    """See the module's docstring."""

    def __init__(self, app: ASGIApp, engine: Engine) -> None:
        self.app = app
        self.engine = engine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in UNSAFE
            or not scope["path"].startswith(PATHS)
        ):
            await self.app(scope, receive, send)
            return
        started = time.time()
        seen: dict[str, Any] = {"status": 0, "content_type": "", "body": b"", "written": False}
        held: list[Message] = []  # the answer's start, until its row is written

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = int(message["status"])
                for name, value in message.get("headers", ()):
                    if name.lower() == b"content-type":
                        seen["content_type"] = value.decode("latin-1").lower()
                held.append(message)  # an empty answer (a redirect) is whole at its start
                return
            if message["type"] == "http.response.body":
                if seen["status"] >= 400 and len(seen["body"]) < MAX_REASON_BODY:
                    seen["body"] += message.get("body", b"")[:MAX_REASON_BODY]
                if not message.get("more_body", False) and not seen["written"]:
                    seen["written"] = True
                    await self._write(scope, started, seen, None)
            while held:
                await send(held.pop(0))
            await send(message)

        try:
            await self.app(scope, receive, wrapped)
        except Exception as exc:
            if not seen["written"]:
                seen["written"] = True
                await self._write(scope, started, seen, exc)
            raise
        if not seen["written"]:  # the client went away before the answer ended
            seen["written"] = True
            await self._write(scope, started, seen, None)

    async def _write(
        self, scope: Scope, started: float, seen: dict[str, Any], exc: BaseException | None
    ) -> None:
        entry = self.entry(scope, started, seen, exc)
        if entry is None:
            return
        try:
            await anyio.to_thread.run_sync(record, self.engine, entry)
        except Exception:
            log.exception("audit: could not record %s %s", entry.action, entry.target)

    @staticmethod
    def entry(
        scope: Scope, started: float, seen: dict[str, Any], exc: BaseException | None
    ) -> AuditEntry | None:
        """The row of a finished request (None: not one to record)."""
        state = scope.get("state") or {}
        notes: dict[str, Any] = dict(state.get(NOTE_KEY) or {})
        route = scope.get("route")
        template = getattr(route, "path", None) or scope["path"]
        method = scope["method"]
        if notes.pop("skip", False) or (method, template) in NOT_CHANGES:
            return None
        params = dict(scope.get("path_params") or {})
        status = int(seen["status"]) or (500 if exc is not None else 0)
        detail: dict[str, Any] = {"status": status, "method": method, "path": scope["path"]}
        if exc is not None:
            detail["error"] = f"{type(exc).__name__}: {exc}"[:300]
        reason = _reason(seen["body"], seen["content_type"]) if status >= 400 else None
        principal = state.get(PRINCIPAL_KEY)
        actor = notes.pop("actor", None) or getattr(principal, "name", None) or "anonymous"
        role = notes.pop("role", None) or getattr(principal, "role", None) or ""
        action = notes.pop("action", None) or action_name(method, template, params)
        target = notes.pop("target", None) or target_of(params)
        if reason is not None and "reason" not in notes:
            detail["reason"] = reason
        extra = {k: v for k, v in params.items() if k != "action"}
        detail.update(extra)
        detail.update(notes)
        if exc is not None or status >= 500 or status == 0:
            result = "failed"
        elif status >= 400:
            result = "refused"
        else:
            result = "ok"
        client = scope.get("client")
        return AuditEntry(
            ts=started,
            actor=str(actor),
            role=str(role),
            source=str(client[0]) if client else "unknown",
            action=str(action),
            target=str(target),
            result=result,
            detail=detail,
        )
