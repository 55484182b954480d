"""A small HTTP client for the sign-in tests: JSON or form bodies, the session cookie and
the CSRF token kept between requests as the console's pages will, every ``Set-Cookie``
of an answer kept for inspection."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

from fleet_server.auth.deps import COOKIE_NAME
from tests.fleet_server.fleet_api_support import HTTP_TIMEOUT_S

PASSWORD = "correct horse battery"  # noqa: S105 (test only)


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]
    cookies: list[str]

    def cookie(self) -> SimpleCookie:
        jar: SimpleCookie = SimpleCookie()
        for line in self.cookies:
            jar.load(line)
        return jar


def send(
    method: str,
    url: str,
    *,
    body: Any = None,
    form: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """One request; an error status is a reply, not an exception."""
    head = dict(headers or {})
    data = None
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
        head["Content-Type"] = "application/x-www-form-urlencoded"
    elif body is not None:
        data = json.dumps(body).encode()
        head["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=head, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310
            raw, status, msg = resp.read(), resp.status, resp.headers
    except urllib.error.HTTPError as exc:
        raw, status, msg = exc.read(), exc.code, exc.headers
    cookies = msg.get_all("Set-Cookie") or []
    return Reply(
        status, json.loads(raw) if raw else None, {k.lower(): v for k, v in msg.items()}, cookies
    )


@dataclass
class Browser:
    """Keeps the session cookie and the CSRF token, as the console's pages will."""

    base: str
    session: str | None = None
    csrf: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def login(self, username: str, password: str = PASSWORD, *, as_form: bool = False) -> Reply:
        creds = {"username": username, "password": password}
        reply = send(
            "POST",
            self.base + "/login",
            body=None if as_form else creds,
            form=creds if as_form else None,
            headers=self.extra,
        )
        if reply.status == 200:
            self.session = reply.cookie()[COOKIE_NAME].value
            self.csrf = reply.body["csrf_token"]
        return reply

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        csrf: str | bool | None = True,
        headers: dict[str, str] | None = None,
        form: dict[str, str] | None = None,
    ) -> Reply:
        head = {**self.extra, **(headers or {})}
        if self.session is not None:
            head["Cookie"] = f"{COOKIE_NAME}={self.session}"
        token = self.csrf if csrf is True else csrf or None
        if token is not None:
            head["X-CSRF-Token"] = token
        return send(method, self.base + path, body=body, form=form, headers=head)
