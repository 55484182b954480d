"""The Prometheus alerting rules and the Alertmanager route shipped in packaging/prometheus/:
``promtool check rules`` and ``promtool test rules`` (each rule fires on its series, after
its ``for``), ``amtool check-config``; then Debian's prometheus and prometheus-alertmanager,
started here on loopback (free ports, temporary directories), scrape a running fleet
server (SQLite, its managed Mosquitto, an ingest worker), and when the fleet's broker is
stopped under its ingest, the shipped rule EdgefleetIngestDisconnected fires and reaches
the on-call receiver through the shipped route; the healthy fleet fired nothing before.

The live part runs the shipped expressions with their ``for`` cut to 0 s and
Alertmanager's waits to 1 s (the unit tests hold the real durations), so it takes
seconds, not minutes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_server.config import parse_config
from fleet_server.db import sqlite_url
from fleet_server.serve import FleetServer
from fleet_server.services import IngestService
from hil.loopback import free_port
from hil.webhooks import WebhookReceiver
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    make_repository,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
SHIPPED = REPO_ROOT / "packaging" / "prometheus"
RULES = SHIPPED / "edgefleet-fleet.rules.yml"
RULES_TEST = SHIPPED / "edgefleet-fleet.rules.test.yml"
ROUTE = SHIPPED / "alertmanager.example.yml"
JOB = "edgefleet-fleet"
START_S = 30.0
FIRE_S = 60.0


def _tool(name: str) -> str:
    found = shutil.which(name)
    assert found is not None, f"{name} is not installed: run `make sysdeps`"
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_the_rules_and_their_unit_tests_pass() -> None:
    checked = _run(_tool("promtool"), "check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 10 rules found" in checked.stdout
    tested = _run(_tool("promtool"), "test", "rules", str(RULES_TEST))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    route = _run(_tool("amtool"), "check-config", str(ROUTE))
    assert route.returncode == 0, route.stdout + route.stderr


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (loopback)
        return json.loads(resp.read())


def _wait(what: str, probe: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = probe()
        except OSError:
            found = None
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Daemon:
    """A process started here, stopped at the end, its output kept for a failure."""

    def __init__(self, name: str, args: list[str], log: Path) -> None:
        self.name = name
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(args, stdout=self._out, stderr=subprocess.STDOUT)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._out.close()


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FleetServer]:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    repo, keys = make_repository(tmp_path / "repo")
    cfg = parse_config(
        {
            "server": {"state_dir": str(tmp_path / "state")},
            "http": {"port": 0, "operator_token_env": TOKEN_ENV},
            "database": {"url": sqlite_url(tmp_path / "fleet.db")},
            "broker": {"mosquitto": {"port": free_port(), "persistence": False}},
            "repository": {"path": str(repo), "keystore": str(keys)},
            "ingest": {"max_disconnected_s": 1.0},
        }
    )
    server = FleetServer(cfg, services=[IngestService])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _live_rules(path: Path) -> None:
    """The shipped rules with every ``for`` cut to 0 s (the expressions as shipped)."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("for", None)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _live_route(path: Path, on_call: str, operators: str) -> None:
    """The shipped route with its receivers' URLs on loopback and its waits at 1 s."""
    doc = yaml.safe_load(ROUTE.read_text())
    urls = {"edgefleet-on-call": on_call, "edgefleet-operators": operators}
    for receiver in doc["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = urls[receiver["name"]]
    for route in [doc["route"], *doc["route"]["routes"]]:
        route.update(group_wait="1s", group_interval="1s")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _evaluated(prom: str) -> float:
    """When Prometheus last evaluated the shipped group (Unix s; 0 before the first)."""
    (group,) = _get(f"{prom}/api/v1/rules")["data"]["groups"]
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", group["lastEvaluation"]).replace("Z", "+00:00")
    return max(0.0, datetime.fromisoformat(stamp).timestamp())


def _firing(prom: str) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = _get(f"{prom}/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["state"] == "firing"]


def test_a_shipped_rule_fires_through_alertmanager_when_ingest_loses_its_broker(
    fleet: FleetServer, tmp_path: Path
) -> None:
    api = urllib.parse.urlsplit(fleet.url).netloc
    daemons: list[Daemon] = []
    with (
        WebhookReceiver(None, path="/on-call") as on_call,
        WebhookReceiver(None, path="/operators") as operators,
    ):
        am_port, prom_port = free_port(), free_port()
        route = tmp_path / "alertmanager.yml"
        _live_route(route, on_call.url, operators.url)
        rules = tmp_path / "rules.yml"
        _live_rules(rules)
        prom_config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "alerting": {"alertmanagers": [{"static_configs": [
                {"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [api]}]}],
        }  # fmt: skip
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
        try:
            daemons.append(Daemon("alertmanager", [
                _tool("prometheus-alertmanager"), f"--config.file={route}",
                f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
            ], tmp_path / "alertmanager.log"))  # fmt: skip
            daemons.append(Daemon("prometheus", [
                _tool("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ], tmp_path / "prometheus.log"))  # fmt: skip
            prom = f"http://127.0.0.1:{prom_port}"
            query = f"{prom}/api/v1/query?query=" + urllib.parse.quote(
                f'edgefleet_fleet_ingest_connected{{job="{JOB}"}}'
            )

            def connected() -> bool:
                result = _get(query)["data"]["result"]
                return bool(result) and result[0]["value"][1] == "1"

            _wait("Prometheus scraping a connected ingest worker", connected, START_S)
            seen = time.time()
            _wait("the rules evaluated since", lambda: _evaluated(prom) > seen + 1, START_S)
            assert [a["labels"]["alertname"] for a in _firing(prom)] == []  # healthy: nothing
            broker = fleet.context.managed_broker
            assert broker is not None
            broker.stop()  # the fleet's Mosquitto goes: ingest stores nothing more

            def fired() -> bool:
                return any(a["labels"]["alertname"] == "EdgefleetIngestDisconnected"
                           for a in _firing(prom))  # fmt: skip

            _wait("EdgefleetIngestDisconnected firing in Prometheus", fired, FIRE_S)
            on_call.wait_for(
                "the alert at the on-call receiver",
                lambda: any(
                    a["labels"]["alertname"] == "EdgefleetIngestDisconnected"
                    for body in on_call.bodies for a in body["alerts"]
                ),
                FIRE_S,
            )  # fmt: skip
        except AssertionError:
            for d in daemons:
                print(f"--- {d.name}:\n{d.tail()}")
            raise
        finally:
            for d in daemons:
                d.stop()
    (body, *_) = [b for b in on_call.bodies if b["status"] == "firing"]
    (alert,) = [
        a for a in body["alerts"] if a["labels"]["alertname"] == "EdgefleetIngestDisconnected"
    ]
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["worker"] == "ingest-0"
    assert alert["annotations"]["summary"] == f"ingest worker ingest-0 on {api} is off its broker"
    assert body["receiver"] == "edgefleet-on-call"
    assert not any(  # a critical alert goes to the on-call route only
        a["labels"]["alertname"] == "EdgefleetIngestDisconnected"
        for b in operators.bodies for a in b["alerts"]
    )  # fmt: skip
