"""The fleet server's HTTP API: an app factory over a :class:`ServerContext`.

Endpoints (OpenAPI at ``/openapi.json``, browsable at ``/docs``): ``GET /healthz``,
``GET /metrics`` (Prometheus; open like /healthz unless ``[metrics] token_env``),
``POST /api/v1/enroll`` (the device's one-time token is its credential), ``POST /login``,
``POST /logout``, ``GET /api/v1/me``, and the fleet endpoints under ``/api/v1`` (devices,
telemetry, tokens, revocation, bundles, rollouts). Each fleet endpoint names the
permission it needs (:func:`fleet_server.auth.deps.require`): the operator's bearer token
has them all, a signed-in user those of their role (docs/users-and-roles.md). No or a
wrong credential: 401; a role without the permission, or a cookie-authenticated change
without its CSRF token: 403. Every error answers ``{"detail": "<one line>"}``.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from agent.kernel.errors import EdgefleetError
from fleet_server.api.actions import actions_router
from fleet_server.api.alerts import alerts_router
from fleet_server.api.audit import audit_router
from fleet_server.api.bodylimit import BodyLimitMiddleware, body_limit_for
from fleet_server.api.cluster import cluster_router
from fleet_server.api.context import ServerContext
from fleet_server.api.decisions import decisions_router
from fleet_server.api.devices import devices_router
from fleet_server.api.enroll import enroll_router
from fleet_server.api.events import events_router
from fleet_server.api.forwarded import ForwardedMiddleware
from fleet_server.api.login import login_router
from fleet_server.api.models import HealthOut, ServiceHealthOut, error_responses
from fleet_server.api.ports import ActionRefused
from fleet_server.api.quality import quality_router
from fleet_server.api.rollouts import rollouts_router
from fleet_server.audit.middleware import AuditMiddleware
from fleet_server.auth import (
    AuthBusy,
    AuthService,
    BadUsername,
    LoginLocked,
    LoginRefused,
    UnknownRole,
    UnknownUser,
    UserExists,
    WeakPassword,
)
from fleet_server.auth.deps import Gate, install
from fleet_server.auth.proxies import parse_networks
from fleet_server.broker import BrokerError
from fleet_server.ca import CAError, NameRefused
from fleet_server.db import RolloutConflict, StorageError, TokenRejected
from fleet_server.errors import FleetError, KeystoreError, RepoError
from fleet_server.metrics.endpoint import install_metrics
from fleet_server.rollout import RolloutError
from fleet_server.web.console import install_console

log = logging.getLogger(__name__)

API_VERSION = "1"


def error_status(exc: Exception) -> int:
    """The HTTP status of a library error."""
    table: tuple[tuple[type[Exception], int], ...] = (
        (TokenRejected, 403),
        (LoginRefused, 401),
        (LoginLocked, 429),
        (AuthBusy, 503),
        (UnknownUser, 404),
        (UserExists, 409),
        (BadUsername, 400),
        (WeakPassword, 400),
        (UnknownRole, 400),
        (RolloutConflict, 409),
        (ActionRefused, 409),
        (RolloutError, 400),
        (StorageError, 503),
        (RepoError, 503),
        (KeystoreError, 503),
        (NameRefused, 400),
        (CAError, 503),
        (BrokerError, 503),
        (FleetError, 500),
        (EdgefleetError, 400),  # a bad bundle, config or wire message from the caller
    )
    for kind, status in table:
        if isinstance(exc, kind):
            return status
    return 500


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _validation_detail(exc: RequestValidationError) -> str:
    parts = []
    for err in list(exc.errors())[:3]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return _one_line("; ".join(parts) or "malformed request")


def _install_error_handlers(app: FastAPI) -> None:
    async def on_library_error(request: Request, exc: Exception) -> JSONResponse:
        status = error_status(exc)
        detail = _one_line(str(exc))
        if status >= 500:
            log.error("%s %s: %s", request.method, request.url.path, detail)
        return JSONResponse({"detail": detail}, status_code=status)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)  # noqa: S101 (registered for it)
        return JSONResponse({"detail": _validation_detail(exc)}, status_code=400)

    app.add_exception_handler(EdgefleetError, on_library_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)


def create_app(ctx: ServerContext) -> FastAPI:
    """The API app serving ``ctx``; it reads ``ctx.rollouts`` at each request."""
    app = FastAPI(
        title="edgefleet fleet server",
        version=API_VERSION,
        description="Enrollment, device registry, telemetry, bundles and staged rollouts.",
        responses=error_responses(e400="Malformed request"),
    )
    _install_error_handlers(app)
    install_metrics(app, ctx)  # first: its latency middleware sits nearest the routes
    # inside the forwarded-headers middleware: it records the client's own address
    app.add_middleware(AuditMiddleware, engine=ctx.engine)
    http = ctx.config.http
    app.add_middleware(
        BodyLimitMiddleware,
        limit_for=body_limit_for(http.max_small_body_bytes, http.max_body_bytes),
    )
    app.add_middleware(ForwardedMiddleware, trusted=parse_networks(ctx.config.auth.trusted_proxies))

    install(app, Gate(AuthService(ctx.engine, ctx.config.auth), ctx.operator_token))
    unauthorized = error_responses(
        e401="Not signed in, or a wrong operator token",
        e403="The role lacks the permission, or the CSRF token is missing or wrong",
    )

    @app.get(
        "/healthz",
        tags=["server"],
        responses={503: {"model": HealthOut, "description": "A part is down"}},
    )
    def healthz(response: Response) -> HealthOut:
        """Whether the database answers, the managed broker runs and every service's probe
        says it works (503 if not)."""
        try:
            with ctx.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            database = True
        except sa.exc.SQLAlchemyError as exc:
            log.warning("health check: database: %s", exc)
            database = False
        broker = ctx.managed_broker is None or ctx.managed_broker.running
        services = {
            name: ServiceHealthOut(ok=part.ok, detail=part.detail)
            for name, part in ctx.health.check().items()
        }
        ok = database and broker and all(s.ok for s in services.values())
        if not ok:
            response.status_code = 503
        return HealthOut(
            status="ok" if ok else "degraded",
            database=database,
            broker=broker,
            rollouts=ctx.rollouts is not None,
            services=services,
        )

    app.include_router(enroll_router(ctx))
    app.include_router(login_router())
    app.include_router(devices_router(ctx), responses=unauthorized)
    app.include_router(actions_router(ctx), responses=unauthorized)
    app.include_router(rollouts_router(ctx), responses=unauthorized)
    app.include_router(decisions_router(ctx), responses=unauthorized)
    app.include_router(quality_router(ctx), responses=unauthorized)
    app.include_router(events_router(ctx), responses=unauthorized)
    app.include_router(cluster_router(ctx), responses=unauthorized)
    app.include_router(audit_router(ctx), responses=unauthorized)
    app.include_router(alerts_router(ctx), responses=unauthorized)
    install_console(app, ctx)
    return app
