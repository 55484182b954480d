"""The Grafana dashboards in packaging/grafana/: valid dashboard JSON (schema version, a
Prometheus data source variable every panel uses), and every metric their PromQL names
exists: fleet.json's in a running fleet server's /metrics, device.json's in the agent's
/metrics (its real metrics served by its real local HTTP server). docs/metrics.md names
every family the fleet server declares."""

from __future__ import annotations

import copy
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.http import LocalHttpServer
from agent.metrics import AgentMetrics
from fleet_server.serve import FleetServer
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    api_config,
    make_repository,
)
from tests.fleet_server.metrics.fleet_metrics_support import (
    REPO_ROOT,
    dashboard_exprs,
    declared_names,
    load_dashboard,
    panels,
    promql_metrics,
    scrape,
    unknown_metrics,
)

DASHBOARDS = ("fleet.json", "device.json")


@pytest.fixture(scope="module")
def fleet_exposition(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("grafana-fleet")
    repo, keys = make_repository(root)
    with pytest.MonkeyPatch.context() as env:
        env.delenv("CREDENTIALS_DIRECTORY", raising=False)
        env.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
        env.setenv(TOKEN_ENV, OPERATOR_TOKEN)
        with FleetServer(api_config(root / "state", repo, keys)) as server:
            answer = scrape(server.url)
            assert answer.status == 200, answer.text
            yield answer.text


@pytest.fixture(scope="module")
def agent_exposition() -> Iterator[str]:
    metrics = AgentMetrics()
    server = LocalHttpServer(
        "127.0.0.1", 0, metrics, health=lambda: (True, {}), ready=lambda: (True, {})
    )
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as resp:
            assert resp.status == 200
            yield resp.read().decode()
    finally:
        server.stop()


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_is_grafana_json_on_a_prometheus_data_source_variable(name: str) -> None:
    board = load_dashboard(name)
    assert isinstance(board["schemaVersion"], int)
    assert board["schemaVersion"] >= 36
    assert board["uid"]
    assert board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    shown = [p for p in panels(board) if p["type"] != "row"]
    assert len(shown) >= 10
    for panel in shown:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], panel["title"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


def test_fleet_dashboard_names_only_metrics_the_fleet_server_exposes(
    fleet_exposition: str,
) -> None:
    board = load_dashboard("fleet.json")
    assert unknown_metrics(board, declared_names(fleet_exposition)) == {}
    used = set().union(*(promql_metrics(e) for e in dashboard_exprs(board)))
    prefix = "edgefleet_fleet_"
    for family in (
        "leader",
        "ingest_received_messages_total",
        "ingest_lag_seconds",
        "quarantined_payloads",
        "devices_online",
        "rollouts",
        "retention_runs_total",
        "retention_deleted_rows_total",
        "http_request_duration_seconds_bucket",
    ):
        assert prefix + family in used


def test_device_dashboard_names_only_metrics_the_agent_exposes(agent_exposition: str) -> None:
    board = load_dashboard("device.json")
    assert unknown_metrics(board, declared_names(agent_exposition)) == {}
    used = set().union(*(promql_metrics(e) for e in dashboard_exprs(board)))
    assert len(used) >= 20
    assert {"edgefleet_e2e_latency_seconds_bucket", "edgefleet_uplink_connected"} <= used


def test_a_dashboard_naming_a_metric_that_does_not_exist_fails_the_check(
    fleet_exposition: str,
) -> None:
    board: dict[str, Any] = copy.deepcopy(load_dashboard("fleet.json"))
    expr = 'sum by (route) (rate(edgefleet_fleet_http_requests_total{route=~"$r"}[5m]))'
    board["panels"][1]["targets"].append({"refId": "Z", "expr": expr})
    assert unknown_metrics(board, declared_names(fleet_exposition)) == {
        expr: {"edgefleet_fleet_http_requests_total"}
    }


def test_promql_metric_names_skip_functions_labels_ranges_and_variables() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, route) "
        '(rate(a_bucket{instance=~"$instance", route!="x_y"}[$__rate_interval]))) '
        "/ on (instance) group_left max without (job) (b_total offset 1h) > 1e3 "
        "or vector(0) and time() - c_seconds"
    )
    assert promql_metrics(expr) == {"a_bucket", "b_total", "c_seconds"}


def test_docs_name_every_fleet_metric_family(fleet_exposition: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    doc = (REPO_ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    families = {f.name for f in text_string_to_metric_families(fleet_exposition)}
    assert len(families) >= 25
    missing = sorted(f for f in families if f"`{f}`" not in doc)
    assert missing == []


def test_the_readme_names_both_dashboards() -> None:
    readme = (Path(REPO_ROOT) / "packaging" / "grafana" / "README.md").read_text()
    for name in DASHBOARDS:
        assert name in readme
