"""Each alert fires once and resolves once across a server restart (a fleet server on
SQLite stopped and started again) and a leader change (replicas on PostgreSQL, the
leader stopped mid-alert): a webhook receiver on loopback checks every signature and
sees one ``firing`` and one ``resolved`` per alert, never a second, while the server or
the new leader evaluates the same conditions again and again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from agent.wire.reports import ReportedState
from fleet_server.alerts import store as alerts_store
from fleet_server.alerts.config import AlertsSection
from fleet_server.alerts.runner import PROBE, AlertRunner
from fleet_server.api.context import BrokerEndpoint, ServerContext
from fleet_server.ca import FleetCA
from fleet_server.cluster.leader import PgLeader
from fleet_server.config import FleetServerConfig, parse_config
from fleet_server.db import open_database, sqlite_url, store
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.repository import KeyStore, Passphrases, Repository
from fleet_server.serve import FleetServer
from hil.webhooks import WebhookReceiver
from tests.fleet_server.cluster.cluster_support import TIMINGS, wait_for
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    api_config,
    make_repository,
)
from tests.support.pg import PgCluster

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # pg_cluster

SECRET = "failover test webhook secret, 32+"  # noqa: S105 (test only)
SECRET_ENV = "EDGEFLEET_TEST_ALERT_HOOK"  # noqa: S105 (a variable name)
EVALUATIONS = 5
"""Evaluations a (new) server or leader runs before the test says nothing came again."""


def _alerts(url: str) -> AlertsSection:
    return AlertsSection.model_validate(
        {
            "interval_s": 0.05,
            "rules": {"device_offline": {"after_minutes": 0.001}},
            "webhooks": [{"name": "ops", "url": url, "secret_env": SECRET_ENV}],
            "delivery": {"poll_s": 0.05, "backoff_s": 0.1},
        }
    )


def _offline(db: Engine, device_id: str) -> None:
    sink = SqlSink(db)
    store.upsert_device(db, device_id, labels={"site": "plant-a"}, profile="x86")
    sink.store_state(device_id, ReportedState(device_id=device_id, ts=sink.clock()))
    sink.store_state(device_id, ReportedState.offline(device_id))


def _back(db: Engine, device_id: str) -> None:
    sink = SqlSink(db)
    sink.store_state(device_id, ReportedState(device_id=device_id, ts=sink.clock()))


def _evaluations(runner: AlertRunner) -> int:
    return runner.evaluator.stats.runs


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("alerts-repo"))


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    monkeypatch.setenv(SECRET_ENV, SECRET)


def test_an_alert_fires_once_and_resolves_once_across_a_server_restart(
    tmp_path: Path, repository: tuple[Path, Path], env: None
) -> None:
    with WebhookReceiver(SECRET.encode()) as hook:
        base = api_config(tmp_path / "state", *repository, db_url=sqlite_url(tmp_path / "f.db"))
        config = base.model_copy(update={"alerts": _alerts(hook.url)})
        server = FleetServer(config, services=[AlertRunner])
        server.start()
        try:
            runner = _runner(server)
            _offline(server.context.engine, "cam-1")
            hook.wait_for("the firing", lambda: len(hook.received) == 1)
        finally:
            server.stop()
        assert hook.events() == [("firing", "device_offline", "cam-1")]
        again = FleetServer(config, services=[AlertRunner])
        again.start()  # a new process's memory: what fired is known from the database
        try:
            runner = _runner(again)
            wait_for("evaluations", lambda: _evaluations(runner) >= EVALUATIONS)
            assert hook.events() == [("firing", "device_offline", "cam-1")]
            assert again.context.alerts is not None
            assert again.context.alerts.badge() == (1, "warning")
            _back(again.context.engine, "cam-1")
            hook.wait_for("the resolved", lambda: len(hook.received) == 2)
            start = _evaluations(runner)
            wait_for("evaluations", lambda: _evaluations(runner) >= start + EVALUATIONS)
            probe = again.context.health.check()[PROBE]
        finally:
            again.stop()
    assert hook.events() == [
        ("firing", "device_offline", "cam-1"),
        ("resolved", "device_offline", "cam-1"),
    ]
    firing, resolved = hook.received
    assert firing.alert["alert_id"] == resolved.alert["alert_id"]
    assert resolved.alert["resolved_at"] is not None
    assert hook.refused == []
    assert hook.duplicates == 0
    assert probe.ok
    assert probe.detail["fired"] == 0
    assert probe.detail["resolved"] == 1


def _runner(server: FleetServer) -> AlertRunner:
    # the one service given to the server: found through its probe's bound method
    probe = server.context.health._probes[PROBE]
    runner = probe.__self__  # type: ignore[attr-defined]
    assert isinstance(runner, AlertRunner)
    return runner


class Replica:
    """A fleet server replica's alerts service with its own elector on PostgreSQL."""

    def __init__(self, name: str, config: FleetServerConfig, engine: Engine, ca: FleetCA,
                 repo: Repository) -> None:  # fmt: skip
        self.leader = PgLeader(engine, name, TIMINGS)
        endpoint = BrokerEndpoint("127.0.0.1", 1, ca.cert_path, ca.cert_path, ca.cert_path,
                                  "127.0.0.1", 1)  # fmt: skip
        self.ctx = ServerContext(config=config, engine=engine, ca=ca, repository=repo,
                                 keystore=KeyStore(repo.path / "keys"), broker=endpoint,
                                 leader=self.leader)  # fmt: skip
        self.runner = AlertRunner(self.ctx)

    def start(self) -> Replica:
        self.leader.start()
        self.runner.start()
        return self

    def stop(self) -> None:
        self.runner.stop()
        self.leader.stop()


@pytest.fixture
def pg(pg_cluster: PgCluster) -> Iterator[Engine]:
    url = pg_cluster.create_database()
    engine = open_database(url)
    try:
        yield engine
    finally:
        engine.dispose()
        pg_cluster.drop_database(url)


def test_an_alert_fires_once_and_resolves_once_across_a_leader_change(
    pg: Engine, tmp_path: Path, env: None
) -> None:
    ca = FleetCA.create(tmp_path / "ca", passphrases=Passphrases())
    repo = Repository(tmp_path / "repo")  # none: no repository role to judge
    with WebhookReceiver(SECRET.encode()) as hook:
        config = parse_config({"alerts": _alerts(hook.url).model_dump(mode="json")})
        replicas = [Replica(n, config, pg, ca, repo).start() for n in ("r1", "r2")]
        try:
            wait_for("a leader", lambda: any(r.leader.is_leader() for r in replicas))
            (first,) = [r for r in replicas if r.leader.is_leader()]
            (second,) = [r for r in replicas if r is not first]
            _offline(pg, "cam-1")
            _offline(pg, "cam-2")
            hook.wait_for("two firings", lambda: len(hook.received) == 2)
            hook.status = 500  # the receiver fails: cam-3's firing stays owed
            posts = hook.posts
            _offline(pg, "cam-3")
            hook.wait_for("a failed try", lambda: hook.posts > posts)
            first.stop()  # the leader goes; the other takes over after a lease
            hook.status = 204
            wait_for("the new leader", second.leader.is_leader, 30.0)
            hook.wait_for("the owed firing", lambda: len(hook.received) == 3)
            start = _evaluations(second.runner)
            wait_for("evaluations", lambda: _evaluations(second.runner) >= start + EVALUATIONS)
            assert sorted(hook.events()) == [
                ("firing", "device_offline", "cam-1"),
                ("firing", "device_offline", "cam-2"),
                ("firing", "device_offline", "cam-3"),
            ]
            _back(pg, "cam-1")
            hook.wait_for("a resolved", lambda: len(hook.received) == 4)
            start = _evaluations(second.runner)
            wait_for("evaluations", lambda: _evaluations(second.runner) >= start + EVALUATIONS)
            assert second.runner.evaluator.stats.fired == 0  # none fired again by the new leader
            assert second.runner.deliverer is not None
            assert second.runner.deliverer.stats.sent == 2  # cam-3's owed firing, cam-1's resolved
        finally:
            for r in replicas:
                r.stop()
    assert sorted(hook.events()) == [
        ("firing", "device_offline", "cam-1"),
        ("firing", "device_offline", "cam-2"),
        ("firing", "device_offline", "cam-3"),
        ("resolved", "device_offline", "cam-1"),
    ]
    assert hook.refused == []
    assert hook.duplicates == 0
    alerts = {a.key: a for a in alerts_store.list_alerts(pg)}
    assert alerts["cam-1"].resolved_at is not None
    assert alerts["cam-2"].resolved_at is None
    assert len({a.epoch for a in alerts.values()}) == 1  # all fired in the first term
