"""What every console page shares: who is signed in, the form checks, rendering with
security headers, and errors shown as pages.

Pages sign in with the session cookie only and go through the API's own
:class:`~fleet_server.auth.deps.Gate`: the same session lookup, the same origin and CSRF
checks on every form post (token in the ``csrf_token`` field), and the same role table.
A page needs a permission (``fleet:read`` to look, ``rollouts:write`` to act on
rollouts); a form post whose role lacks it is refused with 403 and does nothing, whatever
the page showed. Without a live session a page answers 303 to the sign-in page (a
background refresh of part of a page gets 401 and reloads).
"""

from __future__ import annotations

import hashlib
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from fleet_server import timefmt
from fleet_server.auth import csrf
from fleet_server.auth.deps import COOKIE_NAME, Principal, clear_session_cookie, gate_of
from fleet_server.auth.roles import Permission
from fleet_server.errors import FleetError
from fleet_server.web.bundles import Catalog
from fleet_server.web.health import ago

if TYPE_CHECKING:
    from fleet_server.api.context import ServerContext

PREFIX = "/ui"
FRAGMENT_HEADER = "X-Console-Fragment"
"""Sent by the page script when it refreshes part of a page."""
MAX_FORM_BYTES = csrf.MAX_FORM_BYTES
HERE = Path(__file__).resolve().parent
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".svg": "image/svg+xml"}  # fmt: skip
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class PageError(FleetError):
    """A page can't be shown or a form not accepted; shown as an error page.

    Attributes:
        status: the HTTP status.
        reason: one line for the person reading it.
        user: who was signed in, when known (the error page shows the menu then).
    """

    def __init__(self, status: int, reason: str, *, user: Principal | None = None) -> None:
        self.status = status
        self.reason = reason
        self.user = user
        super().__init__(f"{status}: {reason}")


class LoginNeeded(PageError):
    """No live session: the page sends the browser to the sign-in page.

    Attributes:
        next_url: where to come back to after signing in.
    """

    def __init__(self, next_url: str, reason: str = "not signed in") -> None:
        self.next_url = next_url
        super().__init__(401, reason)


def safe_next(value: str | None) -> str:
    """``value`` when it is a console path on this server, else the overview."""
    if (
        value
        and value.startswith(PREFIX + "/")
        and not value.startswith("//")
        and "\\" not in value
    ):
        parts = urllib.parse.urlsplit(value)
        if not parts.scheme and not parts.netloc:
            return value
    return PREFIX + "/"


def _when(ts: float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A stored time in the server's local time (never raises: see fleet_server.timefmt)."""
    return timefmt.stamp(ts, fmt, tz=None)


def _since(ts: float | None, now: float) -> str:
    """How long before ``now`` a stored time was (``7 min ago``), or why it can't say."""
    if ts is None:
        return "never"
    text = timefmt.ago(ts, now)
    return f"{text} ago" if text[:1].isdigit() else text


def _size(n: int | None) -> str:
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = int(seconds)
    if s % 86400 == 0 and s:
        return f"{s // 86400} d"
    if s % 3600 == 0 and s:
        return f"{s // 3600} h"
    if s % 60 == 0 and s:
        return f"{s // 60} min"
    return f"{s} s"


def _static_files() -> dict[str, tuple[bytes, str, str]]:
    out = {}
    for path in sorted((HERE / "static").iterdir()):
        kind = STATIC_TYPES.get(path.suffix)
        if kind is not None and path.is_file():
            data = path.read_bytes()
            out[path.name] = (data, kind, hashlib.sha256(data).hexdigest()[:16])
    return out


class Pages:
    """Templates and static files, and rendering with the security headers: what a page
    needs besides its data (the review bench serves the review pages with this alone)."""

    def __init__(self, *, review: bool = True) -> None:
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(when=_when, since=_since, size=_size, duration=_duration, ago=ago)
        self.env.globals.update(prefix=PREFIX, asset=self.asset)
        self.static: dict[str, tuple[bytes, str, str]] = _static_files()
        self.review = review
        """Whether the decision review pages are served (linked from the menu)."""

    def alert_badge(self) -> tuple[int, str]:
        """(alerts firing, the worst severity) for the menu's badge: none here (the review
        bench); :class:`Console` reads the alerts service's counts."""
        return 0, ""

    def asset(self, name: str) -> str:
        """The URL of a static file, with its content hash (cached for a year)."""
        return f"{PREFIX}/static/{name}?v={self.static[name][2]}"

    def render(
        self,
        request: Request,
        template: str,
        values: Mapping[str, Any],
        *,
        user: Principal | None,
        status: int = 200,
    ) -> HTMLResponse:
        """The page ``template`` with ``values``, the signed-in user and the headers."""
        page = self.env.get_template(template).render(
            **values,
            user=user,
            csrf_token=user.session.csrf_token if user and user.session else "",
            can_write=bool(user and user.can("rollouts:write")),
            review=self.review,
            alert_badge=self.alert_badge(),
            path=request.url.path,
            now=time.time(),
            tz=time.strftime("%Z"),
        )
        return HTMLResponse(page, status_code=status, headers=SECURITY_HEADERS)

    def error_page(self, request: Request, exc: PageError) -> Response:
        """An error as a page (a redirect to sign in for :class:`LoginNeeded`)."""
        if isinstance(exc, LoginNeeded):
            if request.headers.get(FRAGMENT_HEADER):
                return Response(exc.reason, status_code=401, headers=SECURITY_HEADERS)
            target = f"{PREFIX}/login?next={urllib.parse.quote(safe_next(exc.next_url), safe='/')}"
            answer = RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
            if request.cookies.get(COOKIE_NAME):
                clear_session_cookie(answer, request)
            return answer
        return self.render(
            request, "error.html", {"status": exc.status, "reason": exc.reason}, user=exc.user,
            status=exc.status,
        )  # fmt: skip


class Console(Pages):
    """The console's shared parts: :class:`Pages`, the server context and the bundle
    catalog."""

    def __init__(self, ctx: ServerContext, *, review: bool = True) -> None:
        super().__init__(review=review)
        self.ctx = ctx
        self.catalog = Catalog(ctx.repository)

    def alert_badge(self) -> tuple[int, str]:
        """The alerts firing now and the worst severity, as the alerts service last
        counted them (no query; (0, "") without the service)."""
        board = self.ctx.alerts
        return (0, "") if board is None else board.badge()

    @classmethod
    def build(cls, ctx: ServerContext, *, review: bool = True) -> Console:
        """Templates and assets loaded from the package."""
        return cls(ctx, review=review)


def _here(request: Request) -> str:
    query = f"?{request.url.query}" if request.url.query else ""
    return request.url.path + query


def signed_in(
    request: Request, permission: Permission = "fleet:read", form_token: str | None = None
) -> Principal:
    """The session's user, checked as the API checks it (CSRF and origin on a post).

    Raises:
        LoginNeeded: no live session.
        PageError: 403 (CSRF or origin check, or the role lacks ``permission``).
    """
    cookie = request.cookies.get(COOKIE_NAME)
    if not cookie:
        raise LoginNeeded(_here(request) if request.method == "GET" else PREFIX + "/")
    try:
        user = gate_of(request).authenticate(request, None, cookie, form_token)
    except HTTPException as exc:
        if exc.status_code == 401:
            back = _here(request) if request.method == "GET" else PREFIX + "/"
            raise LoginNeeded(back, "your session ended: sign in again") from None
        raise PageError(exc.status_code, str(exc.detail)) from None
    if not user.can(permission):
        raise PageError(403, f"'{user.name}' ({user.role}) may not {permission}", user=user)
    return user


async def read_form(request: Request) -> dict[str, str]:
    """A URL-encoded form post's fields (the first value of each), blank ones kept: a
    field the user emptied is there as ``""``, so a form reads it as blank (for a gate:
    off) rather than as missing (its default).

    Raises:
        PageError: 413 over :data:`MAX_FORM_BYTES`, 415 another body, 400 malformed.
    """
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if media != csrf.FORM_TYPE:
        raise PageError(415, "send the form as application/x-www-form-urlencoded")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise PageError(413, f"the form is over {MAX_FORM_BYTES} bytes")
    try:
        pairs = urllib.parse.parse_qsl(
            body.decode("utf-8"), keep_blank_values=True, max_num_fields=100
        )
    except (UnicodeDecodeError, ValueError):
        raise PageError(400, "the form is not valid URL-encoded UTF-8") from None
    fields: dict[str, str] = {}
    for key, value in pairs:
        fields.setdefault(key, value)
    return fields


async def posted(request: Request, permission: Permission) -> tuple[Principal, dict[str, str]]:
    """A form post's user (checked as :func:`signed_in` says) and its fields."""
    fields = await read_form(request)
    user = await run_in_threadpool(signed_in, request, permission, fields.get(csrf.FORM_FIELD))
    return user, fields
