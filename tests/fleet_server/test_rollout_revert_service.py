"""Every rollback finishes or says why, through the rollout service over a real SQLite
database and a real signed repository: a revert to a release no slot holds is a signed
``revert`` directive; a revert the fleet cannot send leaves the device stuck with why; an
operator resolves a stuck device (assign, retry, accept), kept with who did it; a rollout
on devices another active rollout holds is refused, naming it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from tuf.api.metadata import Metadata, Targets

from agent.wire import topics
from agent.wire.messages import BundleRef, install_state_event
from fleet_server.db import open_database, sqlite_url, store
from fleet_server.repository import KeyStore, Repository
from fleet_server.rollout import RolloutError
from fleet_server.rollout.service import RolloutOverlap
from tests.agent.installer.installer_helpers import make_bundle
from tests.fleet_server.test_rollout_service import PROFILE, SPEC, VERSIONS, Setup
from tests.support.pg import PgCluster

pytest_plugins = ["tests.fleet_server.db_fixtures"]


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


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Engine]:
    engine = open_database(sqlite_url(tmp_path / "fleet.db"))
    yield engine
    engine.dispose()


UNPUBLISHED = BundleRef(name="cls", version="0.9.0", release=0)
"""A bundle a device was set up with that the fleet's repository never published."""


def _custom(payload: bytes) -> dict[str, Any]:
    custom: dict[str, Any] = (
        Metadata[Targets].from_bytes(payload).signed.unrecognized_fields["custom"]
    )
    return custom


def _release(payload: bytes) -> int:
    (path,) = Metadata[Targets].from_bytes(payload).signed.targets
    return int(path.split("/")[2])


def _switch(s: Setup, device_id: str, release: int, previous: BundleRef | None) -> None:
    """The device installed ``release``; its other slot holds ``previous`` (None: its
    set-up bundle ran from its configured directory, no slot holds it)."""
    at = s.clock.advance(0.01)
    report = {"at": at, "source": "mqtt", "outcome": "committed", "step": "commit",
              "reason": "", "bundle": "cls", "release": release}  # fmt: skip
    s.sink.store_events([install_state_event(device_id, report)])
    s.report_state(device_id, s.ref(release), previous)


def _sent_to(s: Setup, before: int, device_id: str) -> list[bytes]:
    return [p for t, p, *_ in s.sent[before:] if topics.device_of(t) == device_id]


def test_a_revert_to_the_set_up_bundle_no_slot_holds_is_a_signed_revert_directive(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    s.device("gw-1")  # set up with release 1: it reports it active, no slot holds it
    set_up = BundleRef(name="cls", version="1.0.0", release=1, digest="ab" * 32)
    s.report_state("gw-1", set_up, None)
    row = store.get_device(db, "gw-1")
    assert row is not None
    assert (row.active_bundle, row.active_release, row.active_version, row.active_digest) == (
        "cls", 1, "1.0.0", "ab" * 32,
    )  # fmt: skip
    rid = s.service.create({**SPEC, "waves": "100%"})
    (canary,) = s.tick()
    _switch(s, canary, 2, None)
    s.tick()
    assert s.service.get(rid)["phase"] in ("soaking", "completed")
    before = len(s.sent)
    view = s.service.act(rid, "rollback", "wrong model", by="alice")
    (payload,) = _sent_to(s, before, canary)
    assert _custom(payload) == {"device_id": canary, "hardware_class": PROFILE, "mode": "revert"}
    assert _release(payload) == 1
    (entry,) = view["devices"]
    assert entry["status"] == "reverting"
    assert entry["revert_to"] == {"name": "cls", "release": 1}
    assert entry["revert_deadline"] is not None
    # the agent fetched and installed release 1: the rollback finishes
    _switch(s, canary, 1, s.ref(2))
    s.tick()
    view = s.service.get(rid)
    assert view["phase"] == "rolled_back", view["reason"]
    assert view["reason"].startswith("rollback by operator (alice): wrong model")
    notes = store.list_events(db, rid, kind="rollout")
    assert any(n.payload.get("by") == "alice" for n in notes)


def test_a_revert_the_fleet_cannot_send_is_stuck_with_why_and_an_operator_assigns_a_release(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    s.device("gw-1")
    s.report_state("gw-1", UNPUBLISHED, None)
    rid = s.service.create({**SPEC, "waves": "100%"})
    (canary,) = s.tick()
    _switch(s, canary, 2, None)
    s.tick()
    before = len(s.sent)
    view = s.service.act(rid, "rollback", by="alice")
    assert _sent_to(s, before, canary) == []  # release 0 is not published: nothing sent
    assert view["phase"] == "rolling_back"
    (stuck,) = view["stuck"]
    assert stuck["device_id"] == canary
    assert stuck["why"] == (
        "the revert could not be sent: bundle 'cls' release 0 is not published "
        "(bundles/cls/0/manifest.json)"
    )
    kinds = [n.payload["kind"] for n in store.list_events(db, rid, kind="rollout")]
    assert "device_stuck" in kinds
    s.tick()
    assert s.service.get(rid)["phase"] == "rolling_back"  # waits for an operator

    with pytest.raises(RolloutError, match="device 'gw-nope' is not in rollout"):
        s.service.resolve(rid, "gw-nope", "accept", by="bob")
    before = len(s.sent)
    view = s.service.resolve(rid, canary, "assign", release=1, by="bob", reason="known good")
    (payload,) = _sent_to(s, before, canary)
    assert _release(payload) == 1
    assert _custom(payload)["mode"] == "revert"
    (entry,) = view["devices"]
    assert (entry["status"], entry["revert_to"]) == ("reverting", {"name": "cls", "release": 1})
    resolved = [
        n.payload
        for n in store.list_events(db, rid, kind="rollout")
        if n.payload["kind"] == "resolved"
    ]
    assert resolved == [
        resolved[0]
        | {
            "by": "bob",
            "message": f"{canary}: assign by bob: revert to cls release 1: known good",
        }
    ]
    _switch(s, canary, 1, s.ref(2))
    s.tick()
    view = s.service.get(rid)
    assert view["phase"] == "rolled_back", view["reason"]
    assert view["devices"][0]["status"] == "rolled-back"


def test_an_operator_accepts_a_stuck_device_as_it_is_and_the_rollback_ends(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    s.device("gw-1")
    s.report_state("gw-1", UNPUBLISHED, None)
    rid = s.service.create({**SPEC, "waves": "100%"})
    (canary,) = s.tick()
    _switch(s, canary, 2, None)
    s.tick()
    s.service.act(rid, "rollback")
    view = s.service.resolve(rid, canary, "accept", by="carol")
    assert view["phase"] == "rolled_back"
    (entry,) = view["devices"]
    assert entry["status"] == "accepted"
    assert entry["why"] == "accepted as it is (cls release 2) by carol"
    assert view["reason"].endswith(f"accepted as they are: {canary}")
    with pytest.raises(RolloutError, match="cannot resolve a rollout that is rolled_back"):
        s.service.resolve(rid, canary, "retry", by="carol")


def test_a_rollout_on_devices_another_active_rollout_holds_is_refused_naming_it(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    for d in ("gw-1", "gw-2", "gw-3"):
        s.device(d)
    s.device("gw-9", line="9")
    first = s.service.create({**SPEC, "selector": "line=3", "waves": "1,100%"})
    with pytest.raises(RolloutOverlap) as caught:
        s.service.create({**SPEC, "selector": "*"})
    assert caught.value.other == first
    assert caught.value.devices == ["gw-1", "gw-2", "gw-3"]
    assert str(caught.value) == (
        f"rollout: selector: 3 selected devices are held by rollout {first} (planned): "
        "gw-1, gw-2, gw-3; wait for it to end, or cancel it (or resolve its stuck devices) first"
    )
    assert len(s.service.list()) == 1  # nothing stored
    other = s.service.create({**SPEC, "selector": "line=9"})  # no device in common
    assert other != first

    # rolling back, the first holds only the devices whose revert is open
    (canary,) = [d for d in s.tick() if d != "gw-9"]
    _switch(s, canary, 2, None)
    s.service.act(first, "rollback")
    with pytest.raises(RolloutOverlap) as caught:
        s.service.create({**SPEC, "selector": "line=3"})
    assert (caught.value.other, caught.value.devices) == (first, [canary])
    assert f"held by rollout {first} (rolling_back): {canary};" in str(caught.value)
    s.service.resolve(first, canary, "accept", by="dave")
    assert s.service.get(first)["phase"] == "rolled_back"
    s.service.create({**SPEC, "selector": "line=3"})  # nothing holds them now


def test_two_rollouts_created_at_once_on_postgresql_hold_their_devices_once(
    pg_cluster: PgCluster, fleet: tuple[KeyStore, Repository]
) -> None:
    """Two creations at the same moment (two threads, two connections; replicas would be
    two processes) on the same devices: each round one is stored and the other refused
    naming it, never both (the overlap check runs under an advisory lock there)."""
    url = pg_cluster.create_database()
    engine = open_database(url)
    try:
        s = Setup(engine, fleet)
        for d in ("gw-1", "gw-2"):
            s.device(d)
        for _ in range(4):
            barrier = threading.Barrier(2, timeout=30)
            made: list[str] = []
            refused: list[RolloutOverlap] = []

            def create(
                barrier: threading.Barrier, made: list[str], refused: list[RolloutOverlap]
            ) -> None:
                barrier.wait()
                try:
                    made.append(s.service.create({**SPEC, "selector": "line=3"}))
                except RolloutOverlap as exc:
                    refused.append(exc)

            threads = [
                threading.Thread(target=create, args=(barrier, made, refused)) for _ in range(2)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert len(made) == 1, (made, refused)
            assert [r.other for r in refused] == made
            s.service.act(made[0], "cancel")
    finally:
        engine.dispose()
        pg_cluster.drop_database(url)
