"""``GET /api/v1/decisions/accuracy`` (and its alias ``/api/v1/accuracy``) over real
HTTP on SQLite and on PostgreSQL: per model version and line, with Wilson intervals and
precision/recall per outcome, the earlier fields unchanged; a bad confidence is a 400
naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_server.auth import PasswordHasher, add_user
from fleet_server.quality.stats import wilson_interval
from fleet_server.serve import FleetServer
from tests.fleet_server.auth_client import PASSWORD, Browser
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    LocalRolloutOps,
    RunningApi,
    api_config,
    make_repository,
)
from tests.fleet_server.review_data import Fleet
from tests.fleet_server.test_accuracy_intervals import LINE_1_V1, seed

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db_url (SQLite and PostgreSQL), pg_cluster


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("accuracy-repo"))


@pytest.fixture
def api(
    tmp_path: Path, repository: tuple[Path, Path], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunningApi]:
    """On SQLite and on PostgreSQL, with a viewer vic."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    server = FleetServer(
        api_config(tmp_path / "state", *repository, db_url=db_url), services=[LocalRolloutOps]
    )
    server.start()
    try:
        add_user(server.context.engine, PasswordHasher(), "vic", "viewer", PASSWORD)
        yield RunningApi(server)
    finally:
        server.stop()


def test_accuracy_by_version_and_line_has_intervals_and_precision_recall(
    api: RunningApi,
) -> None:
    engine = api.ctx.engine
    fleet = Fleet()
    fleet.add_device(engine, "d1", line="1")
    seed(engine, fleet, "d1", LINE_1_V1, line="1", version="1.0.0")
    new_pairs = {("pass", "pass"): 3, ("pass", "reject"): 3}
    seed(engine, fleet, "d1", new_pairs, line="1", version="1.1.0")
    vic = Browser(api.url)
    assert vic.login("vic").status == 200
    answer = vic.call("GET", "/api/v1/decisions/accuracy?group=model_version,line")
    assert answer.status == 200, answer.body
    body = answer.body
    assert body["group"] == ["model_version", "line"]
    assert body["confidence"] == 0.95
    old, new = body["groups"]
    assert old["key"] == {"model_version": "1.0.0", "line": "1"}
    assert new["key"] == {"model_version": "1.1.0", "line": "1"}
    # the fields from before, unchanged
    assert (old["reviewed"], old["confirmed"], old["overridden"]) == (20, 17, 3)
    assert old["accuracy"] == pytest.approx(0.85)
    assert {"decided": "reject", "reviewed": "pass", "count": 2} in old["confusion"]
    # the interval
    assert (old["accuracy_lower"], old["accuracy_upper"]) == pytest.approx(wilson_interval(17, 20))
    assert (new["accuracy_lower"], new["accuracy_upper"]) == pytest.approx(wilson_interval(3, 6))
    # precision and recall per outcome, with counts and intervals
    reject = {o["outcome"]: o for o in old["outcomes"]}["reject"]
    assert reject == {
        "outcome": "reject",
        "correct": 8,
        "decided": 10,
        "labelled": 9,
        "precision": pytest.approx(0.8),
        "precision_lower": pytest.approx(wilson_interval(8, 10)[0]),
        "precision_upper": pytest.approx(wilson_interval(8, 10)[1]),
        "recall": pytest.approx(8 / 9),
        "recall_lower": pytest.approx(wilson_interval(8, 9)[0]),
        "recall_upper": pytest.approx(wilson_interval(8, 9)[1]),
    }
    never_called = {o["outcome"]: o for o in new["outcomes"]}["reject"]
    assert never_called["precision"] is None
    assert (never_called["precision_lower"], never_called["precision_upper"]) == (0.0, 1.0)
    total = body["total"]
    assert (total["reviewed"], total["confirmed"]) == (26, 20)
    assert (total["accuracy_lower"], total["accuracy_upper"]) == pytest.approx(
        wilson_interval(20, 26)
    )

    alias = vic.call("GET", "/api/v1/accuracy?group=model_version,line")
    assert alias.status == 200
    assert alias.body == body

    narrow = vic.call(
        "GET", "/api/v1/accuracy?group=model_version&model_version=1.0.0&confidence=0.8"
    )
    assert narrow.status == 200, narrow.body
    assert narrow.body["confidence"] == 0.8
    (only,) = narrow.body["groups"]
    assert (only["accuracy_lower"], only["accuracy_upper"]) == pytest.approx(
        wilson_interval(17, 20, 0.8)
    )

    for bad in ("confidence=1.5", "confidence=0.2", "confidence=lots"):
        refused = vic.call("GET", f"/api/v1/decisions/accuracy?{bad}")
        assert refused.status == 400, (bad, refused.body)
        assert "confidence" in refused.body["detail"], (bad, refused.body)
