"""The audit trail over real HTTP: a FleetServer in this process (uvicorn on a free
loopback port) on SQLite and on PostgreSQL with users of each role; changes made through
the API (sessions and the operator token), the console's form posts and ``fleetctl
users``, refused ones too, each recorded once with its actor, role, source, action,
target and result; the trail is read only, and readable only with ``audit:read``."""

from __future__ import annotations

import http.client
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.routing import APIRoute

from fleet_server.api.app import create_app
from fleet_server.audit import AuditEntry, AuditFilter, query, record
from fleet_server.audit.middleware import UNSAFE
from fleet_server.audit.names import ACTIONS, NOT_CHANGES
from fleet_server.auth import PasswordHasher, add_user
from fleet_server.auth.deps import COOKIE_NAME, TOKEN_PRINCIPAL
from fleet_server.cli.fleetctl import main as fleetctl
from fleet_server.db import open_database, sqlite_url, store
from fleet_server.db.tables import audit_log
from fleet_server.retention.config import RetentionSection
from fleet_server.retention.prune import prune
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

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db_url (SQLite and PostgreSQL)

HASHER = PasswordHasher()
SPEC = {"bundle": "tiny@1.0.0", "selector": "line=3", "waves": "1,100%", "soak_s": "10m"}
StartApi = Callable[[str], RunningApi]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("audit-repo"))


@pytest.fixture
def start_api(
    tmp_path: Path, repository: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[StartApi]:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    servers: list[FleetServer] = []

    def start(db_url: str) -> RunningApi:
        server = FleetServer(
            api_config(tmp_path / "state", *repository, db_url=db_url), services=[LocalRolloutOps]
        )
        server.start()
        servers.append(server)
        for name, role in (("olga", "operator"), ("lena", "line-manager"), ("vic", "viewer")):
            add_user(server.context.engine, HASHER, name, role, PASSWORD)
        for i in range(2):
            store.upsert_device(server.context.engine, f"d{i}", labels={"line": "3"})
        return RunningApi(server)

    yield start
    for server in servers:
        server.stop()


def _signed_in(api: RunningApi, name: str) -> Browser:
    browser = Browser(api.url)
    assert browser.login(name).status == 200
    return browser


def _trail(api: RunningApi, **query: str) -> list[dict[str, Any]]:
    answer = api.call("GET", "/api/v1/audit?" + urllib.parse.urlencode(query))
    assert answer.status == 200, answer.body
    entries: list[dict[str, Any]] = answer.body["entries"]
    return entries


def _page(api: RunningApi, browser: Browser, path: str) -> tuple[int, str]:
    """A console page as the browser gets it (no redirect followed)."""
    url = urllib.parse.urlsplit(api.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Cookie": f"{COOKIE_NAME}={browser.session}"})
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def _form_post(api: RunningApi, browser: Browser, path: str, fields: dict[str, str]) -> int:
    """A console form post as a browser sends it (no redirect followed): its status."""
    url = urllib.parse.urlsplit(api.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        body = urllib.parse.urlencode({**fields, "csrf_token": browser.csrf or ""})
        conn.request(
            "POST",
            path,
            body=body,
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Cookie": f"{COOKIE_NAME}={browser.session}",
                "Origin": api.url,
            },
        )
        return conn.getresponse().status
    finally:
        conn.close()


def test_each_change_and_each_refusal_is_recorded_once_with_who_where_and_how(
    start_api: StartApi, db_url: str
) -> None:
    api = start_api(db_url)
    t0 = time.time()
    olga, lena, vic = (_signed_in(api, n) for n in ("olga", "lena", "vic"))
    created = olga.call("POST", "/api/v1/rollouts", SPEC)
    assert created.status == 201, created.body
    rid = created.body["rollout_id"]
    assert olga.call("POST", f"/api/v1/rollouts/{rid}/pause", {"reason": "line stop"}).status == 200
    assert lena.call("POST", "/api/v1/rollouts", SPEC).status == 403
    assert vic.call("POST", "/api/v1/devices/d0/revoke").status == 403
    assert api.call("POST", "/api/v1/devices/d1/revoke").status == 200  # the operator token
    assert send("POST", api.url + "/api/v1/devices/d0/tokens", body={}).status == 401
    assert Browser(api.url).login("olga", "not the password at all").status == 401
    assert _form_post(api, olga, f"/ui/rollouts/{rid}/resume", {"reason": "back"}) == 303

    got = [
        (e["actor"], e["role"], e["action"], e["target"], e["result"], e["detail"]["status"])
        for e in reversed(_trail(api, since=str(t0 - 1)))
    ]
    assert got == [
        ("olga", "", "session.login", "", "ok", 200),
        ("lena", "", "session.login", "", "ok", 200),
        ("vic", "", "session.login", "", "ok", 200),
        ("olga", "operator", "rollout.create", "", "ok", 201),
        ("olga", "operator", "rollout.pause", f"rollout:{rid}", "ok", 200),
        ("lena", "line-manager", "rollout.create", "", "refused", 403),
        ("vic", "viewer", "device.revoke", "device:d0", "refused", 403),
        (TOKEN_PRINCIPAL, "operator", "device.revoke", "device:d1", "ok", 200),
        ("anonymous", "", "device.token", "device:d0", "refused", 401),
        ("olga", "", "session.login", "", "refused", 401),
        ("olga", "operator", "rollout.resume", f"rollout:{rid}", "ok", 303),
    ]
    entries = _trail(api, since=str(t0 - 1))
    assert {e["source"] for e in entries} == {"127.0.0.1"}
    refused = next(e for e in entries if e["actor"] == "lena" and e["result"] == "refused")
    assert refused["detail"]["reason"] == "'lena' (line-manager) may not rollouts:write"
    assert all(t0 - 1 <= e["ts"] <= time.time() for e in entries)


def test_filters_pages_and_prefixes(start_api: StartApi, tmp_path: Path) -> None:
    api = start_api(sqlite_url(tmp_path / "fleet.db"))
    for device in ("d0", "d1", "cam-7"):
        assert api.call("POST", f"/api/v1/devices/{device}/tokens", {}).status == 201
    assert api.call("POST", "/api/v1/devices/d0/revoke").status == 200
    assert [e["target"] for e in _trail(api, action="device.token")] == [
        "device:cam-7",
        "device:d1",
        "device:d0",
    ]
    assert [e["action"] for e in _trail(api, target="device:d0")] == [
        "device.revoke",
        "device.token",
    ]
    assert len(_trail(api, action="device.*")) == 4
    assert _trail(api, action="device.t*", target="device:d*", result="ok", actor=TOKEN_PRINCIPAL)
    assert _trail(api, result="refused") == []
    first = api.call("GET", "/api/v1/audit?limit=3")
    assert first.status == 200
    assert len(first.body["entries"]) == 3
    rest = api.call("GET", f"/api/v1/audit?limit=3&before={first.body['next_before']}")
    seqs = [e["seq"] for e in first.body["entries"] + rest.body["entries"]]
    assert seqs == sorted(seqs, reverse=True)
    assert len(set(seqs)) == 4
    assert rest.body["next_before"] is None
    bad = api.call("GET", "/api/v1/audit?result=maybe")
    assert bad.status == 400
    assert "maybe" in bad.body["detail"]


def test_the_trail_is_read_only_and_needs_audit_read(start_api: StartApi, tmp_path: Path) -> None:
    api = start_api(sqlite_url(tmp_path / "fleet.db"))
    assert api.call("POST", "/api/v1/devices/d0/revoke").status == 200
    with api.ctx.engine.connect() as conn:
        before = [dict(r._mapping) for r in conn.execute(sa.select(audit_log))]
    assert len(before) == 1
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        for path in ("/api/v1/audit", f"/api/v1/audit/{before[0]['seq']}"):
            answer = api.call(method, path, {"actor": "someone else"})
            assert answer.status in (404, 405), (method, path, answer.status)
    with api.ctx.engine.connect() as conn:
        after = [dict(r._mapping) for r in conn.execute(sa.select(audit_log))]
    assert after[0] == before[0]  # the attempts are recorded after it; it is unchanged
    assert {r["result"] for r in after[1:]} == {"refused"}
    for name in ("lena", "vic"):
        browser = _signed_in(api, name)
        assert browser.call("GET", "/api/v1/audit").status == 403
        assert _page(api, browser, "/ui/audit")[0] == 403
    olga = _signed_in(api, "olga")
    assert olga.call("GET", "/api/v1/audit").status == 200
    status, html = _page(api, olga, "/ui/audit?action=device.*")
    assert status == 200
    assert html.count('data-testid="audit-row"') == 1
    assert 'data-action="device.revoke"' in html
    assert 'href="/ui/audit"' in html  # the nav link, for a role that may read it


def test_fleetctl_users_changes_are_recorded_with_the_system_user(
    start_api: StartApi,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = tmp_path / "fleet.db"
    api = start_api(sqlite_url(db))
    url = sqlite_url(db)
    assert fleetctl(["users", "role", "vic", "line-manager", "--db-url", url]) == 0
    assert fleetctl(["users", "disable", "lena", "--db-url", url]) == 0
    entries = _trail(api, action="user.*")
    assert [(e["action"], e["target"], e["source"], e["role"]) for e in entries] == [
        ("user.disable", "user:lena", "cli", "local"),
        ("user.role", "user:vic", "cli", "local"),
    ]
    assert entries[1]["detail"] == {"role": "line-manager"}
    assert "@" in entries[0]["actor"]
    capsys.readouterr()
    monkeypatch.setenv("EDGEFLEET_API_TOKEN", OPERATOR_TOKEN)
    assert fleetctl(["audit", "--server", api.url, "--action", "user.*"]) == 0
    shown = capsys.readouterr().out
    assert "user.disable" in shown
    assert "user:lena" in shown
    assert "2 entries" in shown


def test_every_route_that_may_change_something_has_an_action_name(
    start_api: StartApi, tmp_path: Path
) -> None:
    api = start_api(sqlite_url(tmp_path / "fleet.db"))
    app = create_app(api.ctx)  # the server's routes, built again
    unnamed = [
        (method, route.path)
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods & UNSAFE
        if (method, route.path) not in ACTIONS and (method, route.path) not in NOT_CHANGES
    ]
    assert unnamed == []


def test_retention_prunes_the_trail_by_its_age_and_row_budget(tmp_path: Path) -> None:
    engine = open_database(sqlite_url(tmp_path / "fleet.db"))
    now = time.time()
    for age_days in (500, 401, 399, 10, 1, 0):
        entry = AuditEntry(now - age_days * 86_400, "olga", "operator", "127.0.0.1",
                           "device.revoke", f"device:d{age_days}", "ok")  # fmt: skip
        record(engine, entry)
    prune(engine, RetentionSection(), now=now)  # the defaults: 400 days, 1,000,000 rows
    kept = [e.target for e in query(engine, AuditFilter())]
    assert kept == ["device:d0", "device:d1", "device:d10", "device:d399"]
    prune(engine, RetentionSection(audit_log={"max_age_days": None, "max_rows": 2}), now=now)
    assert [e.target for e in query(engine, AuditFilter())] == ["device:d0", "device:d1"]
    engine.dispose()
