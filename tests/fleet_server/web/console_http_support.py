"""Support for the console's HTTP tests: a FleetServer in this process (uvicorn on a
free loopback port) with the real rollout service (its directives kept in a list instead
of going to a broker), users of each role with real argon2id hashes, and a small client
that keeps cookies and does not follow redirects, as a browser without a script.
The fixtures are in tests/fleet_server/web/console_http_fixtures.py."""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

import sqlalchemy as sa

from fleet_server.rollout.service import RolloutService
from fleet_server.serve import FleetServer, ServerContext
from tests.fleet_server.users_support import USERS_HASHER
from tests.fleet_server.web.console_server import PASSWORD

HASHER = USERS_HASHER
"""What the console tests add their users with (a password is hashed once: users_support)."""
TIMEOUT_S = 30.0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


@dataclass
class Page:
    status: int
    text: str
    headers: dict[str, str]
    cookies: list[str]

    def field(self, name: str) -> str:
        m = re.search(rf'name="{name}" value="([^"]*)"', self.text)
        assert m is not None, f"no field {name}"
        return m.group(1)


@dataclass
class Client:
    """Cookies kept between requests, redirects not followed (a browser without JS)."""

    base: str
    jar: dict[str, str] = field(default_factory=dict)

    def request(
        self, method: str, path: str, form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Page:  # fmt: skip
        head = dict(headers or {})
        if self.jar:
            head["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.jar.items())
        data = None
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            head["Content-Type"] = "application/x-www-form-urlencoded"
        req = urllib.request.Request(self.base + path, data, head, method=method)  # noqa: S310
        try:
            with _OPENER.open(req, timeout=TIMEOUT_S) as resp:
                raw, status, msg = resp.read(), resp.status, resp.headers
        except urllib.error.HTTPError as exc:
            raw, status, msg = exc.read(), exc.code, exc.headers
        cookies = msg.get_all("Set-Cookie") or []
        for line in cookies:
            for name, morsel in SimpleCookie(line).items():
                if morsel.value:
                    self.jar[name] = morsel.value
                else:
                    self.jar.pop(name, None)
        headers_out = {k.lower(): v for k, v in msg.items()}
        return Page(status, raw.decode("utf-8", "replace"), headers_out, cookies)

    def get(self, path: str) -> Page:
        return self.request("GET", path)

    def post(self, path: str, form: dict[str, str], headers: dict[str, str] | None = None) -> Page:
        return self.request("POST", path, form, headers)

    def login(self, name: str, password: str = PASSWORD) -> Page:
        form = self.get("/ui/login?next=/ui/bundles")
        return self.post("/ui/login", {"username": name, "password": password,
                                         "login_token": form.field("login_token"),
                                         "next": form.field("next")})  # fmt: skip

    def csrf(self) -> str:
        return self.get("/ui/rollouts").field("csrf_token")


class CapturingRollouts:
    """The real rollout service, its messages kept in ``sent`` instead of published."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.sent: list[tuple[str, bytes]] = []
        self.service = RolloutService(
            ctx.engine, repo=ctx.repository, keystore=ctx.keystore,
            publish=lambda topic, payload, _retain, _expiry: self.sent.append((topic, payload)),
        )  # fmt: skip

    def start(self) -> None:
        self.ctx.rollouts = self.service

    def stop(self) -> None:
        self.ctx.rollouts = None


@dataclass
class Console:
    server: FleetServer
    rollouts: CapturingRollouts

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def engine(self) -> sa.Engine:
        return self.server.context.engine

    def client(self, name: str | None = None) -> Client:
        c = Client(self.url)
        if name is not None:
            assert c.login(name).status == 303
        return c


SPEC = {"bundle": "detector@1.5.0", "selector": "site=plant-a,line=1", "waves": "1,2,100%",
        "soak_s": "1h"}  # fmt: skip


def rollout_form(csrf: str, rollout_id: str = "ro-00000000beef") -> dict[str, str]:
    return {"csrf_token": csrf, "rollout_id": rollout_id, "bundle": "detector@1.5.0",
            "selector": "site=plant-a,line=1", "waves": "1,2,100%", "soak": "1h",
            "timezone": "UTC", "max_install_failures": "0", "max_p99_ratio": "1.25",
            "max_outcome_tvd": "0.1"}  # fmt: skip


def first_decision(page: Page) -> str:
    m = re.search(r'href="/ui/decisions/([0-9a-f-]{36})\?back=', page.text)
    assert m is not None, "no decision listed"
    return m.group(1)
