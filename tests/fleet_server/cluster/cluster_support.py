"""Helpers of the cluster tests: replicas of the rollout reconciler in threads, each with
its own elector connection and a recording publisher, on one PostgreSQL database; devices
that answer directives through the ingest sink; a signed repository with two releases."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from tuf.api.metadata import Metadata, Targets

from agent.wire import topics
from agent.wire.messages import BundleRef, ReportedState, install_state_event
from fleet_server.cluster.leader import LeaderTimings, PgLeader
from fleet_server.db import store
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.repository import KeyStore, Repository, manifest_target
from fleet_server.rollout.service import RolloutService
from tests.agent.installer.installer_helpers import PROFILE, make_bundle

TIMINGS = LeaderTimings(lease_s=1.0, renew_s=0.2, poll_s=0.2)
TICK_S = 0.1
VERSIONS = {1: "1.0.0", 2: "2.0.0"}
WAIT_S = 30.0


def make_fleet(root: Path) -> tuple[KeyStore, Repository]:
    """A keystore and a repository with bundle ``cls`` releases 1 and 2 (the caller sets
    ``EDGEFLEET_KEY_PASSPHRASE``)."""
    keys = KeyStore.create(root / "keys", root_keys=1, root_threshold=1)
    repo = Repository(root / "repo")
    repo.init(keys)
    for release, version in VERSIONS.items():
        bundle = make_bundle(root, name="cls", version=version, release=release, budget_ms=50)
        repo.publish(bundle.path, keys)
    return keys, repo


def wait_for(what: str, predicate: object, timeout_s: float = WAIT_S) -> None:
    """Poll ``predicate`` (a callable) until true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def terminate_backend(engine: Engine, pid: int | None) -> None:
    """Cut a session from PostgreSQL (what a network partition or a dead host does)."""
    assert try_terminate_backend(engine, pid)


def try_terminate_backend(engine: Engine, pid: int | None) -> bool:
    """Cut a session if it is still there; whether it was (on a loaded machine a leader's
    session may already have ended by its own idle_session_timeout)."""
    assert pid is not None
    with engine.connect() as conn:
        done = bool(conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar())
        conn.commit()
    return done


def directive_release(payload: bytes) -> int:
    """The release a signed directive names."""
    (path,) = Metadata[Targets].from_bytes(payload).signed.targets
    (release,) = [r for r in VERSIONS if manifest_target("cls", r) == path]
    return release


@dataclass
class Sent:
    """One publish, as a replica's publisher saw it."""

    at: float
    replica: str
    topic: str
    payload: bytes


@dataclass
class Journal:
    """Every replica's publishes and first acts as leader (monotonic times)."""

    sent: list[Sent] = field(default_factory=list)
    acts: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Replica:
    """A rollout reconciler with its elector; the loop is jobs.RolloutRunner's."""

    def __init__(
        self, name: str, db: Engine, fleet: tuple[KeyStore, Repository], journal: Journal
    ) -> None:
        self.name = name
        self.journal = journal
        self.leader = PgLeader(db, name, TIMINGS)
        keys, repo = fleet
        self.service = RolloutService(
            db, repo=repo, keystore=keys, publish=self.publish, leader=self.leader
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"replica-{name}", daemon=True)

    def publish(self, topic: str, payload: bytes, retain: bool, expiry: int | None) -> None:
        with self.journal.lock:
            self.journal.sent.append(Sent(time.monotonic(), self.name, topic, payload))

    def _loop(self) -> None:
        leading = False
        while not self._stop.is_set():
            if self.leader.is_leader():
                if not leading:
                    with self.journal.lock:
                        self.journal.acts.append((time.monotonic(), self.name))
                leading = True
                self.service.tick()
            else:
                leading = False
            self._stop.wait(TICK_S)

    def start(self) -> None:
        self.leader.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.leader.stop()


class Devices:
    """Devices that report through the ingest sink, as the agents would."""

    def __init__(self, db: Engine) -> None:
        self.db = db
        self.sink = SqlSink(db)

    def add(self, device_id: str, line: str = "3") -> None:
        store.upsert_device(self.db, device_id, labels={"line": line}, profile=PROFILE)
        self.state(device_id, 1)

    def state(self, device_id: str, release: int) -> None:
        ref = BundleRef(name="cls", version=VERSIONS[release], release=release)
        prev = BundleRef(name="cls", version=VERSIONS[1], release=1) if release > 1 else None
        state = ReportedState(
            device_id=device_id, ts=time.time(), profile=PROFILE, active=ref, previous=prev
        )
        self.sink.store_state(device_id, state)

    def install(self, topic: str, payload: bytes) -> None:
        """What the agent reports after applying a directive: committed."""
        device_id = topics.device_of(topic)
        release = directive_release(payload)
        report = {"at": time.time(), "source": "mqtt", "outcome": "committed", "step": "commit",
                  "reason": "", "bundle": "cls", "release": release,
                  "version": VERSIONS[release]}  # fmt: skip
        self.sink.store_events([install_state_event(device_id, report)])
        self.state(device_id, release)
