"""Who may scrape GET /metrics: with ``[metrics] token_env`` a bearer of the scrape token
or of the operator token, nobody else (while /healthz stays open); a token variable named
but unset stops the start; ``enabled = false`` serves no /metrics at all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_server.metrics.config import MetricsSection
from fleet_server.metrics.endpoint import MetricsError
from fleet_server.serve import FleetServer
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    WRONG_TOKEN,
    api_config,
    http,
    make_repository,
)
from tests.fleet_server.metrics.fleet_metrics_support import scrape

SCRAPE_ENV = "EDGEFLEET_TEST_METRICS_TOKEN"
SCRAPE_TOKEN = "scrape-token-for-tests-abcdefghij"  # noqa: S105 (test only)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("metrics-access-repo"))


@pytest.fixture(autouse=True)
def secrets_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    monkeypatch.setenv(SCRAPE_ENV, SCRAPE_TOKEN)


def _server(tmp_path: Path, repository: tuple[Path, Path], metrics: MetricsSection) -> FleetServer:
    cfg = api_config(tmp_path / "state", *repository)
    return FleetServer(cfg.model_copy(update={"metrics": metrics}))


@pytest.fixture
def guarded(tmp_path: Path, repository: tuple[Path, Path]) -> Iterator[str]:
    with _server(tmp_path, repository, MetricsSection(token_env=SCRAPE_ENV)) as server:
        yield server.url


def test_with_a_scrape_token_an_anonymous_or_wrong_bearer_gets_401(guarded: str) -> None:
    anonymous = scrape(guarded)
    assert anonymous.status == 401
    assert "metrics token" in anonymous.text
    assert "edgefleet_fleet_" not in anonymous.text
    assert scrape(guarded, token=WRONG_TOKEN).status == 401
    assert http("GET", guarded + "/healthz").status == 200  # health stays open


def test_with_a_scrape_token_it_or_the_operator_token_may_scrape(guarded: str) -> None:
    for token in (SCRAPE_TOKEN, OPERATOR_TOKEN):
        answer = scrape(guarded, token=token)
        assert answer.status == 200, answer.text
        names = {x.name for x in answer.samples()}
        assert "edgefleet_fleet_leader" in names
        assert "# TYPE edgefleet_fleet_http_request_duration_seconds histogram" in answer.text


def test_the_scrape_token_is_no_operator_token_for_the_api(guarded: str) -> None:
    assert http("GET", guarded + "/api/v1/devices", token=SCRAPE_TOKEN).status == 401


def test_a_named_but_unset_scrape_token_stops_the_start(
    tmp_path: Path, repository: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SCRAPE_ENV)
    server = _server(tmp_path, repository, MetricsSection(token_env=SCRAPE_ENV))
    with pytest.raises(MetricsError, match=f"\\${SCRAPE_ENV} is not set"):
        server.start()
    server.stop()


def test_metrics_disabled_serves_no_metrics(tmp_path: Path, repository: tuple[Path, Path]) -> None:
    with _server(tmp_path, repository, MetricsSection(enabled=False)) as server:
        assert scrape(server.url, token=OPERATOR_TOKEN).status == 404
        assert http("GET", server.url + "/healthz").status == 200
