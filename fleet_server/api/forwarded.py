"""Each request's client and scheme taken from forwarded headers when its peer is a
trusted proxy (``[auth] trusted_proxies``; the rules are in
:mod:`fleet_server.auth.proxies`). A pure ASGI middleware."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from fleet_server.auth.proxies import Network, client_address, is_trusted

_WS = {"http": "ws", "https": "wss"}


class ForwardedMiddleware:
    """Sets the request's client and scheme from ``X-Forwarded-For`` and
    ``X-Forwarded-Proto`` when the peer is a trusted proxy (pure ASGI)."""

    def __init__(self, app: ASGIApp, trusted: Sequence[Network]) -> None:
        self.app = app
        self.trusted = list(trusted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and self.trusted:
            client = scope.get("client")
            peer = str(client[0]) if client else ""
            if is_trusted(peer, self.trusted):
                headers = scope.get("headers", ())
                forwarded = [v.decode("latin-1") for k, v in headers if k == b"x-forwarded-for"]
                protos = [v.decode("latin-1") for k, v in headers if k == b"x-forwarded-proto"]
                scope = dict(scope)
                if forwarded:
                    scope["client"] = (client_address(peer, forwarded, self.trusted), 0)
                if protos:
                    proto = protos[-1].split(",")[-1].strip().lower()
                    if proto in ("http", "https"):
                        ws = scope["type"] == "websocket"
                        scope["scheme"] = _WS[proto] if ws else proto
        await self.app(scope, receive, send)
