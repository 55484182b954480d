"""GET /metrics of a real fleet server: PostgreSQL, its managed Mosquitto (TLS), the
ingest workers, the rollout service, the leader election; scraped over HTTP and parsed
with prometheus-client's parser. A device enrolled over the API sends heartbeats (and one
payload that is not JSON) through the broker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.wire import topics
from agent.wire.enroll import ENROLL_PATH
from agent.wire.messages import Heartbeat, encode
from fleet_server.ca import make_device_key_and_csr
from fleet_server.cli.server import services_for
from fleet_server.config import parse_config
from fleet_server.metrics.config import MetricsSection
from fleet_server.serve import FleetServer
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    http,
    make_repository,
)
from tests.fleet_server.metrics.fleet_metrics_support import Scrape, scrape, wait_for
from tests.support.broker import free_port
from tests.support.pg import PgCluster
from tests.support.tls_peers import Peer

pytest_plugins = ["tests.fleet_server.db_fixtures"]
pytestmark = pytest.mark.timeout(240)

P = "edgefleet_fleet_"
REPLICA = "metrics-r1"


@dataclass
class Served:
    server: FleetServer
    mqtt: int
    root: Path

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, pg_cluster: PgCluster) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("metrics-serve")
    repo, keys = make_repository(root)
    url = pg_cluster.create_database()
    mqtt = free_port()
    cfg = parse_config(
        {
            "server": {"state_dir": str(root / "state")},
            "http": {"port": 0, "operator_token_env": TOKEN_ENV},
            "database": {"url": url},
            "broker": {"mosquitto": {"port": mqtt, "persistence": False}},
            "repository": {"path": str(repo), "keystore": str(keys)},
            "cluster": {"replica_id": REPLICA, "lease_s": 1.0, "renew_s": 0.2, "poll_s": 0.2},
        }
    )
    cfg = cfg.model_copy(update={"metrics": MetricsSection(cache_s=0)})
    with pytest.MonkeyPatch.context() as env:
        env.delenv("CREDENTIALS_DIRECTORY", raising=False)
        env.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
        env.setenv(TOKEN_ENV, OPERATOR_TOKEN)
        server = FleetServer(cfg, services=services_for(cfg))
        server.start()
        try:
            yield Served(server, mqtt, root)
        finally:
            server.stop()
            pg_cluster.drop_database(url)


def enroll_device(served: Served, device_id: str) -> Peer:
    """Enroll ``device_id`` over the API and connect it to the broker with what it got."""
    token = http(
        "POST", f"{served.url}/api/v1/devices/{device_id}/tokens", {}, token=OPERATOR_TOKEN
    ).body["token"]
    key_pem, csr_pem = make_device_key_and_csr(device_id)
    enrolled = http(
        "POST", served.url + ENROLL_PATH, {"token": token, "csr": csr_pem.decode()}
    ).body
    d = served.root / device_id
    d.mkdir()
    (d / "ca.crt").write_text(enrolled["ca"])
    (d / "dev.crt").write_text(enrolled["certificate"])
    (d / "dev.key").write_bytes(key_pem)
    peer = Peer(enrolled["broker"]["port"], d / "ca.crt", d / "dev.crt", d / "dev.key")
    assert peer.connect()
    return peer


def ok_scrape(served: Served) -> Scrape:
    answer = scrape(served.url)
    assert answer.status == 200, answer.text
    return answer


def test_metrics_are_prometheus_text_open_like_healthz_by_default(served: Served) -> None:
    assert http("GET", served.url + "/healthz").status == 200  # no credential
    answer = scrape(served.url)  # no credential either: the same rule
    assert answer.status == 200
    assert answer.content_type.startswith("text/plain")
    assert "version=0.0.4" in answer.content_type
    names = {s.name for s in answer.samples()}
    assert f"{P}part_up" in names
    assert answer.value(f"{P}part_up", part="ingest-0") == 1.0
    assert answer.value(f"{P}metrics_errors_total") is None  # nothing failed to read
    # the jobs' probes are read (a family without its part would have no sample)
    for job in ("retention_runs", "retention_failures", "drift_runs", "drift_failures"):
        assert answer.value(f"{P}{job}_total") is not None, job


def test_heartbeats_through_the_broker_raise_the_ingest_counters(served: Served) -> None:
    before = ok_scrape(served)
    received0 = before.total(f"{P}ingest_received_messages_total")
    stored0 = before.total(f"{P}ingest_records_total", result="stored")
    quarantined0 = before.total(f"{P}ingest_records_total", result="quarantined")
    peer = enroll_device(served, "cam-ingest")
    try:
        now = time.time()
        for seq in range(3):
            beat = encode(Heartbeat(device_id="cam-ingest", seq=seq, ts=now + seq * 0.001))
            assert not peer.publish(topics.heartbeat("cam-ingest"), beat).is_failure
        assert not peer.publish(topics.heartbeat("cam-ingest"), b"not json {").is_failure
    finally:
        peer.close()

    def counted() -> Scrape | None:
        s = ok_scrape(served)
        done = (
            s.total(f"{P}ingest_received_messages_total") >= received0 + 4
            and s.total(f"{P}ingest_records_total", result="quarantined") >= quarantined0 + 1
        )
        return s if done else None

    after = wait_for(counted, "4 messages received, 1 quarantined")
    assert after.total(f"{P}ingest_records_total", result="stored") >= stored0 + 3
    assert after.value(f"{P}ingest_connected", worker="ingest-0") == 1.0
    lag = after.value(f"{P}ingest_lag_seconds", worker="ingest-0")
    assert lag is not None
    assert lag >= 0
    # the garbage payload is in the database's quarantine, counted by its reason class
    assert (after.value(f"{P}quarantined_payloads", reason="invalid") or 0) >= 1
    # a heartbeat put the device online, on the main shard
    assert after.value(f"{P}devices", shard="main") == 1.0
    assert after.value(f"{P}devices_online", shard="main") == 1.0


def test_the_single_replica_leads_with_its_epoch(served: Served) -> None:
    def leading() -> Scrape | None:
        s = ok_scrape(served)
        return s if s.value(f"{P}leader", replica=REPLICA) == 1.0 else None

    s = wait_for(leading, "the replica leads")
    epoch = s.value(f"{P}leader_epoch", replica=REPLICA)
    assert epoch is not None
    assert epoch >= 1

    def ticking() -> Scrape | None:  # the leader's reconciler runs: its ticks count
        s = ok_scrape(served)
        ticks = s.value(f"{P}rollout_reconciler_events_total", event="ticks") or 0
        return s if ticks > 0 else None

    s = wait_for(ticking, "the reconciler ticks")
    assert s.value(f"{P}rollout_reconciler_events_total", event="fenced") == 0.0


def test_http_latency_is_labelled_by_route_template_not_raw_path(served: Served) -> None:
    for device_id in ("cam-a", "cam-b"):  # two paths, one route
        answer = http("GET", f"{served.url}/api/v1/devices/{device_id}", token=OPERATOR_TOKEN)
        assert answer.status == 404
    assert http("GET", served.url + "/no/such/path/123").status == 404
    s = ok_scrape(served)
    count = f"{P}http_request_duration_seconds_count"
    route = "/api/v1/devices/{device_id}"
    assert s.value(count, method="GET", route=route, status="404") == 2.0
    assert s.value(count, method="GET", route="<unmatched>", status="404") == 1.0
    assert s.value(count, method="GET", route="/healthz", status="200") is not None
    routes = {x.labels["route"] for x in s.samples() if x.name == count}
    assert not any("cam-" in r or "123" in r for r in routes), routes
    buckets = [
        x for x in s.samples() if x.name == f"{P}http_request_duration_seconds_bucket"
        and x.labels["route"] == route
    ]  # fmt: skip
    assert buckets
    assert max(b.value for b in buckets) == 2.0  # the +Inf bucket holds both


def test_rollouts_by_phase_count_a_created_rollout(served: Served) -> None:
    before = ok_scrape(served)
    phases = {x.labels["phase"]: x.value for x in before.samples() if x.name == f"{P}rollouts"}
    assert {"planned", "assigning", "completed", "rolled_back"} <= set(phases)
    spec = {"bundle": "tiny@1.0.0", "selector": "*", "waves": "100%", "soak_s": "10m"}
    created = http("POST", served.url + "/api/v1/rollouts", spec, token=OPERATOR_TOKEN)
    assert created.status == 201, created.body
    rid = created.body["rollout_id"]
    # paused, it stays in one phase while the reconciler runs
    paused = http(
        "POST", f"{served.url}/api/v1/rollouts/{rid}/pause", {"reason": "metrics test"},
        token=OPERATOR_TOKEN,
    )  # fmt: skip
    assert paused.status == 200, paused.body
    assert paused.body["phase"] == "paused"
    after = ok_scrape(served)
    now = {x.labels["phase"]: x.value for x in after.samples() if x.name == f"{P}rollouts"}
    assert sum(now.values()) == sum(phases.values()) + 1
    assert now["paused"] == phases["paused"] + 1
