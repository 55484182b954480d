"""The leader election on a real PostgreSQL: of several electors exactly one leads; when
its lock connection dies (terminated by PostgreSQL, or its process SIGKILLed) another
takes over within a lease plus a poll, under a higher epoch. On SQLite a second
``fleet-server serve`` on the same database is refused at start with a clear error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from fleet_server.cluster import ClusterError, open_cluster
from fleet_server.cluster.leader import PgLeader
from fleet_server.config import parse_config
from fleet_server.db import open_database, sqlite_url
from fleet_server.db.cluster import load_leader
from tests.fleet_server.cluster.cluster_support import TIMINGS, terminate_backend, wait_for
from tests.support.pg import PgCluster

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # pg_cluster

REPO_ROOT = Path(__file__).resolve().parents[3]
TAKEOVER_S = TIMINGS.lease_s + TIMINGS.poll_s + 10.0  # lease + poll, and slack for CI
ELECTOR = """
import sys, time
from fleet_server.cluster.leader import LeaderTimings, PgLeader
from fleet_server.db import make_engine
engine = make_engine(sys.argv[1])
leader = PgLeader(engine, sys.argv[2], LeaderTimings(1.0, 0.2, 0.2))
leader.start()
while not leader.is_leader():
    time.sleep(0.01)
print("LEADING", leader.check(), flush=True)
time.sleep(600)
"""


@pytest.fixture
def pg(pg_cluster: PgCluster) -> Iterator[Engine]:
    url = pg_cluster.create_database()
    engine = open_database(url)
    try:
        yield engine
    finally:
        engine.dispose()
        pg_cluster.drop_database(url)


def electors(db: Engine, *names: str) -> list[PgLeader]:
    out = [PgLeader(db, name, TIMINGS) for name in names]
    for e in out:
        e.start()
    return out


def test_of_three_electors_exactly_one_leads_and_another_takes_over_when_its_session_dies(
    pg: Engine,
) -> None:
    group = electors(pg, "r1", "r2", "r3")
    try:
        wait_for("a leader", lambda: any(e.is_leader() for e in group), TAKEOVER_S)
        time.sleep(3 * TIMINGS.renew_s)  # a few renewals and polls later, still one
        (first,) = [e for e in group if e.is_leader()]
        epoch = first.check()
        term = load_leader(pg)
        assert term is not None
        assert (term.holder, term.epoch) == (first.replica_id, epoch)

        terminate_backend(pg, first.backend_pid)
        wait_for("the old leader to step down", lambda: not first.is_leader(), TAKEOVER_S)
        others = [e for e in group if e is not first]
        wait_for("a new leader", lambda: any(e.is_leader() for e in others), TAKEOVER_S)
        leaders = [e for e in group if e.is_leader()]
        assert len(leaders) == 1
        assert leaders[0] is not first
        assert leaders[0].check() > epoch
        assert first.losses == 1
        assert "AdminShutdown" in first.last_error
        detail = leaders[0].detail()
        assert detail["leader"]
        assert detail["holds_lock"]
        assert detail["elector_alive"]
    finally:
        for e in group:
            e.stop()


def test_a_leader_that_stops_gives_the_lock_up_and_a_follower_takes_it(pg: Engine) -> None:
    a, b = electors(pg, "a", "b")
    try:
        wait_for("a leader", lambda: a.is_leader() or b.is_leader(), TAKEOVER_S)
        first, second = (a, b) if a.is_leader() else (b, a)
        first.stop()
        assert not first.is_leader()
        wait_for("the follower to lead", second.is_leader, TAKEOVER_S)
        assert second.terms == 1
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_leader_process_killed_or_frozen_is_replaced_under_a_higher_epoch(
    pg: Engine, tmp_path: Path, sig: signal.Signals
) -> None:
    url = pg.url.render_as_string(hide_password=False)
    out = tmp_path / "elector.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", ELECTOR, url, "child"],
            cwd=REPO_ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    follower: PgLeader | None = None
    try:
        wait_for("the child to lead", lambda: b"LEADING" in out.read_bytes(), TAKEOVER_S + 20)
        child_epoch = int(out.read_bytes().split(b"LEADING")[1].split()[0])
        (follower,) = electors(pg, "follower")
        time.sleep(3 * TIMINGS.poll_s)
        assert not follower.is_leader()  # the child holds the lock
        signalled = time.monotonic()
        os.kill(proc.pid, sig)
        # killed: PostgreSQL sees the socket close; frozen: the session goes silent and
        # idle_session_timeout (a lease) ends it
        wait_for("the follower to take over", follower.is_leader, TAKEOVER_S + TIMINGS.lease_s)
        took_s = time.monotonic() - signalled
        print(f"failover after {sig.name}: {took_s:.2f} s")  # a figure, not an assertion
        assert follower.check() == child_epoch + 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if follower is not None:
            follower.stop()


def test_a_second_fleet_server_on_the_same_sqlite_database_is_refused_at_start(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    config_file = tmp_path / "fleet.toml"
    config_file.write_text(f'[server]\nstate_dir = "{state}"\n')
    cfg = parse_config({"server": {"state_dir": str(state)}})
    engine = open_database(sqlite_url(state / "fleet.db"))
    first = open_cluster(cfg, engine)
    first.start()
    try:
        assert first.leadership.is_leader()
        assert first.leadership.check() == 1
        with pytest.raises(ClusterError, match="already serves this SQLite database"):
            open_cluster(cfg, engine).start()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "fleet_server.cli.server",
                "serve",
                "--config",
                str(config_file),
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert "another fleet-server already serves this SQLite database" in done.stderr
        assert "several replicas need PostgreSQL" in done.stderr
        assert str(state / "fleet.db") in done.stderr
    finally:
        first.stop()
    again = open_cluster(cfg, engine)  # the lock went with the first one
    again.start()
    again.stop()
    engine.dispose()
