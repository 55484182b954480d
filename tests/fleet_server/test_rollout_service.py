"""The rollout service (the controller's I/O shell) over a real SQLite database, a real
signed repository and keystore: rollouts go wave by wave as devices report through the
ingest sink, stop and revert on a failed install, obey the operator, leave offline devices
pending; directives are signed, retained and expire; one run on PostgreSQL, one through a
real Mosquitto."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from sqlalchemy.engine import Engine
from tuf.api.metadata import Metadata, Targets

from agent.wire import topics
from agent.wire.messages import (
    BundleRef,
    Health,
    Heartbeat,
    Percentiles,
    ReportedState,
    install_state_event,
)
from fleet_server.db import open_database, sqlite_url, store
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.repository import DIRECTOR, KeyStore, Repository, manifest_target
from fleet_server.rollout import RolloutError
from fleet_server.rollout.service import RolloutNotFound, RolloutService
from tests.agent.installer.installer_helpers import PROFILE, make_bundle
from tests.support.broker import Broker
from tests.support.pg import PgCluster

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # pg_cluster

WEEK_S = 7 * 86_400
VERSIONS = {1: "1.0.0", 2: "2.0.0"}
Sent = list[tuple[str, bytes, bool, int | None]]


class Clock:
    """Time for the service, moved by the test."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float = 1.0) -> float:
        self.t += seconds
        return self.t


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


class Setup:
    """A service with its publishes captured, and devices that report through ingest."""

    def __init__(self, db: Engine, fleet: tuple[KeyStore, Repository], **kw: Any) -> None:
        self.db = db
        self.keys, self.repo = fleet
        self.clock = Clock()
        self.sent: Sent = []
        self.sink = SqlSink(db)
        self.service = self.make_service(**kw)

    def make_service(self, **kw: Any) -> RolloutService:
        def publish(topic: str, payload: bytes, retain: bool, expiry: int | None) -> None:
            self.sent.append((topic, payload, retain, expiry))

        kw.setdefault("publish", publish)
        kw.setdefault("clock", self.clock)
        return RolloutService(self.db, repo=self.repo, keystore=self.keys, **kw)

    def device(self, device_id: str, *, line: str = "3", release: int | None = 1) -> None:
        store.upsert_device(self.db, device_id, labels={"line": line}, profile=PROFILE)
        active = None if release is None else self.ref(release)
        self.report_state(device_id, active, None)

    def ref(self, release: int) -> BundleRef:
        return BundleRef(name="cls", version=VERSIONS[release], release=release)

    def report_state(
        self, device_id: str, active: BundleRef | None, previous: BundleRef | None
    ) -> None:
        state = ReportedState(
            device_id=device_id,
            ts=self.clock.advance(0.01),
            profile=PROFILE,
            active=active,
            previous=previous,
        )
        self.sink.store_state(device_id, state)

    def install(self, device_id: str, release: int, outcome: str = "committed") -> None:
        """What ingest stores when the agent applied a directive: its install report
        (retained on install/state) and its new reported state."""
        at = self.clock.advance(0.01)
        step = "commit" if outcome == "committed" else "benchmark"
        report = {"at": at, "source": "mqtt", "outcome": outcome, "step": step, "reason": "",
                  "bundle": "cls", "release": release, "version": VERSIONS[release]}  # fmt: skip
        self.sink.store_events([install_state_event(device_id, report)])
        if outcome == "committed":
            self.report_state(device_id, self.ref(release), self.ref(1) if release > 1 else None)

    def tick(self) -> list[str]:
        """One loop pass a second later; the devices a directive was published for."""
        before = len(self.sent)
        self.clock.advance(1.0)
        self.service.tick()
        return [topics.device_of(t) for t, *_ in self.sent[before:]]

    def status(self, rollout_id: str) -> dict[str, str]:
        view = self.service.get(rollout_id)
        return {d["device_id"]: d["status"] for d in view["devices"]}


def verify_directive(repo: Repository, payload: bytes, device_id: str, release: int) -> None:
    """The directive is signed by the director key the repository's targets delegate to,
    and names exactly the release's manifest as the repository signed it."""
    directive = Metadata[Targets].from_bytes(payload)
    targets = repo.targets().signed
    targets.verify_delegate(DIRECTOR, directive.signed_bytes, directive.signatures)
    path = manifest_target("cls", release)
    assert list(directive.signed.targets) == [path]
    signed, published = directive.signed.targets[path], targets.targets[path]
    assert (signed.length, signed.hashes) == (published.length, published.hashes)
    custom = directive.signed.unrecognized_fields["custom"]
    assert custom == {"device_id": device_id, "hardware_class": PROFILE}


SPEC = {"bundle": "cls@2.0.0", "selector": "line=3", "waves": "1,50%,100%", "soak_s": 0}


def test_a_rollout_goes_wave_by_wave_as_devices_report_and_completes(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    devices = ["gw-1", "gw-2", "gw-3", "gw-4"]
    for d in devices:
        s.device(d)
    s.device("gw-other", line="4")  # not selected
    rid = s.service.create(SPEC)
    view = s.service.get(rid)
    assert (view["phase"], view["release"], view["wave_targets"]) == ("planned", 2, [1, 2, 4])
    assert view["counts"] == {"pending": 4}
    assert s.sent == []

    first = s.tick()
    assert len(first) == 1
    topic, payload, retain, expiry = s.sent[0]
    assert (topic, retain, expiry) == (topics.directive(first[0]), True, WEEK_S)
    verify_directive(s.repo, payload, first[0], 2)
    view = s.service.get(rid)
    assert (view["phase"], view["wave"]) == ("assigning", 1)
    assert s.status(rid)[first[0]] == "assigned"
    assert s.tick() == []  # nothing reported: nothing new

    s.install(first[0], 2)
    second = s.tick()
    assert len(second) == 1
    assert second[0] not in first
    assert s.status(rid)[first[0]] == "done"
    assert s.service.get(rid)["wave"] == 2

    s.install(second[0], 2)
    third = s.tick()
    assert sorted(first + second + third) == devices
    for d in third:
        s.install(d, 2)
    s.tick()
    view = s.service.get(rid)
    assert view["phase"] == "completed", view["reason"]
    assert view["counts"] == {"done": 4}
    assert [w["devices"] for w in view["wave_metrics"]] == [1, 2, 4]
    assert {r.device_id: r.status for r in store.list_rollout_devices(db, rid)} == dict.fromkeys(
        devices, "done"
    )
    waves = {r.device_id: r.wave for r in store.list_rollout_devices(db, rid)}
    assert sorted(waves.values()) == [1, 2, 3, 3]
    notes = store.list_events(db, rid, kind="rollout")
    assert "every selected device runs the target" in [n.payload["message"] for n in notes]
    assert s.service.list()[0]["phase"] == "completed"
    assert s.service.stats.directives == 4
    assert s.tick() == []  # a completed rollout is left alone


def test_a_failed_install_in_wave_two_fails_the_gate_and_reverts_the_devices_done(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    for d in ("gw-1", "gw-2", "gw-3", "gw-4"):
        s.device(d)
    rid = s.service.create(SPEC)
    (canary,) = s.tick()
    s.install(canary, 2)
    (second,) = s.tick()
    s.install(second, 2, outcome="failed")
    reverted = s.tick()

    view = s.service.get(rid)
    assert view["phase"] == "rolling_back"
    assert "gate failed in wave 2: 1 install failures > 0 allowed" in view["reason"]
    assert view["failed_devices"] == [second]
    assert sorted(reverted) == sorted([canary, second])
    for topic, payload, retain, expiry in s.sent[-2:]:
        assert (retain, expiry) == (True, WEEK_S)
        verify_directive(s.repo, payload, topics.device_of(topic), 1)  # the previous release
    kinds = [n.payload["kind"] for n in store.list_events(db, rid, kind="rollout")]
    assert "gate_failed" in kinds

    s.tick()
    assert s.status(rid)[second] == "rolled-back"  # it never left release 1
    assert s.status(rid)[canary] == "reverting"
    assert s.service.get(rid)["phase"] == "rolling_back"
    s.install(canary, 1)  # the agent rolled back to its other slot
    s.tick()
    assert s.status(rid)[canary] == "rolled-back"
    assert s.service.get(rid)["phase"] == "rolled_back"


def test_without_rollback_by_policy_a_failed_gate_pauses_and_resume_accepts_the_device(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    for d in ("gw-1", "gw-2", "gw-3", "gw-4"):
        s.device(d)
    spec = {**SPEC, "policy": {"rollback_done_waves_on_failure": False}}
    rid = s.service.create(spec)
    (canary,) = s.tick()
    s.install(canary, 2)
    (second,) = s.tick()
    s.install(second, 2, outcome="failed")
    assert s.tick() == []  # no revert
    view = s.service.get(rid)
    assert view["phase"] == "paused"
    assert view["gate"]["install_failures"] == 1
    assert s.status(rid)[second] == "failed"

    before = len(s.sent)
    view = s.service.act(rid, "resume")
    # the failure is accepted and gives its place in wave 2 to the next device
    assert (view["phase"], view["wave"]) == ("assigning", 2)
    assert s.status(rid)[second] == "failed"
    (replacement,) = [sent[0].split("/")[2] for sent in s.sent[before:]]
    assert replacement not in (canary, second)
    assert s.status(rid)[replacement] == "assigned"


def test_p99_over_the_bundles_budget_after_the_switch_fails_the_gate(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    for d in ("gw-1", "gw-2"):
        s.device(d)
    rid = s.service.create({**SPEC, "waves": "1,100%"})
    assert s.service.get(rid)["wave_targets"] == [1, 2]

    def health(device_id: str, p99: float) -> None:
        latency = {"cls": Percentiles(p50=1.0, p95=2.0, p99=p99)}
        ts = s.clock.advance(0.01)
        s.sink.store_health([Health(device_id=device_id, seq=0, ts=ts, latency_ms=latency)])

    (canary,) = s.tick()
    health(canary, 500.0)  # still under release 1: a baseline, not the new bundle's figure
    s.install(canary, 2)
    (second,) = s.tick()  # the canary passed; wave 2 starts
    assert second != canary
    view = s.service.get(rid)
    assert (view["phase"], view["wave"]) == ("assigning", 2)
    assert view["gate"]["devices_over_budget"] == 0
    health(canary, 80.0)  # release 2 over its 50 ms budget
    s.tick()
    view = s.service.get(rid)
    assert view["phase"] == "rolling_back"
    assert "1 devices with p99 over 50 ms" in view["reason"]
    (entry,) = [d for d in view["devices"] if d["device_id"] == canary]
    assert entry["p99_ms"] == 80.0


def test_operator_actions_pause_resume_approve_cancel_and_refusals(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    for d in ("gw-1", "gw-2", "gw-3"):
        s.device(d)
    s.device("gw-new", release=None)  # runs nothing yet
    spec = {**SPEC, "policy": {"approval_between_waves": True}}
    rid = s.service.create(spec)
    with pytest.raises(RolloutError, match="cannot approve a rollout that is planned"):
        s.service.act(rid, "approve")
    with pytest.raises(RolloutError, match="'reboot' is not one of"):
        s.service.act(rid, "reboot")
    with pytest.raises(RolloutNotFound, match="no rollout 'nope'"):
        s.service.act("nope", "pause")

    assert s.service.act(rid, "pause", "line stop")["phase"] == "paused"
    assert s.tick() == []  # paused: nothing assigned
    before = len(s.sent)
    assert s.service.act(rid, "resume")["phase"] == "assigning"
    (canary,) = [topics.device_of(t) for t, *_ in s.sent[before:]]
    s.install(canary, 2)
    assert s.tick() == []
    assert s.service.get(rid)["phase"] == "awaiting_approval"

    before = len(s.sent)
    view = s.service.act(rid, "approve", by="ops")
    assert view["phase"] == "assigning"
    assert len(s.sent) == before + 1  # the approval's directive goes out at once
    assert view["wave"] == 2
    assert view["history"][-1]["reason"].endswith("approved by ops")

    view = s.service.act(rid, "cancel", "wrong bundle")
    assert (view["phase"], view["reason"]) == ("cancelled", "cancelled: wrong bundle")
    with pytest.raises(RolloutError, match="cannot pause a rollout that is cancelled"):
        s.service.act(rid, "pause")

    assigned = [d["device_id"] for d in view["devices"] if d["wave"] is not None]
    before = len(s.sent)
    view = s.service.act(rid, "rollback", "operator")
    assert view["phase"] == "rolling_back"
    reverts = {topics.device_of(t): (p, r) for t, p, r, _ in s.sent[before:]}
    # it ran nothing before: nothing to send it back to; it is stuck, saying so
    assert sorted(reverts) == sorted(d for d in assigned if d != "gw-new")
    if "gw-new" in assigned:
        (new,) = [d for d in view["devices"] if d["device_id"] == "gw-new"]
        assert new["status"] == "stuck"
        assert new["why"].startswith("no bundle to return to")
        assert {"device_id": "gw-new", "why": new["why"]} in view["stuck"]


def test_offline_devices_stay_pending_and_are_assigned_when_they_return(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    for d in ("gw-1", "gw-2", "gw-3", "gw-4"):
        s.device(d)
    s.sink.store_state("gw-4", ReportedState.offline("gw-4"))  # its last will
    rid = s.service.create(SPEC)
    assert s.status(rid)["gw-4"] == "offline"
    sent: list[str] = []
    for _ in range(6):
        new = s.tick()
        sent += new
        for d in new:
            s.install(d, 2)
    assert sorted(sent) == ["gw-1", "gw-2", "gw-3"]
    view = s.service.get(rid)
    assert view["phase"] == "finishing"
    assert s.status(rid)["gw-4"] == "offline"  # pending, never failed

    s.sink.store_heartbeats([Heartbeat(device_id="gw-4", seq=0, ts=s.clock.advance(0.01))])
    assert s.tick() == ["gw-4"]
    s.install("gw-4", 2)
    s.tick()
    assert s.service.get(rid)["phase"] == "completed"


def test_a_device_already_on_the_target_counts_as_done_without_a_directive(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    s.device("gw-1", release=2)
    s.device("gw-2")
    rid = s.service.create(SPEC)
    assert s.status(rid) == {"gw-1": "done", "gw-2": "pending"}
    assert s.tick() == ["gw-2"]
    s.report_state("gw-2", s.ref(2), s.ref(1))  # side-loaded; no install report
    s.tick()
    assert s.service.get(rid)["phase"] == "completed"


def test_a_rollout_of_an_unpublished_version_or_matching_no_device_is_refused(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    s.device("gw-1")
    with pytest.raises(RolloutError, match=r"cls@3\.0\.0 is not published \(versions: 1\.0\.0"):
        s.service.create({**SPEC, "bundle": "cls@3.0.0"})
    with pytest.raises(RolloutError, match="matches no device"):
        s.service.create({**SPEC, "selector": "line=9"})
    with pytest.raises(RolloutError, match="waves"):
        s.service.create({**SPEC, "waves": "50%,10%"})
    assert s.service.list() == []


def test_a_save_refused_because_another_process_saved_first_is_retried_on_the_new_state(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    s.device("gw-1")
    rid = s.service.create(SPEC)
    other = s.make_service()
    interfered: list[dict[str, Any]] = []

    def clock() -> float:  # called between load and save: the other process acts then
        if not interfered:
            interfered.append(other.act(rid, "pause", "from elsewhere"))
        return s.clock()

    racing = s.make_service(clock=clock)
    view = racing.act(rid, "cancel")
    assert racing.stats.conflicts == 1
    assert view["phase"] == "cancelled"
    assert [h["phase"] for h in view["history"]] == ["planned", "paused", "cancelled"]
    assert view["revision"] == 3


def test_a_directive_that_cannot_be_published_is_logged_counted_and_noted(
    db: Engine, fleet: tuple[KeyStore, Repository]
) -> None:
    s = Setup(db, fleet)
    s.device("gw-1")

    def broken(topic: str, payload: bytes, retain: bool, expiry: int | None) -> None:
        raise OSError("broker connection lost")

    service = s.make_service(publish=broken)
    rid = service.create(SPEC)
    s.clock.advance()
    assert service.tick() == 1
    assert service.stats.command_errors == 1
    assert s.status(rid) == {"gw-1": "assigned"}  # the assigning timeout will pause it
    notes = [n.payload for n in store.list_events(db, rid, kind="rollout")]
    assert any(
        n["kind"] == "command_failed" and "broker connection lost" in n["message"] for n in notes
    )


def test_a_rollout_runs_on_postgresql(
    pg_cluster: PgCluster, fleet: tuple[KeyStore, Repository]
) -> None:
    url = pg_cluster.create_database()
    engine = open_database(url)
    try:
        s = Setup(engine, fleet)
        s.device("gw-1")
        s.device("gw-2")
        rid = s.service.create(SPEC)
        (canary,) = s.tick()
        s.install(canary, 2)
        (last,) = s.tick()
        s.install(last, 2)
        s.tick()
        assert s.service.get(rid)["phase"] == "completed"
        assert s.service.act(rid, "rollback")["phase"] == "rolling_back"
    finally:
        engine.dispose()
        pg_cluster.drop_database(url)


# -- a real broker ----------------------------------------------------------------


class MqttPublish:
    """The publish callable over a paho client: QoS 1, retained, with message expiry."""

    def __init__(self, broker: Broker) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"rollouts-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()

    def __call__(self, topic: str, payload: bytes, retain: bool, expiry: int | None) -> None:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        if expiry is not None:
            props.MessageExpiryInterval = expiry
        info = self.client.publish(topic, payload, qos=1, retain=retain, properties=props)
        info.wait_for_publish(10)
        if not info.is_published():
            raise OSError(f"{topic}: not acknowledged")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _retained(broker: Broker, device_ids: list[str], wait_s: float) -> dict[str, Any]:
    """What a new subscriber gets on the devices' directive topics within ``wait_s``."""
    got: dict[str, Any] = {}
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=f"sub-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5
    )

    def on_message(_c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        expiry = getattr(msg.properties, "MessageExpiryInterval", None)
        got[topics.device_of(msg.topic)] = (bytes(msg.payload), msg.retain, expiry)

    client.on_message = on_message
    client.connect(broker.host, broker.port)
    client.subscribe([(topics.directive(d), 1) for d in device_ids])
    client.loop_start()
    time.sleep(wait_s)
    client.disconnect()
    client.loop_stop()
    return got


def test_directives_are_retained_on_a_real_broker_with_their_expiry(
    db: Engine, fleet: tuple[KeyStore, Repository], mosquitto: Broker
) -> None:
    publish = MqttPublish(mosquitto)
    prefix = f"m{uuid.uuid4().hex[:6]}"
    ids = [f"{prefix}-{i}" for i in range(3)]
    try:
        s = Setup(db, fleet, publish=publish)
        for d in ids[:2]:
            s.device(d)
        s.device(ids[2], release=None)
        rid = s.service.create({**SPEC, "waves": "1,100%"})
        stop = threading.Event()
        loop = threading.Thread(target=s.service.run, args=(stop, 0.05), daemon=True)
        loop.start()
        try:
            deadline = time.monotonic() + 10
            while s.service.stats.directives < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            stop.set()
            loop.join(5)
        assert not loop.is_alive()
        assert s.service.stats.tick_errors == 0

        got = _retained(mosquitto, ids, 0.5)
        (canary,) = got
        payload, retained, expiry = got[canary]
        assert retained is True
        assert 0 < expiry <= WEEK_S
        verify_directive(s.repo, payload, canary, 2)

        s.install(canary, 2)
        s.tick()
        s.tick()
        assert len(_retained(mosquitto, ids, 0.5)) == 3
        view = s.service.act(rid, "rollback")
        assert view["phase"] == "rolling_back"
        after = _retained(mosquitto, ids, 0.5)
        # it ran nothing before: nothing to send it back to; it keeps its directive and
        # is stuck, saying why, until an operator resolves it
        verify_directive(s.repo, after[ids[2]][0], ids[2], 2)
        assert [x["device_id"] for x in view["stuck"]] == [ids[2]]
        for d in ids[:2]:
            verify_directive(s.repo, after[d][0], d, 1)
    finally:
        publish.close()
