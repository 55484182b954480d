"""Remote actions end to end: a fleet server in this process with its managed Mosquitto
(TLS, per-service certificates and ACL) and the actions service, a real agent that
enrolled over the API and runs as ``edge-agent run``; asked through the API and
``fleetctl`` as an operator would, refused for a viewer (and the audit trail says so)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleet_server.actions.service import ActionService
from fleet_server.audit import AuditFilter, query
from fleet_server.auth import PasswordHasher, add_user
from fleet_server.serve import FleetServer
from fleet_server.services import FileService
from tests.fleet_server.auth_client import PASSWORD, Browser
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    api_config,
    http,
    make_repository,
)
from tests.fleet_server.web.console_http_support import Client
from tests.fleet_server.web.console_server import PASSWORD as CONSOLE_PASSWORD
from tests.support.broker import free_port

BIN = Path(sys.executable).parent
DEVICE = "cam-1"
SECRET = "lens-cleaner-Pw-4411"  # noqa: S105 (a test's made-up secret)
pytestmark = pytest.mark.timeout(240)


@dataclass
class Fleet:
    server: FleetServer
    agent_dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.server.url

    def call(self, method: str, path: str, body: Any = None) -> Any:
        return http(method, self.url + path, body, token=OPERATOR_TOKEN)

    def start_agent(self) -> None:
        out = (self.agent_dir / "agent.out").open("ab")
        self.proc = subprocess.Popen(
            [str(BIN / "edge-agent"), "run", "--config", str(self.agent_dir / "agent.toml")],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop_agent(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _wait(cond: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("actions-e2e")
    saved = {k: os.environ.get(k) for k in ("EDGEFLEET_KEY_PASSPHRASE", TOKEN_ENV)}
    os.environ.pop("CREDENTIALS_DIRECTORY", None)
    os.environ["EDGEFLEET_KEY_PASSPHRASE"] = PASSPHRASE
    os.environ[TOKEN_ENV] = OPERATOR_TOKEN
    repo, keys = make_repository(tmp / "repo")
    cfg = api_config(
        tmp / "state", repo, keys,
        broker={"mosquitto": {"port": free_port(), "persistence": False}},
    )  # fmt: skip
    server = FleetServer(cfg, services=[FileService, ActionService])
    server.start()
    add_user(server.context.engine, PasswordHasher(), "vic", "viewer", PASSWORD)
    agent_dir = tmp / DEVICE
    agent_dir.mkdir()
    (agent_dir / "agent.toml").write_text(
        f'[agent]\ndevice_id = "{DEVICE}"\nstate_dir = "state"\nprofile = "x86-gateway"\n'
        "[runtime]\nworkers = 1\npin = false\n[http]\nport = 0\n"
        "[uplink]\nenabled = true\nheartbeat_interval_s = 1.0\n[bundles]\nenabled = true\n"
    )
    token = http("POST", f"{server.url}/api/v1/devices/{DEVICE}/tokens", {"profile": "x86-gateway"},
                 token=OPERATOR_TOKEN).body["token"]  # fmt: skip
    enrolled = subprocess.run(
        [str(BIN / "edge-agent"), "enroll", server.url, "--token", "-", "--config",
         str(agent_dir / "agent.toml")],
        input=token.encode(), capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert enrolled.returncode == 0, enrolled.stderr
    running = Fleet(server, agent_dir)
    try:
        yield running
    finally:
        running.stop_agent()
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _done(fleet: Fleet, rid: str, timeout_s: float = 60) -> dict[str, Any]:
    def final() -> dict[str, Any] | None:
        body: dict[str, Any] = fleet.call("GET", f"/api/v1/devices/{DEVICE}/actions/{rid}").body
        return body if body["state"] not in ("pending", "accepted", "running") else None

    answer: dict[str, Any] = _wait(final, timeout_s, f"the answer to {rid}")
    return answer


def fleetctl(fleet: Fleet, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGEFLEET_SERVER": fleet.url, "EDGEFLEET_API_TOKEN": OPERATOR_TOKEN}
    return subprocess.run(
        [str(BIN / "fleetctl"), *args], capture_output=True, text=True, timeout=120, env=env,
        check=False, cwd=cwd,
    )  # fmt: skip


def test_logs_asked_while_the_device_is_off_come_when_it_starts_redacted(fleet: Fleet) -> None:
    asked = fleet.call("POST", f"/api/v1/devices/{DEVICE}/actions",
                       {"action": "logs", "params": {"lines": 300, "since_s": 900}})  # fmt: skip
    assert asked.status == 201, asked.body
    rid = asked.body["request_id"]
    assert asked.body["state"] == "pending"
    assert asked.body["requested_by"] == "@operator-token"
    logs = fleet.agent_dir / "state" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    (logs / "hotpath.log").write_text(
        f"{stamp} hotpath WARNING vendor.lib: login password={SECRET} to rtsp://op:{SECRET}@cam\n"
    )
    fleet.start_agent()  # it was offline when asked: the request waited, retained
    answer = _done(fleet, rid)
    assert answer["state"] == "ok", answer
    assert answer["complete"] is True
    text = http_text(fleet, f"/api/v1/devices/{DEVICE}/actions/{rid}/logs")
    assert "vendor.lib: login password=*** to rtsp://op:***@cam" in text
    assert SECRET not in text
    assert "remote actions: listening" in text


def http_text(fleet: Fleet, path: str) -> str:
    import urllib.request

    req = urllib.request.Request(  # noqa: S310 - loopback
        fleet.url + path, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
        return resp.read().decode()


def test_fleetctl_logs_and_diagnostics(fleet: Fleet, tmp_path: Path) -> None:
    if fleet.proc is None:
        fleet.start_agent()
    done = fleetctl(fleet, "devices", "logs", DEVICE, "--grep", "remote actions: listening",
                    "--lines", "5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "remote actions: listening" in done.stdout
    done = fleetctl(fleet, "devices", "diagnostics", DEVICE, "--out", str(tmp_path / "d.tar.gz"))
    assert done.returncode == 0, done.stderr
    with tarfile.open(tmp_path / "d.tar.gz", mode="r:gz") as tar:
        names = {m.name for m in tar}
        config = json.load(tar.extractfile("diagnostics/config.json"))  # type: ignore[arg-type]
    assert "diagnostics/decision-log.json" in names
    assert "diagnostics/logs.txt" in names
    assert config["agent"]["device_id"] == DEVICE


def test_fleetctl_restart_and_reload(fleet: Fleet) -> None:
    if fleet.proc is None:
        fleet.start_agent()
    done = fleetctl(fleet, "devices", "restart", DEVICE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{DEVICE}: restarted: the hot path is pid")
    done = fleetctl(fleet, "devices", "reload", DEVICE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{DEVICE}: reloaded: configuration")
    listed = fleetctl(fleet, "devices", "actions", DEVICE, "--json")
    rows = json.loads(listed.stdout)
    assert [(r["action"], r["state"]) for r in rows[:2]] == [("reload", "ok"), ("restart", "ok")]
    assert rows[0]["requested_by"] == "@operator-token"


def test_a_viewer_can_not_ask_and_the_audit_trail_records_the_refusal(fleet: Fleet) -> None:
    asked = fleet.call("POST", f"/api/v1/devices/{DEVICE}/actions", {"action": "logs"})
    assert asked.status == 201
    vic = Browser(fleet.url)
    assert vic.login("vic").status == 200
    refused = vic.call("POST", f"/api/v1/devices/{DEVICE}/actions", {"action": "restart"})
    assert refused.status == 403
    assert refused.body["detail"] == "'vic' (viewer) may not devices:act"
    assert vic.call("GET", f"/api/v1/devices/{DEVICE}/actions").status == 200  # fleet:read
    engine = fleet.server.context.engine
    (entry,) = query(engine, AuditFilter(actor="vic", action="device.action"))
    assert (entry.role, entry.target, entry.result) == ("viewer", f"device:{DEVICE}", "refused")
    ok = query(engine, AuditFilter(action="device.action", result="ok"))
    assert ok
    assert {e.detail.get("kind") for e in ok} <= {"logs", "diagnostics", "restart", "reload"}


def test_bad_requests_are_refused_naming_what_is_wrong(fleet: Fleet) -> None:
    path = f"/api/v1/devices/{DEVICE}/actions"
    for body, status, why in (
        ({"action": "reboot"}, 400, "action 'reboot' is not one of"),
        ({"action": "logs", "params": {"lines": 0}}, 400, "logs.lines: 0 is not in [1, 10000]"),
        ({"action": "logs", "params": {"level": 1}}, 400, "unknown parameter(s) level"),
    ):
        answer = fleet.call("POST", path, body)
        assert answer.status == status, answer.body
        assert why in answer.body["detail"]
    assert fleet.call("POST", "/api/v1/devices/nobody/actions", {"action": "logs"}).status == 404
    assert fleet.call("GET", f"{path}/act-00000000000000000000").status == 404


def test_the_console_asks_shows_states_the_logs_tab_and_serves_the_archive(fleet: Fleet) -> None:
    if fleet.proc is None:
        fleet.start_agent()
    engine = fleet.server.context.engine
    add_user(engine, PasswordHasher(), "olga", "operator", CONSOLE_PASSWORD)
    add_user(engine, PasswordHasher(), "vera", "viewer", CONSOLE_PASSWORD)
    olga = Client(fleet.url)
    assert olga.login("olga").status == 303
    page = olga.get(f"/ui/devices/{DEVICE}")
    assert page.status == 200
    assert 'data-testid="action-restart"' in page.text
    csrf = page.field("csrf_token")
    asked = olga.post(
        f"/ui/devices/{DEVICE}/actions", {"csrf_token": csrf, "action": "diagnostics"}
    )
    assert asked.status == 303, asked.text
    rid = asked.headers["location"].split("asked=")[1].split("#")[0]
    assert _done(fleet, rid)["state"] == "ok"
    part = olga.get(f"/ui/devices/{DEVICE}/actions/live")
    row = part.text.split(f'data-request="{rid}"')[1].split("</tr>")[0]
    assert '<span class="badge st-done" data-testid="action-state">ok</span>' in row
    link = f"/ui/devices/{DEVICE}/actions/{rid}/archive"
    assert link in row
    archive = olga.request("GET", link)
    assert archive.status == 200
    assert archive.headers["content-type"] == "application/gzip"
    assert archive.headers["content-disposition"].startswith('attachment; filename="diagnostics-')
    form = {"csrf_token": csrf, "action": "logs", "since": "1h", "grep": "listening", "lines": "20"}
    asked = olga.post(f"/ui/devices/{DEVICE}/actions", form)
    assert asked.status == 303
    logs_url = asked.headers["location"]
    assert logs_url.startswith(f"/ui/devices/{DEVICE}/logs?request=act-")
    _done(fleet, logs_url.split("request=")[1])
    tab = olga.get(logs_url)
    assert 'data-testid="logs-state">ok<' in tab.text
    text = tab.text.split('data-testid="log-text">')[1].split("</pre>")[0]
    assert "remote actions: listening" in text
    vera = Client(fleet.url)
    assert vera.login("vera").status == 303
    seen = vera.get(f"/ui/devices/{DEVICE}")
    assert 'data-testid="action-restart"' not in seen.text
    assert "needs the devices:act permission" in seen.text
    refused = vera.post(f"/ui/devices/{DEVICE}/actions",
                        {"csrf_token": seen.field("csrf_token"), "action": "restart"})  # fmt: skip
    assert refused.status == 403
    assert vera.get(link).status == 403
    assert "log-text" not in vera.get(logs_url).text


def test_fleetctl_logs_follow_prints_lines_as_they_are_written(fleet: Fleet) -> None:
    if fleet.proc is None:
        fleet.start_agent()
    env = {**os.environ, "EDGEFLEET_SERVER": fleet.url, "EDGEFLEET_API_TOKEN": OPERATOR_TOKEN}
    follow = subprocess.Popen(
        [str(BIN / "fleetctl"), "devices", "logs", DEVICE, "--follow", "--grep", "followed-e2e"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        _wait(
            lambda: any(a["state"] == "running" for a in
                        fleet.call("GET", f"/api/v1/devices/{DEVICE}/actions").body),
            60, "the follow request running",
        )  # fmt: skip
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        with (fleet.agent_dir / "state" / "logs" / "hotpath.log").open("a") as f:
            f.write(f"{stamp} hotpath INFO test: followed-e2e token=abc123456 written now\n")
        assert follow.stdout is not None
        printed = []  # the agent's own line about the request holds the text too
        while not any("written now" in x for x in printed) and len(printed) < 20:
            printed.append(follow.stdout.readline())  # blocks until fleetctl prints one
        assert any(x.rstrip().endswith("test: followed-e2e token=*** written now") for x in printed)
    finally:
        follow.send_signal(signal.SIGINT)
        code = follow.wait(30)
    assert code == 0, follow.stderr.read() if follow.stderr else ""
