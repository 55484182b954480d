"""Users, roles, sessions and CSRF on the fleet server's API over real HTTP: a FleetServer
in this process (uvicorn on a free loopback port) on SQLite and on PostgreSQL, users
stored with real argon2id hashes, a small cookie-keeping client on urllib
(tests/fleet_server/auth_client.py). The pure parts are in test_auth_rules.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import argon2
import pytest
import sqlalchemy as sa

from agent.wire.enroll import ENROLL_PATH
from fleet_server.auth import (
    PERMISSIONS,
    AuthSection,
    PasswordHasher,
    add_user,
    get_user,
    set_disabled,
    set_password,
    set_role,
)
from fleet_server.auth.deps import COOKIE_NAME
from fleet_server.auth.sessions import hash_session_id
from fleet_server.db import sqlite_url, store
from fleet_server.db.tables import user_sessions, users
from fleet_server.serve import FleetServer
from tests.fleet_server.auth_client import PASSWORD, Browser, send
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    LocalRolloutOps,
    RunningApi,
    api_config,
    make_repository,
)
from tests.fleet_server.users_support import USERS_HASHER

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db_url (SQLite and PostgreSQL), pg_cluster

HASHER = PasswordHasher()
"""For a password a test sets (the fixtures' users: USERS_HASHER)."""
SPEC = {"bundle": "tiny@1.0.0", "selector": "line=3", "waves": "1,100%", "soak_s": "10m"}

StartApi = Callable[..., RunningApi]


# -- fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("auth-repo"))


@pytest.fixture
def start_api(
    tmp_path: Path, repository: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[StartApi]:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    servers: list[FleetServer] = []

    def start(db_url: str, *, auth: AuthSection | None = None, token: bool = True) -> RunningApi:
        cfg = api_config(tmp_path / "state", *repository, db_url=db_url, token=token)
        if auth is not None:
            cfg = cfg.model_copy(update={"auth": auth})
        server = FleetServer(cfg, services=[LocalRolloutOps])
        server.start()
        servers.append(server)
        engine = server.context.engine
        for name, role in (("olga", "operator"), ("lena", "line-manager"), ("vic", "viewer")):
            add_user(engine, USERS_HASHER, name, role, PASSWORD)
        return RunningApi(server)

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def api(start_api: StartApi, db_url: str) -> RunningApi:
    """On SQLite and on PostgreSQL, with users olga (operator), lena (line-manager) and
    vic (viewer)."""
    return start_api(db_url)


@pytest.fixture
def api_lite(start_api: StartApi, tmp_path: Path) -> RunningApi:
    """On SQLite only."""
    return start_api(sqlite_url(tmp_path / "fleet.db"))


def signed_in(api: RunningApi, username: str) -> Browser:
    browser = Browser(api.url)
    reply = browser.login(username)
    assert reply.status == 200, reply.body
    return browser


def line_devices(api: RunningApi, n: int = 2) -> None:
    for i in range(n):
        store.upsert_device(api.ctx.engine, f"d{i}", labels={"line": "3"}, profile="x86-gateway")
        store.mark_seen(api.ctx.engine, f"d{i}", 100.0, True)


def session_rows(api: RunningApi) -> list[dict[str, Any]]:
    with api.ctx.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(user_sessions))]


# -- signing in (SQLite and PostgreSQL) -------------------------------------------------


def test_each_role_signs_in_and_me_names_its_role_and_permissions(api: RunningApi) -> None:
    expected = {
        "olga": ("operator", sorted(PERMISSIONS)),
        "lena": ("line-manager", ["decisions:export", "decisions:review", "fleet:read"]),
        "vic": ("viewer", ["fleet:read"]),
    }
    for name, (role, permissions) in expected.items():
        browser = Browser(api.url)
        reply = browser.login(name)
        assert reply.status == 200, reply.body
        assert (reply.body["username"], reply.body["role"]) == (name, role)
        assert reply.body["permissions"] == permissions
        assert reply.headers["cache-control"] == "no-store"
        morsel = reply.cookie()[COOKIE_NAME]
        assert morsel["httponly"] is True
        assert morsel["samesite"].lower() == "strict"
        assert morsel["path"] == "/"
        assert not morsel["secure"]  # plain HTTP on loopback, cookie_secure = "auto"
        assert not morsel["max-age"]  # a browser-session cookie; the server ends it sooner
        me = browser.call("GET", "/api/v1/me")
        assert me.status == 200
        assert (me.body["username"], me.body["role"], me.body["via"]) == (name, role, "session")
        assert me.body["csrf_token"] == browser.csrf
    bearer = send("GET", api.url + "/api/v1/me", headers={"Authorization": f"Bearer {api.token}"})
    assert (bearer.body["role"], bearer.body["via"], bearer.body["csrf_token"]) == (
        "operator",
        "token",
        None,
    )


def test_wrong_password_and_unknown_user_get_the_same_401_and_no_cookie(api: RunningApi) -> None:
    wrong = Browser(api.url).login("olga", "not the password at all")
    unknown = Browser(api.url).login("nobody", PASSWORD)
    assert wrong.status == unknown.status == 401
    assert wrong.body == unknown.body == {"detail": "wrong user name or password"}
    assert wrong.cookies == unknown.cookies == []
    assert session_rows(api) == []


def test_line_manager_can_not_start_or_change_a_rollout_even_with_its_csrf_token(
    api: RunningApi,
) -> None:
    line_devices(api)
    lena = signed_in(api, "lena")
    refused = lena.call("POST", "/api/v1/rollouts", SPEC)
    assert refused.status == 403
    assert refused.body["detail"] == "'lena' (line-manager) may not rollouts:write"
    assert store.list_rollouts(api.ctx.engine) == []
    created = api.call("POST", "/api/v1/rollouts", SPEC)  # the operator's token
    assert created.status == 201, created.body
    rid = created.body["rollout_id"]
    for action in ("pause", "cancel", "rollback", "approve"):
        answer = lena.call("POST", f"/api/v1/rollouts/{rid}/{action}", {"reason": "no"})
        assert answer.status == 403, action
    shown = lena.call("GET", f"/api/v1/rollouts/{rid}")
    assert shown.status == 200  # reading the fleet is allowed
    assert shown.body["phase"] == created.body["phase"]
    assert lena.call("POST", "/api/v1/devices/cam-1/tokens", {}).status == 403
    assert lena.call("POST", "/api/v1/devices/d0/revoke").status == 403
    assert store.get_device(api.ctx.engine, "d0").revoked is False  # type: ignore[union-attr]


def test_viewer_reads_devices_rollouts_and_bundles_but_changes_nothing(api: RunningApi) -> None:
    line_devices(api, 1)
    vic = signed_in(api, "vic")
    devices = vic.call("GET", "/api/v1/devices")
    assert devices.status == 200
    assert [d["device_id"] for d in devices.body] == ["d0"]
    assert vic.call("GET", "/api/v1/devices/d0/telemetry").status == 200
    assert vic.call("GET", "/api/v1/bundles").status == 200
    assert vic.call("GET", "/api/v1/rollouts").body == []
    assert vic.call("POST", "/api/v1/rollouts", SPEC).status == 403
    assert vic.call("POST", "/api/v1/devices/d0/tokens", {}).status == 403


def test_operator_session_creates_a_rollout_with_its_csrf_token(api: RunningApi) -> None:
    line_devices(api)
    olga = signed_in(api, "olga")
    created = olga.call("POST", "/api/v1/rollouts", SPEC)
    assert created.status == 201, created.body
    paused = olga.call("POST", f"/api/v1/rollouts/{created.body['rollout_id']}/pause", {})
    assert paused.body["phase"] == "paused"


def test_idle_and_absolute_expiry_end_the_session(api: RunningApi) -> None:
    idle_s = AuthSection().session_idle_s
    olga = signed_in(api, "olga")
    key = hash_session_id(olga.session or "")
    with api.ctx.engine.begin() as conn:
        conn.execute(
            user_sessions.update()
            .where(user_sessions.c.session_hash == key)
            .values(last_seen=user_sessions.c.last_seen - idle_s - 1)
        )
    idle = olga.call("GET", "/api/v1/devices")
    assert idle.status == 401
    assert "session expired" in idle.body["detail"]
    assert idle.cookie()[COOKIE_NAME].value == ""  # the browser is told to drop it
    assert session_rows(api) == []
    olga = signed_in(api, "olga")
    assert olga.call("GET", "/api/v1/devices").status == 200
    with api.ctx.engine.begin() as conn:
        conn.execute(user_sessions.update().values(expires_at=1.0))
    assert olga.call("GET", "/api/v1/devices").status == 401
    assert session_rows(api) == []


def test_logout_deletes_the_session_and_its_cookie_stops_working(api: RunningApi) -> None:
    olga = signed_in(api, "olga")
    assert len(session_rows(api)) == 1
    assert olga.call("POST", "/logout", csrf=None).status == 403  # CSRF applies to logout
    out = olga.call("POST", "/logout")
    assert out.status == 204
    assert out.cookie()[COOKIE_NAME].value == ""
    assert session_rows(api) == []
    assert olga.call("GET", "/api/v1/me").status == 401


def test_only_an_argon2id_hash_and_a_hash_of_the_session_id_are_stored(api: RunningApi) -> None:
    olga = signed_in(api, "olga")
    with api.ctx.engine.connect() as conn:
        stored = conn.execute(sa.select(users.c.password_hash)).scalars().all()
    assert len(stored) == 3
    for digest in stored:
        assert digest.startswith("$argon2id$")
        assert PASSWORD not in digest
        params = argon2.extract_parameters(digest)
        assert params.type is argon2.Type.ID
        assert params.memory_cost >= 65536
    [row] = session_rows(api)
    assert row["session_hash"] == hash_session_id(olga.session or "")
    assert olga.session not in json.dumps(row)


# -- CSRF, origins, the bearer token (SQLite) ----------------------------------------------


def test_cookie_post_without_or_with_a_wrong_csrf_token_is_403_and_creates_nothing(
    api_lite: RunningApi,
) -> None:
    olga = signed_in(api_lite, "olga")
    missing = olga.call("POST", "/api/v1/devices/cam-1/tokens", {}, csrf=None)
    assert missing.status == 403
    assert "CSRF token missing" in missing.body["detail"]
    wrong = olga.call("POST", "/api/v1/devices/cam-1/tokens", {}, csrf="x" * 43)
    assert wrong.status == 403
    assert "CSRF token wrong" in wrong.body["detail"]
    with api_lite.ctx.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM enrollment_tokens")).scalar() == 0
    other = signed_in(api_lite, "olga")  # another session's token is not this one's
    assert olga.call("POST", "/api/v1/devices/cam-1/tokens", {}, csrf=other.csrf).status == 403
    assert olga.call("POST", "/api/v1/devices/cam-1/tokens", {}).status == 201
    assert olga.call("GET", "/api/v1/devices", csrf=None).status == 200  # reads need none


def test_a_form_post_may_carry_the_csrf_token_as_a_field(api_lite: RunningApi) -> None:
    olga = signed_in(api_lite, "olga")
    bad = olga.call("POST", "/logout", csrf=None, form={"csrf_token": "nope"})
    assert bad.status == 403
    assert len(session_rows(api_lite)) == 1
    good = olga.call("POST", "/logout", csrf=None, form={"csrf_token": olga.csrf or ""})
    assert good.status == 204
    assert session_rows(api_lite) == []


def test_a_cross_site_origin_is_refused_even_with_the_right_token(api_lite: RunningApi) -> None:
    olga = signed_in(api_lite, "olga")
    evil = {"Origin": "http://evil.example"}
    refused = olga.call("POST", "/api/v1/devices/cam-1/tokens", {}, headers=evil)
    assert refused.status == 403
    assert "cross-site" in refused.body["detail"]
    referer = {"Referer": "http://evil.example/page"}
    assert olga.call("POST", "/api/v1/devices/cam-1/tokens", {}, headers=referer).status == 403
    own = {"Origin": api_lite.url}
    assert olga.call("POST", "/api/v1/devices/cam-1/tokens", {}, headers=own).status == 201
    forged = Browser(api_lite.url, extra=evil).login("olga")  # login CSRF
    assert forged.status == 403
    assert forged.cookies == []


def test_the_bearer_token_needs_no_csrf_token_and_wins_over_a_cookie(api_lite: RunningApi) -> None:
    bearer = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    made = send("POST", api_lite.url + "/api/v1/devices/cam-2/tokens", body={}, headers=bearer)
    assert made.status == 201
    vic = signed_in(api_lite, "vic")
    both = vic.call("POST", "/api/v1/devices/cam-3/tokens", {}, csrf=None, headers=bearer)
    assert both.status == 201  # acts as the token, not as the viewer
    wrong = vic.call("GET", "/api/v1/devices", headers={"Authorization": "Bearer wrong"})
    assert wrong.status == 401  # a wrong token does not fall back to the cookie


def test_every_fleet_endpoint_needs_a_credential(api_lite: RunningApi) -> None:
    doc = send("GET", api_lite.url + "/openapi.json").body
    open_paths = {"/healthz", "/metrics", "/login", "/logout", ENROLL_PATH}
    checked = 0
    for path, methods in doc["paths"].items():
        if path in open_paths:
            continue
        concrete = path.replace("{action}", "pause").replace("{", "").replace("}", "")
        for method in methods:
            answer = send(method.upper(), api_lite.url + concrete, body={})
            assert answer.status == 401, (method, path, answer.body)
            assert answer.headers.get("www-authenticate") == "Bearer"
            checked += 1
    assert checked >= 11


def test_without_an_operator_token_configured_only_users_get_in(
    start_api: StartApi, tmp_path: Path
) -> None:
    api = start_api(sqlite_url(tmp_path / "fleet.db"), token=False)
    assert send("GET", api.url + "/api/v1/devices").status == 401
    any_bearer = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    assert send("GET", api.url + "/api/v1/devices", headers=any_bearer).status == 401
    assert signed_in(api, "vic").call("GET", "/api/v1/devices").status == 200


# -- cookies over HTTPS, lockout, user changes (SQLite) --------------------------------------


def test_the_cookie_is_secure_over_https_or_when_the_config_says_always(
    start_api: StartApi, api_lite: RunningApi, tmp_path: Path
) -> None:
    proxied = start_api(
        sqlite_url(tmp_path / "proxied.db"), auth=AuthSection(trusted_proxies=["127.0.0.1/32"])
    )
    via_proxy = Browser(proxied.url, extra={"X-Forwarded-Proto": "https"})
    reply = via_proxy.login("olga")  # [auth] trusted_proxies names loopback
    assert reply.status == 200, reply.body
    assert reply.cookie()[COOKIE_NAME]["secure"] is True
    always = start_api(sqlite_url(tmp_path / "always.db"), auth=AuthSection(cookie_secure="always"))
    assert Browser(always.url).login("olga").cookie()[COOKIE_NAME]["secure"] is True


def test_a_form_sign_in_works_like_json(api_lite: RunningApi) -> None:
    browser = Browser(api_lite.url)
    reply = browser.login("lena", as_form=True)
    assert reply.status == 200, reply.body
    assert browser.call("GET", "/api/v1/me").body["role"] == "line-manager"
    plain = send("POST", api_lite.url + "/login", headers={"Content-Type": "text/plain"})
    assert plain.status == 415


def test_repeated_failures_lock_that_name_out_from_that_address_for_a_while(
    api_lite: RunningApi,
) -> None:
    limit = AuthSection().login_max_failures
    for _ in range(limit):
        assert Browser(api_lite.url).login("olga", "wrong password here").status == 401
    locked = Browser(api_lite.url).login("olga")  # the right password, during the lockout
    assert locked.status == 429
    assert 1 <= int(locked.headers["retry-after"]) <= AuthSection().login_lockout_s
    assert "too many failed attempts" in locked.body["detail"]
    assert Browser(api_lite.url).login("lena").status == 200  # other names are not locked


def test_disabling_a_user_or_changing_its_password_ends_its_sessions(api_lite: RunningApi) -> None:
    engine = api_lite.ctx.engine
    lena = signed_in(api_lite, "lena")
    set_password(engine, HASHER, "lena", "a brand new password")
    assert lena.call("GET", "/api/v1/me").status == 401
    assert Browser(api_lite.url).login("lena").status == 401
    lena = Browser(api_lite.url)
    assert lena.login("lena", "a brand new password").status == 200
    set_disabled(engine, "lena", True)
    assert lena.call("GET", "/api/v1/me").status == 401
    disabled = Browser(api_lite.url).login("lena", "a brand new password")
    assert (disabled.status, disabled.body["detail"]) == (401, "wrong user name or password")


def test_a_new_role_applies_at_the_next_request(api_lite: RunningApi) -> None:
    line_devices(api_lite, 1)
    vic = signed_in(api_lite, "vic")
    assert vic.call("POST", "/api/v1/rollouts", SPEC).status == 403
    set_role(api_lite.ctx.engine, "vic", "operator")
    assert vic.call("POST", "/api/v1/rollouts", SPEC).status == 201


def test_a_hash_with_old_parameters_is_replaced_at_sign_in(api_lite: RunningApi) -> None:
    engine = api_lite.ctx.engine
    weak = argon2.PasswordHasher(time_cost=1, memory_cost=8192, parallelism=1)
    add_user(engine, PasswordHasher(weak), "old.timer", "viewer", PASSWORD)
    before = get_user(engine, "old.timer")
    assert before is not None
    assert argon2.extract_parameters(before.password_hash).memory_cost == 8192
    assert signed_in(api_lite, "old.timer").call("GET", "/api/v1/me").status == 200
    after = get_user(engine, "old.timer")
    assert after is not None
    assert after.password_hash != before.password_hash
    assert not argon2.PasswordHasher().check_needs_rehash(after.password_hash)
    assert Browser(api_lite.url).login("old.timer").status == 200
