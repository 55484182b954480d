"""FastAPI dependencies: who is calling (:func:`authenticated`) and whether they may
(:func:`require`).

A request is signed in by the operator's bearer token (``Authorization: Bearer``;
the ``operator`` role) or by the session cookie of a user who signed in at
``POST /login`` (the user's role, read at each request). A bearer header wins over a
cookie; a wrong one is a 401, not a fall-back. Cookie-authenticated requests that change
something also pass the CSRF and origin checks of :mod:`fleet_server.auth.csrf` (403).
No credential, or a wrong or expired one: 401. A role without the permission: 403.

The app holds a :class:`Gate` in ``app.state.auth`` (see :func:`install`).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer

from fleet_server.audit.middleware import set_principal
from fleet_server.auth import csrf
from fleet_server.auth.config import AuthSection
from fleet_server.auth.roles import Permission, Role, allows, permissions_of
from fleet_server.auth.service import AuthService
from fleet_server.auth.sessions import Session

COOKIE_NAME = "edgefleet_session"
TOKEN_PRINCIPAL = "@operator-token"  # noqa: S105 (a name, not a secret)
"""The name the operator's bearer token acts under ('@' is never in a user name)."""
NOT_SIGNED_IN = "not signed in: POST /login, or send Authorization: Bearer <operator token>"

bearer = HTTPBearer(auto_error=False, description="The operator API token.")
session_cookie = APIKeyCookie(
    name=COOKIE_NAME,
    auto_error=False,
    description="The session cookie set by POST /login; state-changing requests also "
    "need the session's CSRF token in X-CSRF-Token.",
)


@dataclass(frozen=True)
class Principal:
    """Who a request acts as.

    Attributes:
        name: the user name, or :data:`TOKEN_PRINCIPAL` for the operator token.
        role: the role whose permissions apply.
        via: ``"session"`` (cookie) or ``"token"`` (bearer).
        session: the session, when signed in by cookie.
    """

    name: str
    role: Role
    via: Literal["session", "token"]
    session: Session | None = field(default=None, repr=False)

    def can(self, permission: Permission) -> bool:
        """Whether the principal's role has ``permission``."""
        return allows(self.role, permission)

    @property
    def permissions(self) -> list[str]:
        """The role's permissions, sorted."""
        return sorted(permissions_of(self.role))


def _client(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


class Gate:
    """The API's authentication: the operator token, the sign-in service, the cookie."""

    def __init__(self, service: AuthService, operator_token: str | None) -> None:
        self.service = service
        self.settings: AuthSection = service.settings
        self.operator_token = operator_token

    def client(self, request: Request) -> str:
        """The client's address: the peer, or what a trusted proxy forwarded
        (``[auth] trusted_proxies``, applied by fleet_server.api.forwarded)."""
        return _client(request)

    def origin_refusal(self, request: Request) -> str | None:
        """Why this state-changing request's Origin/Referer is refused (None: fine)."""
        own = f"{request.url.scheme}://{request.url.netloc}"
        return csrf.origin_refusal(
            request.headers.get("origin"),
            request.headers.get("referer"),
            own,
            self.settings.trusted_origins,
        )

    def check_unsafe(self, request: Request, session: Session, form_token: str | None) -> None:
        """The origin and CSRF checks of a cookie-authenticated state-changing request.

        Raises:
            HTTPException: 403 naming the check that failed.
        """
        refusal = self.origin_refusal(request)
        if refusal is not None:
            raise HTTPException(403, refusal)
        given = request.headers.get(csrf.HEADER) or form_token
        if not csrf.tokens_match(session.csrf_token, given):
            what = "wrong" if given else "missing"
            raise HTTPException(
                403,
                f"CSRF token {what}: send the session's token in {csrf.HEADER} "
                f"(or the form field {csrf.FORM_FIELD})",
            )

    def authenticate(
        self,
        request: Request,
        creds: HTTPAuthorizationCredentials | None,
        cookie: str | None,
        form_token: str | None,
    ) -> Principal:
        """The principal of a request (see the module docstring).

        Raises:
            HTTPException: 401 (no or bad credential), 403 (CSRF or origin check).
        """
        if creds is not None:
            expected = self.operator_token
            if expected is None or not hmac.compare_digest(
                creds.credentials.encode(), expected.encode()
            ):
                raise HTTPException(
                    401,
                    "missing or wrong operator token (Authorization: Bearer <token>)",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            principal = Principal(TOKEN_PRINCIPAL, "operator", "token")
            set_principal(request, principal)
            return principal
        if not cookie:
            raise HTTPException(401, NOT_SIGNED_IN, headers={"WWW-Authenticate": "Bearer"})
        session = self.service.session(cookie)
        if session is None:
            raise HTTPException(
                401,
                "session expired or unknown: sign in again (POST /login)",
                headers={"WWW-Authenticate": "Bearer", "Set-Cookie": expired_cookie(request)},
            )
        principal = Principal(session.username, session.role, "session", session)
        set_principal(request, principal)  # the audit trail's actor, refused or not
        if request.method in csrf.UNSAFE_METHODS:
            self.check_unsafe(request, session, form_token)
        return principal


def install(app: FastAPI, gate: Gate) -> None:
    """Make ``gate`` the app's authentication."""
    app.state.auth = gate


def gate_of(request: Request) -> Gate:
    """The app's :class:`Gate`."""
    gate: Gate = request.app.state.auth
    return gate


def cookie_secure(request: Request, settings: AuthSection) -> bool:
    """Whether the session cookie gets ``Secure`` on this request."""
    return settings.cookie_secure == "always" or request.url.scheme == "https"


def set_session_cookie(
    response: Response, request: Request, session_id: str, settings: AuthSection
) -> None:
    """The session cookie: HttpOnly, SameSite=Strict, Path=/, Secure by
    :func:`cookie_secure`; no Max-Age (it ends with the browser, the server ends it
    sooner)."""
    response.set_cookie(
        COOKIE_NAME,
        session_id,
        path="/",
        httponly=True,
        samesite="strict",
        secure=cookie_secure(request, settings),
    )


def expired_cookie(request: Request) -> str:
    """A ``Set-Cookie`` value that removes the session cookie."""
    response = Response()
    clear_session_cookie(response, request)
    return response.headers["set-cookie"]


def clear_session_cookie(response: Response, request: Request) -> None:
    """Tell the browser to drop the session cookie."""
    response.delete_cookie(
        COOKIE_NAME,
        path="/",
        httponly=True,
        samesite="strict",
        secure=cookie_secure(request, gate_of(request).settings),
    )


async def form_csrf_token(request: Request) -> str | None:
    """The ``csrf_token`` field of a URL-encoded form that changes something (and has no
    ``X-CSRF-Token`` header); the body stays readable for the endpoint."""
    if request.method not in csrf.UNSAFE_METHODS or csrf.HEADER in request.headers:
        return None
    content_type = request.headers.get("content-type")
    if not content_type or not content_type.lower().startswith(csrf.FORM_TYPE):
        return None
    return csrf.form_token(content_type, await request.body())


def authenticated(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    cookie: Annotated[str | None, Depends(session_cookie)],
    form_token: Annotated[str | None, Depends(form_csrf_token)],
) -> Principal:
    """Dependency: the request's :class:`Principal` (401/403 as the module says)."""
    return gate_of(request).authenticate(request, creds, cookie, form_token)


def require(permission: Permission) -> Any:
    """Dependency (``dependencies=[require("rollouts:write")]`` or
    ``Annotated[Principal, require(...)]``): a signed-in principal whose role has
    ``permission``; 403 naming it otherwise."""

    def check(principal: Annotated[Principal, Depends(authenticated)]) -> Principal:
        if not principal.can(permission):
            raise HTTPException(403, f"'{principal.name}' ({principal.role}) may not {permission}")
        return principal

    check.__name__ = f"require_{permission.replace(':', '_')}"
    return Depends(check)
