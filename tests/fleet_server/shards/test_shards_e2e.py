"""Two broker shards, two fleet-server replicas on one PostgreSQL, and the
``fleet-server brokers`` process running both shards' Mosquittos (``[broker] run =
false`` on the replicas). Devices enrol through either replica and land on both shards
(by site label, else by hash); each is told its shard's host and port, gets its
directive through its own shard, has every heartbeat stored exactly once by the two
replicas' ingest, and has each bundle-chunk request answered once by the two replicas'
file servers. A revocation through a replica reaches the brokers it does not run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
import sqlalchemy as sa

from agent.wire import topics
from agent.wire.codec import encode
from agent.wire.fetch import FetchRequest, encode_request
from agent.wire.reports import Heartbeat
from fleet_server.broker.shards import assign_shard
from fleet_server.config import parse_config
from fleet_server.db.tables import heartbeats
from fleet_server.serve import FleetServer
from fleet_server.services import FileService, IngestService, make_publisher
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    http,
    make_repository,
)
from tests.fleet_server.shards.shard_support import enroll
from tests.support.broker import free_port
from tests.support.pg import PgCluster
from tests.support.tls_peers import Peer

pytest_plugins = ["tests.fleet_server.db_fixtures"]
pytestmark = pytest.mark.timeout(240)

WAIT_S = 30.0
BEATS = 4
SITES = {"eu": ["eu-1"]}


@dataclass
class Fleet:
    state: Path
    ports: dict[str, int]
    replicas: list[FleetServer]
    brokers: subprocess.Popen[bytes]
    log: Path


def toml_config(state: Path, repo: Path, keys: Path, db_url: str, ports: dict[str, int]) -> str:
    return f"""
[server]
state_dir = "{state}"
[http]
port = 0
operator_token_env = "{TOKEN_ENV}"
[database]
url = "{db_url}"
[repository]
path = "{repo}"
keystore = "{keys}"
[broker]
run = false
replica_slots = 2
[broker.mosquitto]
port = {ports["main"]}
persistence = false
[[broker.shards]]
name = "eu"
port = {ports["eu"]}
sites = {json.dumps(SITES["eu"])}
"""


def wait_line(out: IO[bytes], proc: subprocess.Popen[bytes], want: bytes, log: Path) -> None:
    """Wait (bounded) until the brokers process prints ``want``."""
    found = threading.Event()

    def read() -> None:
        for line in out:
            with log.open("ab") as f:
                f.write(line)
            if want in line:
                found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(WAIT_S):
        raise AssertionError(f"brokers not up in {WAIT_S} s (rc {proc.poll()}): {log.read_text()}")


@pytest.fixture
def fleet(
    tmp_path: Path, pg_cluster: PgCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Fleet]:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    repo, keys = make_repository(tmp_path / "repo")
    db_url = pg_cluster.create_database()
    state = tmp_path / "state"
    ports = {"main": free_port(), "eu": free_port()}
    config = tmp_path / "fleet.toml"
    config.write_text(toml_config(state, repo, keys, db_url, ports))
    log = tmp_path / "brokers.log"
    brokers = subprocess.Popen(
        [sys.executable, "-m", "fleet_server.cli.server", "brokers", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
    )
    replicas: list[FleetServer] = []
    try:
        assert brokers.stdout is not None
        wait_line(brokers.stdout, brokers, b"fleet-server: brokers", log)
        import tomllib

        data = tomllib.loads(config.read_text())
        for name in ("a", "b"):
            cfg = parse_config({**data, "cluster": {"replica_id": f"replica-{name}"}})
            server = FleetServer(cfg, services=[IngestService, FileService])
            server.start()
            replicas.append(server)
        yield Fleet(state, ports, replicas, brokers, log)
    finally:
        for server in reversed(replicas):
            server.stop()
        brokers.send_signal(signal.SIGTERM)
        try:
            assert brokers.wait(WAIT_S) == 0, log.read_text()
        finally:
            if brokers.poll() is None:
                brokers.kill()
                brokers.wait(WAIT_S)
            pg_cluster.drop_database(db_url)


@dataclass
class Device:
    device_id: str
    shard: str
    port: int
    peer: Peer


def wait_for(what: str, done: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {WAIT_S} s")
        time.sleep(0.1)


def ingest_figures(fleet: Fleet, shard: str) -> tuple[int, int]:
    """(received, duplicates) of both replicas' ingest workers on ``shard``."""
    received = duplicates = 0
    for server in fleet.replicas:
        for name, part in server.context.health.check().items():
            if name.startswith("ingest-") and (shard == "main") == (
                not name.startswith("ingest-eu")
            ):
                received += part.detail["received"]
                duplicates += part.detail["duplicates"]
    return received, duplicates


def test_devices_on_two_shards_get_their_directives_and_their_heartbeats_land_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    a, b = fleet.replicas
    assert (a.context.slot, b.context.slot) == (0, 1)  # distinct service identities
    # devices at site eu-1 go to shard eu; the others by hash: pick two that hash to main
    shards = [("eu", SITES["eu"])]
    hq = [d for d in (f"cam-hq-{n}" for n in range(40)) if assign_shard(d, {}, shards) == "main"]
    plan = {"cam-eu-1": "eu", "cam-eu-2": "eu", hq[0]: "main", hq[1]: "main"}
    devices: list[Device] = []
    try:
        for i, (device_id, shard) in enumerate(plan.items()):
            labels = {"site": "eu-1"} if shard == "eu" else {"site": "hq"}
            body = enroll(fleet.replicas[i % 2].url, device_id, labels, tmp_path)
            # the enrollment names the shard's host and port
            assert body["broker"] == {"host": "127.0.0.1", "port": fleet.ports[shard]}
            stored = http("GET", f"{a.url}/api/v1/devices/{device_id}", token=OPERATOR_TOKEN)
            assert stored.body["shard"] == shard
            peer = Peer(
                fleet.ports[shard],
                tmp_path / "ca.crt",
                tmp_path / f"{device_id}.crt",
                tmp_path / f"{device_id}.key",
            )
            assert peer.connect(), f"{device_id} refused by shard {shard}"
            devices.append(Device(device_id, shard, fleet.ports[shard], peer))
            assert not peer.subscribe(topics.directive(device_id))[0].is_failure

        # a directive per device, through the shard-routing publisher of replica a
        publisher = make_publisher(a.context)
        try:
            assert publisher.wait_connected(WAIT_S)
            for d in devices:
                publisher(topics.directive(d.device_id), d.device_id.encode(), False, 60)
            for d in devices:
                topic, payload = d.peer.inbox.get(timeout=WAIT_S)
                assert (topic, payload) == (topics.directive(d.device_id), d.device_id.encode())
                assert d.peer.flush() == []  # and nothing else
            per_shard = {n: p.published for n, p in publisher.shards.items()}
            assert per_shard == {"main": 2, "eu": 2}
        finally:
            publisher.close()

        # heartbeats: each lands once, ingested by the two replicas' workers of its shard
        for d in devices:
            for seq in range(BEATS):
                beat = Heartbeat(device_id=d.device_id, seq=seq, ts=time.time())
                assert not d.peer.publish(topics.heartbeat(d.device_id), encode(beat)).is_failure
        total = BEATS * len(devices)

        def stored() -> int:
            with a.context.engine.connect() as conn:
                return int(
                    conn.execute(sa.select(sa.func.count()).select_from(heartbeats)).scalar_one()
                )

        wait_for("every heartbeat stored", lambda: stored() == total)
        wait_for(
            "every heartbeat received",
            lambda: sum(ingest_figures(fleet, s)[0] for s in ("main", "eu")) >= total,
        )
        for shard in ("main", "eu"):
            assert ingest_figures(fleet, shard) == (BEATS * 2, 0), shard
        with a.context.engine.connect() as conn:
            rows = conn.execute(
                sa.select(heartbeats.c.device_id, sa.func.count()).group_by(heartbeats.c.device_id)
            ).all()
        assert dict(rows) == {d.device_id: BEATS for d in devices}
    finally:
        for d in devices:
            d.peer.close()


def test_a_chunk_request_is_answered_once_by_two_replicas_and_revocation_reaches_the_shard(
    fleet: Fleet, tmp_path: Path
) -> None:
    a, b = fleet.replicas
    device_id = "cam-eu-9"
    body = enroll(b.url, device_id, {"site": "eu-1"}, tmp_path)
    assert body["broker"]["port"] == fleet.ports["eu"]
    creds = (tmp_path / "ca.crt", tmp_path / f"{device_id}.crt", tmp_path / f"{device_id}.key")
    peer = Peer(fleet.ports["eu"], *creds)
    assert peer.connect()
    try:
        assert not peer.subscribe(topics.fetch_response(device_id))[0].is_failure
        requests = 8
        for _ in range(requests):
            req = FetchRequest(
                id=uuid.uuid4().hex, path="metadata/timestamp.json", offset=0, max=1024
            )
            assert not peer.publish(topics.fetch_request(device_id), encode_request(req)).is_failure
        got = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < requests and time.monotonic() < deadline:
            got += peer.flush()
            time.sleep(0.05)
        got += peer.flush()  # anything answered twice would be here by now
        assert len(got) == requests, got
        servers = [r.context for r in fleet.replicas]
        answered = [ctx.health.check()["files-eu"].detail["requests"] for ctx in servers]
        assert sum(answered) == requests, answered
        assert [ctx.health.check()["files"].detail["requests"] for ctx in servers] == [0, 0]
    finally:
        peer.close()

    # revoked through a replica that runs no broker: the brokers process sees the new CRL
    revoked = http("POST", f"{a.url}/api/v1/devices/{device_id}/revoke", token=OPERATOR_TOKEN)
    assert revoked.status == 200
    assert revoked.body["broker_reloaded"] is False  # not this process's brokers

    def refused() -> bool:
        again = Peer(fleet.ports["eu"], *creds)
        if again.connect():
            again.close()
            return False
        return True

    wait_for("the revoked device refused by shard eu", refused)
