"""HTTP request latency per route: an ASGI middleware that times each request into a
histogram labelled by the route's template (``/api/v1/devices/{device_id}``), never
the raw path, so that the labels stay as few as the app's routes.

A request no route matched is labelled :data:`UNMATCHED`; a method outside
:data:`METHODS` is ``OTHER``. The time runs from the request's arrival at this
middleware to the end of the response body (or to the exception that ended it, as a
500).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HTTP_METRIC = "edgefleet_fleet_http_request_duration_seconds"
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "<unmatched>"


def http_histogram(registry: CollectorRegistry) -> Histogram:
    """The latency histogram, registered in ``registry``."""
    return Histogram(
        HTTP_METRIC,
        "HTTP requests served, by method, route template and status code.",
        ["method", "route", "status"],
        buckets=BUCKETS_S,
        registry=registry,
    )


def route_template(scope: Scope) -> str:
    """The template of the route that served ``scope`` (set by the router), else
    :data:`UNMATCHED`."""
    route = scope.get("route")
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    return template if isinstance(template, str) and template else UNMATCHED


class LatencyMiddleware:
    """Times every HTTP request into ``histogram`` (see the module docstring)."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            method = str(scope.get("method", "")).upper()
            self.histogram.labels(
                method if method in METHODS else "OTHER", route_template(scope), str(status)
            ).observe(time.perf_counter() - began)


__all__ = ["HTTP_METRIC", "LatencyMiddleware", "http_histogram", "route_template"]
