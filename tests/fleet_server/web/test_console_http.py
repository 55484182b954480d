"""The console's pages over real HTTP without a browser, on a FleetServer in this process
with seeded data (console_http_support.py): every page for each role on SQLite
and PostgreSQL, sign-in and its CSRF token, the role and CSRF checks on every form post,
the preview against what the rollout service then assigns, and a fixed number of
queries per page with 1,000 devices."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from agent.wire import topics
from agent.wire.messages import Event, encode
from fleet_server.auth.deps import COOKIE_NAME
from fleet_server.db import sqlite_url, store
from fleet_server.db.tables import audit_log, devices
from fleet_server.ingest.batch import Batch
from fleet_server.ingest.sqlsink import SqlSink
from tests.fleet_server.web.console_http_support import (
    SPEC,
    Client,
    Console,
    Page,
    first_decision,
    rollout_form,
)
from tests.fleet_server.web.console_seed import FEATURED, health, seed_fleet
from tests.fleet_server.web.console_server import PASSWORD, USERS

pytest_plugins = ["tests.fleet_server.db_fixtures", "tests.fleet_server.web.console_http_fixtures"]

# -- every page, each role, SQLite and PostgreSQL -----------------------------------------


def test_every_page_renders_for_each_role(start: Callable[[str], Console], db_url: str) -> None:
    c = start(db_url)
    seed_fleet(c.engine, time.time())
    rid = c.rollouts.service.create(SPEC)
    for name, role in USERS.items():
        user = c.client(name)
        overview = user.get("/ui/")
        assert overview.status == 200, overview.text
        assert f"{name} · {role}" in overview.text
        assert "plant-b · line 2" in overview.text
        assert "soc 8" in overview.text
        assert "offline for 3 h" in overview.text
        assert "default-src 'none'" in overview.headers["content-security-policy"]
        assert overview.headers["cache-control"] == "no-store"
        device = user.get(f"/ui/devices/{FEATURED}?span=24h")
        assert device.status == 200, device.text
        for title in (
            "Frames per second",
            "Inference latency",
            "Queue depth",
            "Dropped frames",
            "CPU",
            "Agent memory",
            "Temperature",
            "Data disk",
            "Decisions by outcome",
        ):
            assert title in device.text, title  # fmt: skip
        assert "budget 40 ms" in device.text
        assert "worker 2 exited with signal 11" in device.text
        bundles = user.get("/ui/bundles")
        assert bundles.status == 200
        assert bundles.text.count('data-testid="bundle-row"') == 4
        assert "validly signed" in bundles.text
        listing = user.get("/ui/rollouts")
        assert rid in listing.text
        assert ('data-testid="new-rollout"' in listing.text) is (role == "operator")
        page = user.get(f"/ui/rollouts/{rid}")
        assert page.status == 200
        assert ('data-action="pause"' in page.text) is (role == "operator")
        assert user.get(f"/ui/rollouts/{rid}/live").text.lstrip().startswith("<section")
        assert user.get("/ui/rollouts/new").status == (200 if role == "operator" else 403)
        decisions = user.get("/ui/decisions?range=24h")
        assert decisions.status == 200, decisions.text
        assert decisions.text.count('data-testid="decision-row"') == 50
        assert ('data-testid="export"' in decisions.text) is (role != "viewer")
        decision = user.get(f"/ui/decisions/{first_decision(decisions)}")
        assert decision.status == 200
        assert ('data-testid="save-review"' in decision.text) is (role != "viewer")
    assert c.client().get("/ui/bundles").status == 303


def test_the_overview_filters_by_site_line_state_and_search(console: Console) -> None:
    vic = console.client("vic")
    only_b = vic.get("/ui/?site=plant-b").text
    assert "b1-01" in only_b
    assert "a1-01" not in only_b
    line = vic.get("/ui/?site=plant-a&line=2").text
    assert "a2-05" in line
    assert "a3-01" not in line
    assert "b2-01" not in line
    found = vic.get("/ui/?q=A2-03").text
    assert "a2-03" in found
    assert "a2-04" not in found
    bad = vic.get("/ui/?state=bad").text
    assert re.findall(r">([ab]\d-\d\d)</a>", bad) == ["a2-03", "b1-04"]
    warn = vic.get("/ui/?state=warn").text
    assert re.findall(r">([ab]\d-\d\d)</a>", warn) == ["a3-02"]
    assert "disk 10% free" in warn
    assert vic.get("/ui/?state=sideways").status == 400
    assert vic.get(f"/ui/devices/{FEATURED}?span=1y").status == 400
    assert vic.get("/ui/devices/nope").status == 404


# -- signing in ------------------------------------------------------------------------


def test_a_page_sends_a_stranger_to_sign_in_and_back_where_they_were(console: Console) -> None:
    c = console.client()
    assert c.get("/").headers["location"] == "/ui/"
    away = c.get(f"/ui/devices/{FEATURED}?span=1h")
    assert away.status == 303
    assert away.headers["location"] == f"/ui/login?next=/ui/devices/{FEATURED}%3Fspan%3D1h"
    form = c.get(away.headers["location"])
    assert form.field("next") == f"/ui/devices/{FEATURED}?span=1h"
    wrong = c.post("/ui/login", {"username": "olga", "password": "not it at all",
                                 "login_token": form.field("login_token")})  # fmt: skip
    assert wrong.status == 401
    assert "wrong user name or password" in wrong.text
    assert COOKIE_NAME not in c.jar
    ok = c.post("/ui/login", {"username": "olga", "password": PASSWORD,
                              "login_token": c.get("/ui/login").field("login_token"),
                              "next": form.field("next")})  # fmt: skip
    assert (ok.status, ok.headers["location"]) == (303, f"/ui/devices/{FEATURED}?span=1h")
    assert any("HttpOnly" in line and "SameSite=strict" in line for line in ok.cookies)
    assert c.get(ok.headers["location"]).status == 200
    out = c.post("/ui/logout", {"csrf_token": c.csrf()})
    assert (out.status, out.headers["location"]) == (303, "/ui/login")
    assert c.get("/ui/").status == 303


def test_the_sign_in_form_needs_its_own_token_and_this_origin(console: Console) -> None:
    c = console.client()
    token = c.get("/ui/login").field("login_token")
    creds = {"username": "olga", "password": PASSWORD}
    assert c.post("/ui/login", creds | {"login_token": "forged"}).status == 403
    stranger = Client(console.url)  # another browser: no token cookie
    assert stranger.post("/ui/login", creds | {"login_token": token}).status == 403
    evil = {"Origin": "http://evil.example"}
    assert c.post("/ui/login", creds | {"login_token": token}, evil).status == 403
    assert COOKIE_NAME not in c.jar
    assert COOKIE_NAME not in stranger.jar


# -- who may change what ---------------------------------------------------------------


def test_a_line_manager_can_not_create_or_steer_a_rollout_by_posting_the_forms(
    console: Console,
) -> None:
    rid = console.rollouts.service.create(SPEC)
    lena = console.client("lena")
    csrf = lena.csrf()
    refused = lena.post("/ui/rollouts", rollout_form(csrf))
    assert refused.status == 403
    assert "may not rollouts:write" in refused.text
    assert lena.post("/ui/rollouts/preview", rollout_form(csrf)).status == 403
    assert [r.rollout_id for r in store.list_rollouts(console.engine)] == [rid]
    for action in ("pause", "cancel", "rollback", "approve", "resume"):
        assert lena.post(f"/ui/rollouts/{rid}/{action}", {"csrf_token": csrf}).status == 403
    assert console.rollouts.service.get(rid)["phase"] == "planned"
    assert console.rollouts.sent == []


def test_form_posts_without_the_csrf_token_or_from_elsewhere_change_nothing(
    console: Console,
) -> None:
    rid = console.rollouts.service.create(SPEC)
    olga = console.client("olga")
    csrf = olga.csrf()
    assert olga.post(f"/ui/rollouts/{rid}/pause", {}).status == 403
    assert olga.post(f"/ui/rollouts/{rid}/pause", {"csrf_token": "forged"}).status == 403
    evil = {"Origin": "http://evil.example"}
    assert olga.post(f"/ui/rollouts/{rid}/pause", {"csrf_token": csrf}, evil).status == 403
    assert olga.post("/ui/rollouts", rollout_form("")).status == 403
    assert console.rollouts.service.get(rid)["phase"] == "planned"
    done = olga.post(f"/ui/rollouts/{rid}/pause", {"csrf_token": csrf})
    assert (done.status, done.headers["location"]) == (303, f"/ui/rollouts/{rid}?done=pause")
    assert console.rollouts.service.get(rid)["phase"] == "paused"
    again = olga.post(f"/ui/rollouts/{rid}/pause", {"csrf_token": csrf})
    assert again.status == 409
    assert "cannot pause a rollout that is paused" in again.text


def test_the_preview_lists_the_devices_the_rollout_then_assigns(console: Console) -> None:
    olga = console.client("olga")
    form = rollout_form(olga.csrf(), "ro-0123456789ab")
    shown = olga.post("/ui/rollouts/preview", form)
    assert shown.status == 200, shown.text
    row = r'data-testid="preview-wave"><td>(\d)</td>.*?<td class="ids">([^<]*)</td>'
    waves = re.findall(row, shown.text, re.S)
    planned = {int(n): ids.split(", ") for n, ids in waves}
    assert [len(planned[n]) for n in (1, 2, 3)] == [1, 1, 3]
    assert sorted(d for ids in planned.values() for d in ids) == [f"a1-0{i}" for i in range(1, 6)]
    made = olga.post("/ui/rollouts", form)
    assert (made.status, made.headers["location"]) == (
        303, "/ui/rollouts/ro-0123456789ab?done=created",
    )  # fmt: skip
    twice = olga.post("/ui/rollouts", form)  # a double submit shows the same rollout
    assert twice.headers["location"] == made.headers["location"]
    console.rollouts.service.tick()  # planned -> assigning wave 1
    directed = [topic.split("/")[2] for topic, _ in console.rollouts.sent]
    assert directed == planned[1]
    page = olga.get("/ui/rollouts/ro-0123456789ab")
    assert re.search(  # the roll-back button says what it undoes, on how many devices
        r'data-confirm="Roll back 1 device that took detector release \d+ to the release each '
        r'ran before\? The rollout ends\." data-testid="rollback-confirm"',
        page.text,
    ), page.text
    bad = olga.post("/ui/rollouts", rollout_form(olga.csrf()) | {"waves": "50%,1"})
    assert bad.status == 400
    assert "rollout: waves:" in bad.text
    # the preview comes first on the page, above the form it previews
    assert shown.text.index('data-testid="preview-result"') < shown.text.index(
        '<form class="rollout-form"'
    )
    # a new form selects no device until the operator chooses; blank is refused
    new = olga.get("/ui/rollouts/new?bundle=detector%401.5.0")
    assert Page.field(new, "selector") == ""
    assert '<option value="detector@1.5.0" selected>' in new.text  # from Bundles' Roll out
    blank = olga.post("/ui/rollouts", rollout_form(olga.csrf(), "ro-00000000b1a9")
                      | {"selector": ""})  # fmt: skip
    assert blank.status == 400
    assert "choose the devices" in blank.text
    assert store.load_rollout(console.engine, "ro-00000000b1a9") is None
    bundles = olga.get("/ui/bundles")
    assert 'href="/ui/rollouts/new?bundle=detector%401.5.0" data-testid="roll-out"' in bundles.text
    assert "roll-out" not in console.client("vic").get("/ui/bundles").text


def test_a_gate_left_blank_on_the_form_is_off_in_the_stored_rollout(console: Console) -> None:
    olga = console.client("olga")
    off = ("max_p99_ratio", "max_outcome_tvd", "min_accuracy", "accuracy_drop", "shadow")
    form = rollout_form(olga.csrf(), "ro-00000000b1a0") | dict.fromkeys(off, "")
    shown = olga.post("/ui/rollouts/preview", form)
    assert shown.status == 200, shown.text
    for name in off:  # shown again as typed: blank, not the default
        assert Page.field(shown, name) == "", name
    made = olga.post("/ui/rollouts", form)
    assert made.status == 303, made.text
    record = store.load_rollout(console.engine, "ro-00000000b1a0")
    assert record is not None
    gates = record.policy["gates"]
    assert [gates[k] for k in off[:4]] == [None, None, None, None], gates
    assert console.rollouts.service.get("ro-00000000b1a0")["shadow_s"] == 0
    typed = rollout_form(olga.csrf(), "ro-00000000b1a1") | {"selector": "site=plant-a,line=2",
                                                           "max_p99_ratio": "1.5"}  # fmt: skip
    assert olga.post("/ui/rollouts", typed).status == 303
    record = store.load_rollout(console.engine, "ro-00000000b1a1")
    assert record is not None
    assert record.policy["gates"]["max_p99_ratio"] == 1.5
    assert record.policy["gates"]["max_outcome_tvd"] == 0.1  # as the form sent it


# -- pending devices and recent events ---------------------------------------------------


def test_a_device_enrolled_but_never_connected_is_listed_and_its_page_says_so(
    console: Console,
) -> None:
    now = time.time()
    store.create_token(console.engine, store.hash_token("p" * 43), "a1-90",
                       labels={"site": "plant-a", "line": "1"}, profile="jetson-orin",
                       ttl_s=7200, now=now)  # fmt: skip
    store.create_token(console.engine, store.hash_token("q" * 43), "b9-01",
                       labels={"site": "plant-b", "line": "9"}, profile="", ttl_s=3600,
                       now=now - 2 * 86_400)  # fmt: skip
    vic = console.client("vic")
    overview = vic.get("/ui/").text
    rows = re.findall(r'data-testid="pending-row">\s*<td><a href="/ui/devices/([^"]+)"', overview)
    assert rows == ["a1-90", "b9-01"]
    assert "2 pending" in overview
    assert "expires in 2 h" in overview
    assert "expired 2 d ago" in overview
    only_b = vic.get("/ui/?site=plant-b").text
    assert re.findall(
        r'data-testid="pending-row">\s*<td><a href="/ui/devices/([^"]+)"', only_b
    ) == ["b9-01"]
    pending_only = vic.get("/ui/?state=pending").text
    assert "a1-90" in pending_only
    assert 'data-testid="group"' not in pending_only  # only the pending devices
    assert "a1-90" not in vic.get("/ui/?state=online").text
    assert "a1-90" in vic.get("/ui/?q=A1-9").text
    page = vic.get("/ui/devices/a1-90")
    assert page.status == 200, page.text
    assert "Enrolled, never connected" in page.text
    assert "never connected" in page.text
    assert re.search(r'data-testid="token-expiry">expires [^<]+\(in 2 h\)', page.text), page.text
    expired = vic.get("/ui/devices/b9-01")
    assert expired.status == 200
    assert "it can no longer enroll" in expired.text
    assert "fleetctl devices enroll b9-01" in expired.text
    assert vic.get("/ui/devices/nobody-here").status == 404


def test_an_install_reported_by_event_and_retained_state_is_one_recent_event(
    console: Console,
) -> None:
    device = "a1-77"
    store.upsert_device(console.engine, device, labels={"site": "plant-a", "line": "1"})
    reports = [
        {"at": time.time() - 60 + i, "source": "mqtt", "bundle": "detector", "release": 3 + i,
         "version": "1.5.0", "outcome": "committed", "step": "commit", "reason": "", "slot": "b"}
        for i in range(2)
    ]  # fmt: skip
    batch = Batch()
    for report in reports:  # what the agent sends: its outbox event and the retained state
        event = Event(device_id=device, kind="install", event_id=f"install-{uuid.uuid4().hex}",
                      ts=report["at"], payload=report)  # fmt: skip
        batch.add(topics.events(device), encode(event), 1 << 20)
        batch.add(topics.install_state(device), json.dumps(report).encode(), 1 << 20)
    alarm = {"kind": "disk", "message": "decision log slow"}
    for i in range(2):  # two alarms saying the same are two events
        event = Event(device_id=device, kind="alarm", event_id=f"alarm-{i}", ts=time.time(),
                      payload=alarm)  # fmt: skip
        batch.add(topics.events(device), encode(event), 1 << 20)
    assert SqlSink(console.engine).store_events(batch.events) == 6
    page = console.client("vic").get(f"/ui/devices/{device}").text
    shown = re.findall(r"committed detector r(\d+), step commit", page)
    assert sorted(shown) == ["3", "4"], shown  # each install once
    assert page.count("decision log slow") == 2


# -- fixed queries per page ------------------------------------------------------------


def _bulk_devices(engine: sa.Engine, n: int, now: float) -> None:
    rows = [
        {"device_id": f"z{i:04d}", "labels": {"site": f"s{i % 3}", "line": str(i % 7)},
         "profile": "x86-gateway", "agent_version": "0.1.0", "enrolled_at": now,
         "last_seen": now, "online": i % 50 != 0, "active_bundle": "detector",
         "active_release": 2, "health": health(now, i, phase=i), "revoked": False}
        for i in range(n)
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(devices.insert(), rows)


def _statements(c: Console, client: Client, path: str) -> tuple[int, int]:
    # The page once first: a session whose last_seen is due (TOUCH_EVERY_S, 60 s; a
    # loaded machine can take that long between sign-in and here) is touched then, not
    # in the request counted.
    assert client.get(path).status == 200
    executed: list[str] = []

    # The server's own loops (the replica report, the leader lease, rollouts, drift,
    # retention, ingest: threads of their own) use the same engine whenever they are due;
    # only the page's statements count.
    background = {"replica-report", "leader", "rollouts", "drift", "retention", "fleet-ingest"}

    def on_execute(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if threading.current_thread().name not in background:
            executed.append(" ".join(statement.split())[:80])

    sa.event.listen(c.engine, "before_cursor_execute", on_execute)
    try:
        page = client.get(path)
    finally:
        sa.event.remove(c.engine, "before_cursor_execute", on_execute)
    assert page.status == 200, page.text
    print(f"{path}: {len(executed)} statements: {executed}")  # shown when a count fails
    return len(executed), page.text.count("/ui/devices/")


def test_pages_make_the_same_few_queries_for_10_or_1000_devices(
    start: Callable[[str], Console], tmp_path: Path
) -> None:
    c = start(sqlite_url(tmp_path / "fleet.db"))
    vic = c.client("vic")
    now = time.time()
    _bulk_devices(c.engine, 10, now)
    small, shown = _statements(c, vic, "/ui/")
    assert shown == 10
    with c.engine.begin() as conn:
        conn.execute(devices.delete())
    _bulk_devices(c.engine, 1000, now)
    large, shown = _statements(c, vic, "/ui/")
    assert shown == 1000
    assert large == small <= 10  # session, devices, pending devices, sites/lines, drift
    device, _ = _statements(c, vic, "/ui/devices/z0001")
    bundles, _ = _statements(c, vic, "/ui/bundles")
    # 12, the drift flags of its line and its remote actions (each a query and its BEGIN)
    assert device <= 16
    assert bundles <= 6


def test_an_unknown_console_path_gets_the_console_s_404_page_and_the_api_keeps_json(
    start: Callable[[str], Console], tmp_path: Path
) -> None:
    c = start(sqlite_url(tmp_path / "fleet.db"))
    olga = c.client("olga")
    page = olga.get("/ui/no-such-page")
    assert page.status == 404
    assert page.headers["content-type"].startswith("text/html")
    assert "no such page: /ui/no-such-page" in page.text
    assert 'data-testid="user">olga' in page.text  # the menu, for a live session
    anonymous = Client(c.url).get("/ui/nowhere/at/all")
    assert anonymous.status == 404
    assert "no such page" in anonymous.text
    api = Client(c.url).get("/api/v1/no-such-thing")
    assert api.status == 404
    assert api.headers["content-type"].startswith("application/json")
    assert json.loads(api.text) == {"detail": "Not Found"}


def test_an_operator_manages_users_on_the_users_page_and_each_change_is_audited(
    start: Callable[[str], Console], tmp_path: Path
) -> None:
    c = start(sqlite_url(tmp_path / "fleet.db"))
    olga = c.client("olga")
    listed = olga.get("/ui/users")
    assert listed.status == 200, listed.text
    assert re.findall(r'data-testid="user-row" data-user="([^"]+)"', listed.text) == [
        "lena", "olga", "vic"
    ]  # fmt: skip
    added = olga.post("/ui/users", {"username": "nina", "role": "line-manager",
                                    "csrf_token": olga.csrf()})  # fmt: skip
    assert added.status == 200, added.text
    made = re.search(r'data-testid="new-password">([^<]+)</code>', added.text)
    assert made is not None
    nina = Client(c.url)
    assert nina.login("nina", made.group(1)).status == 303  # the shown password works
    assert nina.get("/ui/users").status == 403  # a line manager may not manage users
    again = olga.post("/ui/users", {"username": "nina", "role": "viewer",
                                    "csrf_token": olga.csrf()})  # fmt: skip
    assert again.status == 400
    assert "Not added" in again.text
    role = olga.post("/ui/users/nina/role", {"role": "viewer", "csrf_token": olga.csrf()})
    assert role.status == 303
    assert role.headers["location"] == "/ui/users?done=role"
    assert olga.post("/ui/users/nina/disable", {"csrf_token": olga.csrf()}).status == 303
    assert nina.get("/ui/").status == 303  # disabled: the session ended, back to sign-in
    reset = olga.post("/ui/users/nina/password", {"csrf_token": olga.csrf()})
    assert reset.status == 200
    assert 'data-testid="new-password"' in reset.text
    self_demote = olga.post("/ui/users/olga/role", {"role": "viewer", "csrf_token": olga.csrf()})
    assert self_demote.status == 409
    assert "your own role" in self_demote.text
    assert olga.post("/ui/users/ghost/enable", {"csrf_token": olga.csrf()}).status == 404
    with c.engine.connect() as conn:
        rows = conn.execute(
            sa.select(audit_log.c.actor, audit_log.c.action, audit_log.c.target,
                      audit_log.c.result).where(audit_log.c.action.like("user.%"))
            .order_by(audit_log.c.seq)
        ).all()  # fmt: skip
    assert [tuple(r) for r in rows] == [
        ("olga", "user.add", "user:nina", "ok"),
        ("olga", "user.add", "user:nina", "refused"),
        ("olga", "user.role", "user:nina", "ok"),
        ("olga", "user.disable", "user:nina", "ok"),
        ("olga", "user.password", "user:nina", "ok"),
        ("olga", "user.role", "user:olga", "refused"),
        ("olga", "user.enable", "user:ghost", "refused"),
    ]
    assert made.group(1) not in str(rows)  # no password in the trail
