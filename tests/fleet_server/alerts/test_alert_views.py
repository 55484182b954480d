"""The alerts as an operator sees them, on a fleet server in this process with its
alerts service: the API (firing, resolved, one alert with its deliveries, the dead
letters; read for a viewer, refused without a credential), ``fleetctl alerts`` as a
process, the console's alerts page and the badge in its menu (a viewer signed in), and
the alert families of ``GET /metrics``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.wire.reports import ReportedState
from fleet_server.alerts.config import RULE_NAMES
from fleet_server.alerts.runner import PROBE, AlertRunner
from fleet_server.auth import add_user
from fleet_server.cli.alerts import RULES
from fleet_server.db import sqlite_url, store
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.serve import FleetServer
from hil.loopback import free_port
from tests.fleet_server.cluster.cluster_support import wait_for
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    api_config,
    http,
    make_repository,
)
from tests.fleet_server.metrics.fleet_metrics_support import scrape
from tests.fleet_server.web.console_http_support import HASHER, Client
from tests.fleet_server.web.console_server import PASSWORD

BIN = Path(sys.executable).parent
SECRET_ENV = "EDGEFLEET_TEST_VIEWS_HOOK"  # noqa: S105 (a variable name)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("alerts-views-repo"))


@pytest.fixture
def server(
    tmp_path: Path, repository: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[FleetServer]:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    monkeypatch.setenv(SECRET_ENV, "views test webhook secret 0123456789")
    base = api_config(tmp_path / "state", *repository, db_url=sqlite_url(tmp_path / "f.db"))
    down = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens: every try fails
    config = base.model_copy(
        update={
            "alerts": base.alerts.model_validate(
                {"interval_s": 0.05, "rules": {"device_offline": {"after_minutes": 0.001}},
                 "webhooks": [{"name": "pager", "url": down, "secret_env": SECRET_ENV}],
                 "delivery": {"attempts": 2, "backoff_s": 0.05, "poll_s": 0.05}}
            )
        }
    )  # fmt: skip
    srv = FleetServer(config, services=[AlertRunner])
    srv.start()
    add_user(srv.context.engine, HASHER, "vic", "viewer", PASSWORD)
    yield srv
    srv.stop()


def _offline(srv: FleetServer, device_id: str, site: str) -> None:
    db = srv.context.engine
    sink = SqlSink(db)
    store.upsert_device(db, device_id, labels={"site": site}, profile="x86")
    sink.store_state(device_id, ReportedState(device_id=device_id, ts=sink.clock()))
    sink.store_state(device_id, ReportedState.offline(device_id))


def _fleetctl(srv: FleetServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    env |= {"EDGEFLEET_API_TOKEN": OPERATOR_TOKEN, "EDGEFLEET_SERVER": srv.url}
    return subprocess.run([str(BIN / "fleetctl"), *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_the_api_fleetctl_and_the_console_show_the_alerts_and_the_dead_letters(
    server: FleetServer,
) -> None:
    assert RULES == RULE_NAMES  # fleetctl's copy of the names (it imports no server code)
    _offline(server, "cam-7", "plant-a")
    _offline(server, "cam-8", "plant-b")
    health = server.context.health

    def dead() -> int:
        return int(health.check()[PROBE].detail["dead_letters"])

    wait_for("two dead letters (the webhook is down)", lambda: dead() == 2)
    url = server.url
    page = http("GET", f"{url}/api/v1/alerts?site=plant-a", token=OPERATOR_TOKEN)
    assert page.status == 200
    (alert,) = page.body["alerts"]
    assert (alert["rule"], alert["key"], alert["state"]) == ("device_offline", "cam-7", "firing")
    assert page.body["firing"] == {"warning": 2}
    one = http("GET", f"{url}/api/v1/alerts/{alert['alert_id']}", token=OPERATOR_TOKEN).body
    (delivery,) = one["deliveries"]
    assert (delivery["webhook"], delivery["state"], delivery["attempts"]) == ("pager", "dead", 2)
    letters = http("GET", f"{url}/api/v1/alerts/dead-letters", token=OPERATOR_TOKEN).body
    assert len(letters["dead_letters"]) == 2
    assert "Connection refused" in letters["dead_letters"][0]["last_error"]
    assert http("GET", f"{url}/api/v1/alerts/999", token=OPERATOR_TOKEN).status == 404
    bad = http("GET", f"{url}/api/v1/alerts?rule=nope", token=OPERATOR_TOKEN)
    assert bad.status == 400
    assert "rule" in bad.body["detail"]
    assert http("GET", f"{url}/api/v1/alerts").status == 401
    assert (
        http("GET", f"{url}/api/v1/alerts?state=resolved", token=OPERATOR_TOKEN).body["alerts"]
        == []
    )

    metrics = scrape(url)
    assert metrics.value("edgefleet_fleet_alerts_firing", severity="warning") is not None
    assert metrics.value("edgefleet_fleet_alert_deliveries_total", result="dead") == 2
    assert metrics.value("edgefleet_fleet_alert_deliveries_total", result="sent") == 0
    assert (metrics.value("edgefleet_fleet_alert_evaluations_total") or 0) >= 1

    listed = _fleetctl(server, "alerts")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0] == "2 firing (2 warning)"
    assert "cam-8 offline for over 0 min" in listed.stdout
    as_json = json.loads(_fleetctl(server, "alerts", "list", "--site", "plant-b", "--json").stdout)
    assert [a["key"] for a in as_json["alerts"]] == ["cam-8"]
    shown = _fleetctl(server, "alerts", "show", str(alert["alert_id"]))
    assert "labels: device=cam-7, site=plant-a" in shown.stdout
    assert "pager" in shown.stdout
    assert "dead" in shown.stdout
    letters_out = _fleetctl(server, "alerts", "dead-letters")
    assert letters_out.stdout.splitlines()[-1] == "2 dead letters"
    missing = _fleetctl(server, "alerts", "show", "999")
    assert missing.returncode == 5  # fleetctl: not found
    assert "no alert 999" in missing.stderr

    viewer = Client(url)
    assert viewer.login("vic").status == 303
    overview = viewer.get("/ui/")
    assert 'data-testid="alert-badge"' in overview.text
    assert ">2</span>" in overview.text.split('data-testid="alert-badge"', 1)[1][:200]
    alerts = viewer.get("/ui/alerts")
    assert alerts.status == 200
    assert alerts.text.count('data-testid="alert-row"') == 2
    assert 'href="/ui/devices/cam-7"' in alerts.text
    assert alerts.text.count('data-testid="dead-letter"') == 2
    only_b = viewer.get("/ui/alerts?site=plant-b&state=all")
    assert only_b.text.count('data-testid="alert-row"') == 1
    assert viewer.get("/ui/alerts?state=bogus").status == 400
    # cam-7 comes back: its alert resolves, the badge counts one
    SqlSink(server.context.engine).store_state(
        "cam-7", ReportedState(device_id="cam-7", ts=SqlSink(server.context.engine).clock())
    )
    board = server.context.alerts
    assert board is not None
    wait_for("the badge at 1", lambda: board.badge() == (1, "warning"))
    resolved = viewer.get("/ui/alerts?state=resolved")
    assert resolved.text.count('data-testid="alert-row"') == 1
    assert 'data-key="cam-7"' in resolved.text
