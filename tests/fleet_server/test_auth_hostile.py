"""Hostile sign-ins: forwarded headers believed only from trusted proxies (read right to
left), failures throttled per (name, address), per address and per name, and bodies
that are deep, hold NUL or lone surrogates answered 400/401, never 500. The rules
(fleet_server/auth/proxies.py, limiter.py) are tested pure; the rest against a fleet
server in this process over real HTTP, on SQLite and PostgreSQL where the database sees
the text."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.wire.enroll import ENROLL_PATH
from fleet_server.auth import AuthSection, PasswordHasher, add_user
from fleet_server.auth.deps import COOKIE_NAME
from fleet_server.auth.limiter import SignInThrottle
from fleet_server.auth.proxies import client_address, parse_networks, throttle_key
from fleet_server.db import sqlite_url
from fleet_server.serve import FleetServer
from tests.fleet_server.auth_client import PASSWORD, Browser, Reply, send
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    LocalRolloutOps,
    RunningApi,
    api_config,
    make_repository,
)
from tests.fleet_server.web.console_http_support import Client

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db_url (SQLite and PostgreSQL)

Start = Callable[..., RunningApi]
WRONG = "not the password at all"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("hostile-auth-repo"))


@pytest.fixture
def start(
    tmp_path: Path, repository: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Start]:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    servers: list[FleetServer] = []

    def run(db_url: str | None = None, **auth: object) -> RunningApi:
        url = db_url or sqlite_url(tmp_path / f"fleet{len(servers)}.db")
        cfg = api_config(tmp_path / f"state{len(servers)}", *repository, db_url=url)
        cfg = cfg.model_copy(update={"auth": AuthSection.model_validate(auth)})
        server = FleetServer(cfg, services=[LocalRolloutOps])
        server.start()
        servers.append(server)
        for name in ("olga", "lena"):
            add_user(server.context.engine, PasswordHasher(), name, "operator", PASSWORD)
        return RunningApi(server)

    yield run
    for server in servers:
        server.stop()


# -- the rules, pure ------------------------------------------------------------------


def test_the_client_is_the_rightmost_untrusted_hop_and_only_behind_a_trusted_proxy() -> None:
    proxies = parse_networks(["127.0.0.1/32", "10.0.0.0/8"])
    xff = ["198.51.100.9, 203.0.113.7", "10.1.2.3"]
    assert client_address("127.0.0.1", xff, proxies) == "203.0.113.7"
    assert client_address("192.0.2.1", xff, proxies) == "192.0.2.1"  # peer not trusted
    assert client_address("127.0.0.1", xff, []) == "127.0.0.1"  # nobody trusted
    assert client_address("127.0.0.1", ["10.0.0.1, 10.0.0.2"], proxies) == "10.0.0.1"
    assert client_address("127.0.0.1", [], proxies) == "127.0.0.1"
    assert client_address("::ffff:10.0.0.4", ["2001:db8::1"], proxies) == "2001:db8::1"
    with pytest.raises(ValueError, match="'nope' is not an address or CIDR block"):
        parse_networks(["nope"])
    with pytest.raises(ValidationError, match=r"'10\.0\.0\.0/33' is not an address"):
        AuthSection(trusted_proxies=["10.0.0.0/33"])


def test_failures_lock_an_address_across_names_and_a_name_across_addresses() -> None:
    throttle = SignInThrottle(3, 10.0, per_address=5, per_user=8)
    for i in range(5):  # one address, a different name each time
        throttle.failed(f"user{i}", "192.0.2.1", 0.0)
    assert throttle.locked_for("someone-else", "192.0.2.1", 1.0) == 9.0
    assert throttle.locked_for("someone-else", "192.0.2.2", 1.0) == 0.0
    for i in range(8):  # one name, a different address each time
        throttle.failed("olga", f"198.51.100.{i}", 0.0)
    assert throttle.locked_for("olga", "203.0.113.1", 1.0) == 9.0
    throttle.succeeded("olga", "198.51.100.0")
    assert throttle.locked_for("olga", "203.0.113.1", 1.0) == 9.0  # a success clears the pair
    assert throttle_key("2001:db8:1:2::7") == throttle_key("2001:db8:1:2:ffff::1")
    assert throttle_key("2001:db8:1:2::7") == "2001:db8:1:2::/64"


# -- over HTTP ------------------------------------------------------------------------


def test_a_forged_x_forwarded_for_does_not_escape_the_lockout(start: Start) -> None:
    api = start()
    limit = AuthSection().login_max_failures
    for i in range(limit):
        spoof = {"X-Forwarded-For": f"203.0.113.{i}"}
        assert Browser(api.url, extra=spoof).login("olga", WRONG).status == 401
    again = Browser(api.url, extra={"X-Forwarded-For": "198.51.100.77"}).login("olga")
    assert again.status == 429, again.body
    assert "too many failed attempts" in again.body["detail"]


def test_behind_a_trusted_proxy_the_forwarded_address_is_throttled_and_https_applies(
    start: Start,
) -> None:
    api = start(trusted_proxies=["127.0.0.1/32"])
    limit = AuthSection().login_max_failures
    guesser = Browser(api.url, extra={"X-Forwarded-For": "198.51.100.1, 203.0.113.7"})
    for _ in range(limit):
        assert guesser.login("olga", WRONG).status == 401
    assert guesser.login("olga").status == 429
    elsewhere = Browser(api.url, extra={"X-Forwarded-For": "203.0.113.8"})
    assert elsewhere.login("olga").status == 200  # another client behind the proxy
    https = Browser(api.url, extra={"X-Forwarded-Proto": "https"}).login("lena")
    assert https.cookie()[COOKIE_NAME]["secure"] is True
    direct = start()  # nobody trusted: the forwarded scheme is ignored
    plain = Browser(direct.url, extra={"X-Forwarded-Proto": "https"}).login("lena")
    assert plain.status == 200, plain.body
    assert not plain.cookie()[COOKIE_NAME]["secure"]


def test_a_deep_or_odd_json_sign_in_body_is_a_400_naming_what_was_wrong(start: Start) -> None:
    api = start()
    cases = {
        b'{"username": ' + b"[" * 5000 + b"]" * 5000 + b', "password": "x"}': "nested deeper",
        b'{"username": "ol\\u0000ga", "password": "x"}': "NUL",
        b'{"username": "\\ud800", "password": "x"}': "lone surrogate",
        b'{"username": "olga", "password": "\\udfff"}': "lone surrogate",
        b'{"username": "olga", "password": 1' + b"0" * 40 + b"}": "out of range",
        b"[1, 2]": "not an object",
        b"\xff\xfe": "not UTF-8",
    }
    for raw, why in cases.items():
        reply = send_raw(api, "/login", raw)
        assert reply.status == 400, (raw[:40], reply.body)
        assert reply.body["detail"].startswith("the sign-in body: "), reply.body
        assert why in reply.body["detail"], reply.body


def test_nul_in_a_form_sign_in_is_refused_not_a_server_error(start: Start, db_url: str) -> None:
    api = start(db_url)
    for username, password in (("ol\x00ga", PASSWORD), ("olga", "pass\x00word"), ("\x00", "x")):
        form = {"username": username, "password": password}
        reply = send("POST", api.url + "/login", form=form)
        assert reply.status == 401, reply.body
        assert reply.body["detail"] == "wrong user name or password"
    json_nul = send("POST", api.url + "/login", body={"username": "\x00", "password": "x"})
    assert json_nul.status == 400
    console = console_login(api, "ol\x00ga", PASSWORD)
    assert console == 401
    assert Browser(api.url).login("olga").status == 200


def test_a_hostile_enrollment_body_is_a_400_naming_what_was_wrong(
    start: Start, db_url: str
) -> None:
    api = start(db_url)
    csr = json.dumps("-----BEGIN CERTIFICATE REQUEST-----\n" + "A" * 64 + "\n").encode()
    cases = {
        b"[" * 20_000 + b"]" * 20_000: "nested deeper",
        b'{"token": "\\u0000' + b"a" * 20 + b'", "csr": ' + csr + b"}": "NUL",
        b'{"token": "\\ud800' + b"a" * 20 + b'", "csr": ' + csr + b"}": "surrogate",
        b'{"token": "' + b"a" * 20 + b'", "csr": "x", "agent_version": 1e999}': "not JSON",
    }
    for raw, why in cases.items():
        reply = send_raw(api, ENROLL_PATH, raw)
        assert reply.status == 400, (raw[:40], reply.body)
        assert reply.body["detail"].startswith("the enrollment request: "), reply.body
        assert why in reply.body["detail"], reply.body
    short = send_raw(api, ENROLL_PATH, b'{"token": "short", "csr": "x"}')
    assert short.status == 400
    assert "token" in short.body["detail"]


def send_raw(api: RunningApi, path: str, raw: bytes) -> Reply:
    """POST ``raw`` as JSON; the reply (an error status is a reply)."""
    req = urllib.request.Request(  # noqa: S310
        api.url + path, data=raw, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
            return Reply(resp.status, json.loads(resp.read()), dict(resp.headers), [])
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, json.loads(exc.read() or b"null"), dict(exc.headers), [])


def console_login(api: RunningApi, username: str, password: str) -> int:
    """The console's sign-in form posted with its token; the answer's status."""
    c = Client(api.url)
    form = c.get("/ui/login")
    assert form.status == 200
    page = c.post(
        "/ui/login",
        {"username": username, "password": password, "login_token": form.field("login_token"),
         "next": "/ui/"},
    )  # fmt: skip
    return page.status
