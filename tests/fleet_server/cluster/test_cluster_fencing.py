"""Fencing of the rollout reconciler on a real PostgreSQL: a replica whose lock session
is gone can't save a rollout (its epoch is stale) nor publish (its lease ran out); three
replicas carry one rollout to completion while the leader is cut off in every phase, the
old leader never publishing after the next one starts, and no device ever told two
different things."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine

from agent.wire import topics
from fleet_server.cluster import NotLeader
from fleet_server.cluster.leader import PgLeader
from fleet_server.db import open_database, store
from fleet_server.db.cluster import ROLLOUTS_ROLE, load_leader, raise_epoch
from fleet_server.repository import KeyStore, Repository
from fleet_server.rollout.serialize import from_dict
from fleet_server.rollout.service import RolloutService
from fleet_server.rollout.state import TERMINAL, Phase
from tests.fleet_server.cluster.cluster_support import (
    TIMINGS,
    Devices,
    Journal,
    Replica,
    directive_release,
    make_fleet,
    terminate_backend,
    try_terminate_backend,
    wait_for,
)
from tests.support.pg import PgCluster

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # pg_cluster
pytestmark = pytest.mark.timeout(240)

SPEC = {"bundle": "cls@2.0.0", "selector": "line=3", "waves": "1,50%,100%", "soak_s": 1}
DEVICES = [f"gw-{i}" for i in range(1, 7)]
TAKEOVER_S = TIMINGS.lease_s + TIMINGS.poll_s + 10.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KeyStore, Repository]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGEFLEET_KEY_PASSPHRASE", "test passphrase, made at test time")
        yield make_fleet(tmp_path_factory.mktemp("fleet"))


@pytest.fixture
def pg(pg_cluster: PgCluster) -> Iterator[Engine]:
    url = pg_cluster.create_database()
    engine = open_database(url)
    try:
        yield engine
    finally:
        engine.dispose()
        pg_cluster.drop_database(url)


class Believer:
    """A leadership in the gap before it notices its session is gone: its lease still
    looks fresh, so :meth:`check` gives its (stale) epoch; after ``checks`` calls it
    finds out."""

    def __init__(self, replica_id: str, epoch: int, checks: int = 1_000) -> None:
        self.replica_id = replica_id
        self.epoch = epoch
        self.checks = checks

    def is_leader(self) -> bool:
        return self.checks > 0

    def check(self) -> int:
        if self.checks <= 0:
            raise NotLeader(self.replica_id, "lease expired 0.0 s ago")
        self.checks -= 1
        return self.epoch


def service_with(
    pg: Engine, fleet: tuple[KeyStore, Repository], leader: Believer
) -> tuple[RolloutService, list[tuple[str, bytes]]]:
    sent: list[tuple[str, bytes]] = []
    service = RolloutService(
        pg, repo=fleet[1], keystore=fleet[0], leader=leader,
        publish=lambda topic, payload, *_: sent.append((topic, payload)),
    )  # fmt: skip
    return service, sent


def test_a_save_by_a_replica_whose_term_ended_is_refused_and_nothing_is_published(
    pg: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    devices = Devices(pg)
    for d in DEVICES[:2]:
        devices.add(d)
    old = PgLeader(pg, "old", TIMINGS)
    old.start()
    new = PgLeader(pg, "new", TIMINGS)
    try:
        wait_for("the old leader", old.is_leader, TAKEOVER_S)
        epoch = old.check()
        service, sent = service_with(pg, fleet, Believer("old", epoch))
        rid = service.create({**SPEC, "waves": "1,100%"})
        before = store.load_rollout(pg, rid)
        assert before is not None

        terminate_backend(pg, old.backend_pid)
        new.start()
        wait_for("the new term", lambda: new.terms == 1, TAKEOVER_S)
        term = load_leader(pg)
        assert term is not None
        assert (term.holder, term.epoch) == ("new", epoch + 1)

        assert service.tick() == 0
        assert sent == []
        assert service.stats.fenced == 1
        after = store.load_rollout(pg, rid)
        assert after is not None
        assert (after.revision, after.state) == (before.revision, "planned")
        assert {r.status for r in store.list_rollout_devices(pg, rid)} == {"pending"}
    finally:
        old.stop()
        new.stop()


def test_a_leader_whose_lease_runs_out_after_its_save_publishes_no_directive(
    pg: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    devices = Devices(pg)
    for d in DEVICES[:2]:
        devices.add(d)
    # Two checks: the term's first look (nothing outstanding yet) and the save's.
    service, sent = service_with(pg, fleet, Believer("r", 1, checks=2))
    rid = service.create({**SPEC, "waves": "1,100%"})
    service.tick()
    assert sent == []
    assert service.stats.fenced == 1
    assert phase_key(pg, rid)[0] == "assigning"  # saved under its epoch, then stopped
    saved = store.load_rollout(pg, rid)
    assert saved is not None
    (canary,) = [d for d, s in from_dict(saved.controller_state).devices.items()
                 if s.status.value == "assigned"]  # fmt: skip

    # The next term sends the saved, never published directive, once.
    assert raise_epoch(pg, ROLLOUTS_ROLE, "r", time.time()) == 1  # the term that saved
    term = raise_epoch(pg, ROLLOUTS_ROLE, "r2", time.time())
    nxt, resent = service_with(pg, fleet, Believer("r2", term))
    nxt.tick()
    assert [t for t, _ in resent][:1] == [topics.directive(canary)]
    assert directive_release(resent[0][1]) == 2
    assert nxt.stats.resent == 1
    nxt.tick()
    assert [t for t, _ in resent].count(topics.directive(canary)) == 1  # once per term


def test_a_leader_cut_off_from_postgresql_stops_leading_within_its_lease(pg: Engine) -> None:
    leader = PgLeader(pg, "cut", TIMINGS)
    leader.start()
    try:
        wait_for("the lead", leader.is_leader, TAKEOVER_S)
        terminate_backend(pg, leader.backend_pid)
        wait_for("the lead to go", lambda: not leader.is_leader(), TIMINGS.lease_s + 5.0)
        with pytest.raises(NotLeader, match="not the leader"):
            leader.check()
    finally:
        leader.stop()


def phase_key(db: Engine, rollout_id: str) -> tuple[str, int]:
    """The rollout's phase and wave, as stored."""
    record = store.load_rollout(db, rollout_id)
    assert record is not None
    return record.state, from_dict(record.controller_state).wave


def test_three_replicas_complete_a_rollout_when_the_leader_is_cut_off_in_every_phase(
    pg: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    devices = Devices(pg)
    for d in DEVICES:
        devices.add(d)
    journal = Journal()
    replicas = [Replica(name, pg, fleet, journal) for name in ("r1", "r2", "r3")]
    operator = RolloutService(
        pg, repo=fleet[1], keystore=fleet[0], publish=lambda *_: None
    )  # unfenced, as the API's operator actions are
    rid = operator.create(SPEC)
    kills: list[tuple[float, str, tuple[str, int]]] = []
    answered = 0
    for r in replicas:
        r.start()
    try:
        deadline = time.monotonic() + 150.0
        while True:
            with journal.lock:
                fresh = journal.sent[answered:]
            answered += len(fresh)
            for s in fresh:
                devices.install(s.topic, s.payload)
            key = phase_key(pg, rid)
            if Phase(key[0]) in TERMINAL:
                break
            holders = [r for r in replicas if r.leader.detail()["holds_lock"]]
            if key not in [k for _, _, k in kills] and holders:
                # A leader cut off a moment ago may not have noticed yet while the next
                # already holds the lock: the newest epoch is the one that leads.
                holder = max(holders, key=lambda r: r.leader.detail()["epoch"] or 0)
                at = time.monotonic()
                if try_terminate_backend(pg, holder.leader.backend_pid):
                    kills.append((at, holder.name, key))
            assert time.monotonic() < deadline, f"stuck in {key} after kills {kills}"
            time.sleep(0.02)
    finally:
        for r in replicas:
            r.stop()

    record = store.load_rollout(pg, rid)
    assert record is not None
    assert record.state == "completed"
    phases = {k[0] for _, _, k in kills}
    assert {"planned", "assigning", "soaking"} <= phases, kills
    assert {r.device_id: r.status for r in store.list_rollout_devices(pg, rid)} == dict.fromkeys(
        DEVICES, "done"
    )
    sent = journal.sent
    # each device was told one thing: release 2 (once, by whichever replica led)
    told: dict[str, set[int]] = {}
    for s in sent:
        told.setdefault(s.topic, set()).add(directive_release(s.payload))
    assert sorted(told) == sorted(topics.directive(d) for d in DEVICES)
    assert all(releases == {2} for releases in told.values()), told
    # the old leader stops publishing before the next one starts acting (until it
    # leads again itself, later)
    for at, name, key in kills:
        others = [t for t, who in journal.acts if t > at and who != name]
        if not others:
            continue
        next_act = min(others)
        again = min((t for t, who in journal.acts if t > at and who == name), default=1e18)
        late = [s for s in sent if s.replica == name and next_act <= s.at < again]
        assert late == [], f"{name} published after the next leader started ({key})"
    epochs = load_leader(pg)
    assert epochs is not None
    assert epochs.epoch >= len(kills) + 1
