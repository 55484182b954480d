"""Rollout alerts through the real rollout service (its controller, its store, devices
that report through the ingest sink) on SQLite and PostgreSQL, evaluated by the alerts'
evaluator and delivered to a signed webhook on loopback: a wave awaiting approval fires
and resolves once approved; a gate that stops a rollout fires, a device stuck in the
revert fires, and when an operator accepts it both resolve and the rolled-back alert
fires; evaluating again changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine

from fleet_server.alerts import store as alerts_store
from fleet_server.alerts.config import AlertsSection
from fleet_server.alerts.delivery import Deliverer
from fleet_server.alerts.facts import Sources
from fleet_server.alerts.runner import Evaluator
from fleet_server.cluster import SingleReplica
from fleet_server.repository import KeyStore, Repository
from hil.webhooks import WebhookReceiver
from tests.agent.installer.installer_helpers import make_bundle
from tests.fleet_server.test_rollout_service import SPEC, VERSIONS, Setup

pytest_plugins = ["tests.fleet_server.db_fixtures"]

SECRET = b"rollout alerts test webhook secret"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KeyStore, Repository]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGEFLEET_KEY_PASSPHRASE", "test passphrase, made at test time")
        root = tmp_path_factory.mktemp("fleet")
        keys = KeyStore.create(root / "keys", root_keys=1, root_threshold=1)
        repo = Repository(root / "repo")
        repo.init(keys)
        for release, version in VERSIONS.items():
            bundle = make_bundle(root, name="cls", version=version, release=release, budget_ms=50)
            repo.publish(bundle.path, keys)
        yield keys, repo


def test_rollout_alerts_fire_once_and_resolve_once_as_the_rollouts_move(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    for device in ("a1", "a2"):
        s.device(device, line="3")
    for device in ("b1", "b2"):
        s.device(device, line="4")
    with WebhookReceiver(SECRET, clock=s.clock) as hook:
        section = AlertsSection.model_validate(
            {"webhooks": [{"name": "ops", "url": hook.url, "secret_env": "X"}],
             "rules": {"device_offline": {"enabled": False}}}
        )  # fmt: skip
        evaluator = Evaluator(db, section, SingleReplica("r1"), Sources(), clock=s.clock)
        deliverer = Deliverer(db, section, {"ops": SECRET}, clock=s.clock)

        def evaluate() -> list[tuple[str, str, str]]:
            before = len(hook.received)
            evaluator.run_once()
            deliverer.run_once()
            return hook.events()[before:]

        waits = s.service.create({**SPEC, "waves": "1,100%",
                                  "policy": {"approval_between_waves": True}})  # fmt: skip
        gated = s.service.create({**SPEC, "selector": "line=4", "waves": "100%",
                                  "policy": {"timeouts": {"rolling_back_s": 5}}})  # fmt: skip
        assert evaluate() == []
        for device in s.tick():
            if device.startswith("a"):
                s.install(device, 2)
            elif device == "b1":
                s.install(device, 2)  # b1 switched and is not heard of again
            else:
                s.install(device, 2, "failed")  # b2's install fails: the gate stops it
        s.tick()
        assert s.service.get(waits)["phase"] == "awaiting_approval"
        assert s.service.get(gated)["phase"] == "rolling_back"
        assert sorted(evaluate()) == [
            ("firing", "rollout_awaiting_approval", waits),
            ("firing", "rollout_gate_stopped", gated),
        ]
        assert evaluate() == []  # the same conditions: the same alerts
        for _ in range(6):  # b1 never confirms its revert: stuck after rolling_back_s
            s.tick()
        assert s.status(gated)["b1"] == "stuck"
        assert evaluate() == [("firing", "device_stuck_reverting", f"{gated}/b1")]
        s.service.act(waits, "approve", by="olga")
        s.service.resolve(gated, "b1", "accept", reason="swapped by hand", by="olga")
        s.tick()
        assert s.service.get(gated)["phase"] == "rolled_back"
        assert sorted(evaluate()) == [
            ("firing", "rollout_rolled_back", gated),
            ("resolved", "device_stuck_reverting", f"{gated}/b1"),
            ("resolved", "rollout_awaiting_approval", waits),
            ("resolved", "rollout_gate_stopped", gated),
        ]
        assert evaluate() == []
        # past the hold, the rolled-back alert resolves, once
        s.clock.advance(section.rules.rollout_rolled_back.hold_minutes * 60)
        assert evaluate() == [("resolved", "rollout_rolled_back", gated)]
        assert evaluate() == []
        assert hook.refused == []
        assert hook.duplicates == 0
    (stuck,) = alerts_store.list_alerts(db, rule="device_stuck_reverting")
    assert stuck.labels == {"rollout": gated, "device": "b1"}
    assert stuck.resolved_at is not None
    assert alerts_store.firing_counts(db) == {}
    assert evaluator.stats.fired == 4
    assert evaluator.stats.resolved == 4
