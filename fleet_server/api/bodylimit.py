"""Request bodies bounded before they are read: one pure ASGI middleware.

A body whose ``Content-Length`` is over the route's limit is answered 413 before a byte
of it is read (the app is not called). A body of unknown length (chunked) is counted as
it streams through ``receive``: the chunk that passes the limit is not handed on, the
client gets 413 at once, and the app sees the client gone (what it then answers is
dropped). So the server holds at most the limit plus one chunk of any body, whoever sent
it and whether or not they are signed in.

Limits (``[http]`` of fleet.toml): :attr:`~fleet_server.config.HttpSection.max_small_body_bytes`
for the endpoints anyone may call (sign-in and -out, enrollment) and the console's form
posts, which are read before the session is checked;
:attr:`~fleet_server.config.HttpSection.max_body_bytes` for everything else.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

SMALL_PATHS = frozenset({"/login", "/logout", "/api/v1/enroll", "/ui/login", "/ui/logout"})
"""Endpoints anyone may call: their bodies are a few hundred bytes (a CSR a few KiB)."""
SMALL_PREFIXES = ("/ui/",)
"""The console's form posts (read before the session is checked)."""


def body_limit_for(small: int, default: int) -> Callable[[str], int]:
    """The limit of a request path: ``small`` for :data:`SMALL_PATHS` and the console,
    ``default`` for the rest."""

    def limit(path: str) -> int:
        if path in SMALL_PATHS or path.startswith(SMALL_PREFIXES):
            return small
        return default

    return limit


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length before we run
    return None


def _refusal(limit: int, size: int, method: str, path: str, *, declared: bool) -> bytes:
    size_text = f"{size} bytes" if declared else f"more than {limit} bytes, still sending"
    detail = f"request body too large for {method} {path}: {size_text}; the limit is {limit} bytes"
    return json.dumps({"detail": detail}).encode()


async def _answer_413(send: Send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Refuses (413) a request body over the limit of its path (see the module)."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = str(scope.get("path", "")), str(scope.get("method", ""))
        limit = self.limit_for(path)
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            log.info("refused %s %s: Content-Length %d over %d", method, path, declared, limit)
            await _answer_413(send, _refusal(limit, declared, method, path, declared=True))
            return
        seen = 0
        started = False
        answered = False
        cut = False

        async def bounded_receive() -> Message:
            nonlocal seen, answered, cut
            if cut:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    cut = True
                    log.info("refused %s %s: body over %d bytes", method, path, limit)
                    if not started:
                        answered = True
                        await _answer_413(send, _refusal(limit, seen, method, path, declared=False))
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:
                return  # the 413 went out; what the app says about the cut body is dropped
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, bounded_receive, guarded_send)
        except Exception as exc:
            if not cut:
                raise
            # The app saw the client go away mid-body (ClientDisconnect or its own error
            # about a short body): expected after a refusal, not a fault.
            log.debug("%s %s after its body was cut: %s", method, path, type(exc).__name__)
