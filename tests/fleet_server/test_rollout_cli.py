"""fleetctl rollouts create with the shadow and accuracy options, against a running fleet
server over real HTTP: the options become the stored spec and gate policy, and a bad
value is refused naming the field."""

from __future__ import annotations

import json

from fleet_server.db import store
from tests.fleet_server.fleet_api_support import RunningApi
from tests.fleet_server.test_fleetctl_fleet import api, fails, ok, repository  # noqa: F401


def test_rollouts_create_takes_the_shadow_and_accuracy_options(
    api: RunningApi,  # noqa: F811
) -> None:
    engine = api.ctx.engine
    for i in range(2):
        store.upsert_device(engine, f"d{i}", labels={"line": "3"}, profile="jetson-orin")
        store.mark_seen(engine, f"d{i}", 100.0, True)
    created = json.loads(
        ok(
            api, "rollouts", "create", "--bundle", "tiny@1.0.0", "--select", "line=3",
            "--waves", "1,100%", "--soak", "1m", "--shadow", "2h", "--shadow-min", "300",
            "--min-agreement", "0.95", "--min-accuracy", "0.9", "--min-labels", "50",
            "--accuracy-drop", "0.05", "--json",
        )
    )  # fmt: skip
    assert (created["shadow_s"], created["shadow_min"], created["min_agreement"]) == (
        7200, 300, 0.95,
    )  # fmt: skip
    record = store.load_rollout(engine, created["rollout_id"])
    assert record is not None
    gates = record.policy["gates"]
    assert (gates["min_accuracy"], gates["min_labels"], gates["accuracy_drop"]) == (0.9, 50, 0.05)
    assert created["devices"][0]["status"] == "shadow-assigned"
    bad = fails(
        api, "rollouts", "create", "--bundle", "tiny@1.0.0", "--select", "line=3",
        "--min-agreement", "1.5", code=7,
    )  # fmt: skip
    assert "400" in bad
    assert "min_agreement" in bad


def test_rollouts_resolve_shows_and_resolves_a_stuck_device(
    api: RunningApi,  # noqa: F811
) -> None:
    engine = api.ctx.engine
    store.upsert_device(engine, "d0", labels={"line": "4"}, profile="jetson-orin")
    store.mark_seen(engine, "d0", 100.0, True)
    created = json.loads(
        ok(api, "rollouts", "create", "--bundle", "tiny@1.0.0", "--select", "line=4",
           "--waves", "100%", "--json")
    )  # fmt: skip
    rid = created["rollout_id"]
    assert created["devices"][0]["status"] == "assigned"
    ok(api, "rollouts", "rollback", rid, "--reason", "bad batch")
    shown = ok(api, "rollouts", "status", rid)
    # d0 reported no bundle before the rollout: nothing to return it to, and it says so
    assert "stuck     d0: no bundle to return to: it reported none before the rollout" in shown
    refused = fails(api, "rollouts", "resolve", rid, "d0", "--retry", code=6)
    assert "409" in refused
    assert "d0 has no bundle to return to" in refused
    assigned = ok(api, "rollouts", "resolve", rid, "d0", "--assign", "1")
    assert f"assign: d0 is reverting; rollout {rid} is rolling_back" in assigned
    accepted = json.loads(
        ok(api, "rollouts", "resolve", rid, "d0", "--accept", "--reason", "on site", "--json")
    )
    assert accepted["phase"] == "rolled_back"
    (d0,) = accepted["devices"]
    assert d0["status"] == "accepted"
    # it never reported a bundle (no agent in this test); who accepted it is kept
    assert d0["why"] == "accepted as it is (no bundle) by @operator-token: on site"
