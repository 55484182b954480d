"""``GET /metrics`` on the fleet server's API: a registry of the app's own (never the
global one), the collector of the fleet's figures, the HTTP latency middleware, and
the access rule of ``[metrics]`` (:mod:`fleet_server.metrics.config`).

Access, as decided in docs/metrics.md: without ``[metrics] token_env`` the endpoint is
open like ``/healthz`` (the API listens on loopback unless configured otherwise); with
it, a scrape sends ``Authorization: Bearer <token>``, the scrape token or the operator
token, else 401. A Prometheus server can hold a bearer token; it can't sign in to the
console.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from agent.kernel.secrets import read_secret
from fleet_server.errors import FleetError
from fleet_server.metrics.collector import FleetCollector
from fleet_server.metrics.config import MetricsSection
from fleet_server.metrics.dbfigures import CachedFigures
from fleet_server.metrics.http import LatencyMiddleware, http_histogram

if TYPE_CHECKING:
    from fleet_server.api.context import ServerContext
    from fleet_server.config import FleetServerConfig

METRICS_PATH = "/metrics"
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""Prometheus text format 0.0.4, as the agent's /metrics."""


class MetricsError(FleetError):
    """``/metrics`` can't be set up as configured.

    Attributes:
        reason: what is wrong.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"metrics: {reason}")


def metrics_settings(config: FleetServerConfig) -> MetricsSection:
    """The ``[metrics]`` section (its defaults where the configuration has none)."""
    section = getattr(config, "metrics", None)
    return section if isinstance(section, MetricsSection) else MetricsSection()


def scrape_token(settings: MetricsSection) -> str | None:
    """The scrape token named by ``token_env`` (None when none is named).

    Raises:
        MetricsError: the variable is named but neither set nor a credential file.
    """
    if settings.token_env is None:
        return None
    token = read_secret(settings.token_env)
    if not token:
        raise MetricsError(
            f"[metrics] token_env: ${settings.token_env} is not set (nor a credential "
            "file of that name): set it, or remove token_env to serve /metrics like /healthz"
        )
    return token


def _bearer(request: Request) -> str | None:
    value = request.headers.get("authorization", "")
    scheme, _, credential = value.partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        return None
    return credential.strip()


def _matches(given: str, expected: str | None) -> bool:
    return expected is not None and hmac.compare_digest(given.encode(), expected.encode())


def build_registry(ctx: ServerContext, settings: MetricsSection) -> CollectorRegistry:
    """A registry with the fleet collector (the HTTP histogram is added by
    :func:`install_metrics`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(ctx, CachedFigures(ctx.engine, settings.cache_s)))
    return registry


def install_metrics(app: FastAPI, ctx: ServerContext) -> CollectorRegistry | None:
    """Add the latency middleware and ``GET /metrics`` to ``app``; returns the
    registry (None when ``[metrics] enabled = false``: neither is added). Call it before
    adding other middleware, so that this one sits nearest the routes and sees their
    answers (HTTP errors included).

    Raises:
        MetricsError: a scrape token is configured but not set.
    """
    settings = metrics_settings(ctx.config)
    if not settings.enabled:
        return None
    token = scrape_token(settings)
    registry = build_registry(ctx, settings)
    app.add_middleware(LatencyMiddleware, histogram=http_histogram(registry))

    @app.get(
        METRICS_PATH,
        tags=["server"],
        response_class=Response,
        responses={
            200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"},
            401: {"description": "[metrics] token_env is set and no or a wrong token came"},
        },
    )
    def metrics(request: Request) -> Response:
        """The fleet server's metrics in Prometheus text format (docs/metrics.md):
        open like /healthz, or with ``[metrics] token_env`` set, for a bearer of the
        scrape token or the operator token."""
        if token is not None:
            given = _bearer(request)
            if given is None or not (_matches(given, token) or _matches(given, ctx.operator_token)):
                return JSONResponse(
                    {"detail": "missing or wrong metrics token (Authorization: Bearer <token>)"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return Response(generate_latest(registry), media_type=CONTENT_TYPE)

    return registry


__all__ = ["METRICS_PATH", "MetricsError", "install_metrics", "metrics_settings"]
