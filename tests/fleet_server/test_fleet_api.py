"""The fleet server's HTTP API over real HTTP: a FleetServer in this process (uvicorn on a
free loopback port, a real CA, a real signed repository) on SQLite and on PostgreSQL,
requests with urllib. Rollouts run on the real pure controller (LocalRolloutOps)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from agent.wire.enroll import ENROLL_PATH
from fleet_server.ca import make_device_key_and_csr
from fleet_server.db import sqlite_url, store
from fleet_server.db.store import Record
from fleet_server.serve import FleetServer
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    WRONG_TOKEN,
    LocalRolloutOps,
    RunningApi,
    api_config,
    http,
    make_repository,
)

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db_url (SQLite and PostgreSQL), pg_cluster

StartApi = Callable[[str], RunningApi]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("fleet-repo"))


@pytest.fixture
def start_api(
    tmp_path: Path, repository: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[StartApi]:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    servers: list[FleetServer] = []

    def start(db_url: str) -> RunningApi:
        cfg = api_config(tmp_path / "state", *repository, db_url=db_url)
        server = FleetServer(cfg, services=[LocalRolloutOps])
        server.start()
        servers.append(server)
        return RunningApi(server)

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def api(start_api: StartApi, db_url: str) -> RunningApi:
    """On SQLite and on PostgreSQL."""
    return start_api(db_url)


@pytest.fixture
def api_lite(start_api: StartApi, tmp_path: Path) -> RunningApi:
    """On SQLite only."""
    return start_api(sqlite_url(tmp_path / "fleet.db"))


def new_token(api: RunningApi, device_id: str, **body: object) -> str:
    answer = api.call("POST", f"/api/v1/devices/{device_id}/tokens", body)
    assert answer.status == 201, answer.body
    token: str = answer.body["token"]
    return token


def enroll(api: RunningApi, token: str, cn: str) -> tuple[bytes, object]:
    key_pem, csr_pem = make_device_key_and_csr(cn)
    req = {"token": token, "csr": csr_pem.decode(), "agent_version": "0.9.1"}
    answer = http("POST", api.url + ENROLL_PATH, req)
    return key_pem, answer


# -- enrollment (SQLite and PostgreSQL) ------------------------------------------------


def test_enrolled_device_gets_a_certificate_for_its_id_that_the_ca_verifies(
    api: RunningApi,
) -> None:
    token = new_token(api, "cam-07", labels={"line": "3"}, profile="x86-gateway")
    _, answer = enroll(api, token, "cam-07")
    assert answer.status == 200, answer.body
    body = answer.body
    cert = x509.load_pem_x509_certificate(body["certificate"].encode())
    ca_cert = x509.load_pem_x509_certificate(body["ca"].encode())
    cert.verify_directly_issued_by(ca_cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "cam-07"
    assert ca_cert == api.ctx.ca.certificate()
    assert body["device_id"] == "cam-07"
    assert body["broker"] == {"host": "fleet.test", "port": 8883}
    assert (body["labels"], body["profile"]) == ({"line": "3"}, "x86-gateway")
    root = (api.ctx.repository.metadata_dir / "1.root.json").read_text()
    assert body["trust_root"] == root
    device = api.call("GET", "/api/v1/devices/cam-07").body
    assert device["labels"] == {"line": "3"}
    assert device["profile"] == "x86-gateway"
    assert device["agent_version"] == "0.9.1"
    assert device["cert_serial"] == f"{cert.serial_number:X}"
    assert device["revoked"] is False


def test_an_enrollment_token_can_not_be_used_twice(api: RunningApi) -> None:
    token = new_token(api, "cam-08")
    _, first = enroll(api, token, "cam-08")
    assert first.status == 200, first.body
    _, second = enroll(api, token, "cam-08")
    assert second.status == 403
    assert "already used" in second.body["detail"]


def test_csr_for_another_device_is_refused_and_the_token_stays_unused(api: RunningApi) -> None:
    token = new_token(api, "cam-09")
    _, refused = enroll(api, token, "cam-10")
    assert refused.status == 403
    assert "CSR refused" in refused.body["detail"]
    assert "cam-10" in refused.body["detail"]
    assert api.call("GET", "/api/v1/devices/cam-10").status == 404
    assert api.call("GET", "/api/v1/devices/cam-09").body["pending"] is True  # token unused
    _, accepted = enroll(api, token, "cam-09")
    assert accepted.status == 200, accepted.body


def test_device_list_selects_by_label_and_profile(api: RunningApi) -> None:
    engine = api.ctx.engine
    store.upsert_device(engine, "a1", labels={"line": "3"}, profile="jetson-orin")
    store.upsert_device(engine, "a2", labels={"line": "3"}, profile="x86-gateway")
    store.upsert_device(engine, "b1", labels={"line": "4"}, profile="jetson-orin")
    ids = lambda q: [d["device_id"] for d in api.call("GET", "/api/v1/devices" + q).body]  # noqa: E731
    assert ids("") == ["a1", "a2", "b1"]
    assert ids("?selector=line=3") == ["a1", "a2"]
    assert ids("?selector=line=3,profile=jetson-orin") == ["a1"]
    assert ids("?selector=*") == ["a1", "a2", "b1"]
    bad = api.call("GET", "/api/v1/devices?selector=line")
    assert bad.status == 400
    assert "selector" in bad.body["detail"]


def test_a_device_enrolled_but_never_connected_is_listed_pending_until_it_enrolls(
    api: RunningApi,
) -> None:
    engine = api.ctx.engine
    store.upsert_device(engine, "a1", labels={"line": "3"}, profile="jetson-orin")
    body = {"labels": {"line": "3"}, "profile": "x86-gateway", "ttl_s": 3600}
    made = api.call("POST", "/api/v1/devices/p1/tokens", body)
    assert made.status == 201, made.body
    newer = api.call("POST", "/api/v1/devices/p1/tokens", body | {"ttl_s": 7200})
    assert newer.status == 201, newer.body
    new_token(api, "p2", labels={"line": "4"})
    listed = api.call("GET", "/api/v1/devices").body
    assert [(d["device_id"], d["pending"]) for d in listed] == [
        ("a1", False), ("p1", True), ("p2", True),
    ]  # fmt: skip
    p1 = next(d for d in listed if d["device_id"] == "p1")
    assert p1["token_expires_at"] == newer.body["expires_at"]  # the newest token's
    assert (p1["labels"], p1["profile"], p1["online"], p1["last_seen"]) == (
        {"line": "3"}, "x86-gateway", False, None,
    )  # fmt: skip
    assert listed[0]["token_expires_at"] is None
    ids = lambda q: [d["device_id"] for d in api.call("GET", "/api/v1/devices" + q).body]  # noqa: E731
    assert ids("?selector=line=3") == ["a1", "p1"]
    assert ids("?selector=line=3,profile=x86-gateway") == ["p1"]
    shown = api.call("GET", "/api/v1/devices/p1")
    assert shown.status == 200, shown.body
    assert (shown.body["pending"], shown.body["shard"]) == (True, None)
    tele = api.call("GET", "/api/v1/devices/p1/telemetry")
    assert tele.status == 404
    assert "enrolled but never connected" in tele.body["detail"]
    _, done = enroll(api, newer.body["token"], "p1")
    assert done.status == 200, done.body
    after = api.call("GET", "/api/v1/devices/p1").body
    assert (after["pending"], after["token_expires_at"]) == (False, None)
    assert [d["device_id"] for d in api.call("GET", "/api/v1/devices").body if d["pending"]] == [
        "p2"
    ]
    assert [d.device_id for d in store.list_devices(engine)] == ["a1", "p1"]  # rollouts' list


# -- SQLite only --------------------------------------------------------------------


def test_operator_endpoints_need_the_bearer_token(api_lite: RunningApi) -> None:
    url = api_lite.url
    missing = http("GET", url + "/api/v1/devices")
    assert missing.status == 401
    assert missing.headers.get("www-authenticate") == "Bearer"
    assert http("GET", url + "/api/v1/devices", token=WRONG_TOKEN).status == 401
    assert http("POST", url + "/api/v1/devices/x1/tokens", {}).status == 401
    assert http("GET", url + "/api/v1/rollouts").status == 401
    assert http("GET", url + "/api/v1/devices", token=OPERATOR_TOKEN).status == 200
    # enrollment needs no operator token: a bad one-time token is a 403, not a 401
    _, answer = enroll(api_lite, "x" * 43, "cam-01")
    assert answer.status == 403
    assert http("GET", url + "/healthz").body["status"] == "ok"


def test_openapi_documents_every_path_and_the_response_models(api_lite: RunningApi) -> None:
    doc = http("GET", api_lite.url + "/openapi.json").body
    assert set(doc["paths"]) >= {
        "/healthz",
        ENROLL_PATH,
        "/api/v1/devices",
        "/api/v1/devices/{device_id}",
        "/api/v1/devices/{device_id}/telemetry",
        "/api/v1/devices/{device_id}/tokens",
        "/api/v1/devices/{device_id}/revoke",
        "/api/v1/bundles",
        "/api/v1/rollouts",
        "/api/v1/rollouts/{rollout_id}",
        "/api/v1/rollouts/{rollout_id}/{action}",
    }
    schemas = doc["components"]["schemas"]
    assert {"DeviceOut", "EnrollResponse", "RolloutOut", "TelemetryOut", "ErrorOut"} <= set(schemas)
    ok = doc["paths"]["/api/v1/devices/{device_id}"]["get"]["responses"]["200"]
    assert ok["content"]["application/json"]["schema"]["$ref"].endswith("/DeviceOut")
    assert "HTTPBearer" in doc["components"]["securitySchemes"]


def test_malformed_requests_are_400_and_unknown_devices_404(api_lite: RunningApi) -> None:
    short = http("POST", api_lite.url + ENROLL_PATH, {"token": "short", "csr": "x"})
    assert short.status == 400
    assert "token" in short.body["detail"]
    not_json = http("POST", api_lite.url + ENROLL_PATH, raw=b"{nope")
    assert not_json.status == 400
    assert api_lite.call("GET", "/api/v1/devices/ghost").status == 404
    assert api_lite.call("GET", "/api/v1/devices/ghost/telemetry").status == 404
    bad_id = api_lite.call("POST", "/api/v1/devices/a+b/tokens", {})
    assert bad_id.status == 400
    assert "device id" in bad_id.body["detail"]
    bad_label = api_lite.call("POST", "/api/v1/devices/ok1/tokens", {"labels": {"Line": "3"}})
    assert bad_label.status == 400


def test_telemetry_shows_latest_health_and_recent_heartbeats_newest_first(
    api_lite: RunningApi,
) -> None:
    engine = api_lite.ctx.engine
    store.upsert_device(engine, "t1", agent_version="1.2.0", health={"fps": {"cam": 12.5}})
    store.insert_heartbeats(
        engine, [Record("t1", f"h{i}", 100.0 + i, {"seq": i}) for i in range(5)]
    )
    store.insert_telemetry(engine, [Record("t1", "s1", 103.0, {"kind": "health", "cpu": 40.0})])
    store.mark_seen(engine, "t1", 104.0, True)
    body = api_lite.call("GET", "/api/v1/devices/t1/telemetry?limit=3").body
    assert body["health"] == {"fps": {"cam": 12.5}}
    assert [h["record_id"] for h in body["heartbeats"]] == ["h4", "h3", "h2"]
    assert body["samples"][0]["payload"]["cpu"] == 40.0
    assert (body["online"], body["last_seen"], body["agent_version"]) == (True, 104.0, "1.2.0")


def test_revoked_device_is_on_the_crl_and_marked_revoked(api_lite: RunningApi) -> None:
    token = new_token(api_lite, "cam-11")
    _, answer = enroll(api_lite, token, "cam-11")
    serial = x509.load_pem_x509_certificate(answer.body["certificate"].encode()).serial_number
    revoked = api_lite.call("POST", "/api/v1/devices/cam-11/revoke")
    assert revoked.status == 200
    assert revoked.body["revoked_serials"] == [f"{serial:X}"]
    assert revoked.body["broker_reloaded"] is False  # an external broker: nothing to reload
    crl = x509.load_pem_x509_crl(api_lite.ctx.ca.crl_path.read_bytes())
    assert crl.get_revoked_certificate_by_serial_number(serial) is not None
    assert api_lite.call("GET", "/api/v1/devices/cam-11").body["revoked"] is True
    assert api_lite.call("POST", "/api/v1/devices/ghost/revoke").status == 404


def test_bundles_lists_the_published_release(api_lite: RunningApi) -> None:
    bundles = api_lite.call("GET", "/api/v1/bundles").body
    assert [(b["name"], b["version"], b["release"]) for b in bundles] == [("tiny", "1.0.0", 1)]
    assert bundles[0]["files"]


def test_rollout_is_created_shown_paused_and_refuses_what_its_phase_does_not_allow(
    api_lite: RunningApi,
) -> None:
    engine = api_lite.ctx.engine
    for i in range(4):
        store.upsert_device(engine, f"d{i}", labels={"line": "3"}, profile="x86-gateway")
        store.mark_seen(engine, f"d{i}", 100.0, True)
    spec = {"bundle": "tiny@1.0.0", "selector": "line=3", "waves": "1,50%,100%", "soak_s": "10m"}
    created = api_lite.call("POST", "/api/v1/rollouts", spec)
    assert created.status == 201, created.body
    rid = created.body["rollout_id"]
    assert created.body["phase"] == "assigning"
    assert (created.body["wave"], created.body["waves"], created.body["release"]) == (1, 3, 1)
    shown = api_lite.call("GET", f"/api/v1/rollouts/{rid}").body
    assert sorted(d["device_id"] for d in shown["devices"]) == ["d0", "d1", "d2", "d3"]
    assert shown["counts"] == {"assigned": 1, "pending": 3}
    paused = api_lite.call("POST", f"/api/v1/rollouts/{rid}/pause", {"reason": "line stop"})
    assert paused.status == 200
    assert paused.body["phase"] == "paused"
    approve = api_lite.call("POST", f"/api/v1/rollouts/{rid}/approve")
    assert approve.status == 409
    assert "paused" in approve.body["detail"]
    listed = api_lite.call("GET", "/api/v1/rollouts").body
    assert [(r["rollout_id"], r["phase"]) for r in listed] == [(rid, "paused")]
    assert api_lite.call("GET", "/api/v1/rollouts/nope").status == 404
    assert api_lite.call("POST", "/api/v1/rollouts/nope/pause").status == 404
    assert api_lite.call("POST", f"/api/v1/rollouts/{rid}/explode").status == 400


def test_rollout_spec_errors_name_the_field(api_lite: RunningApi) -> None:
    bad = {"bundle": "tiny@1.0.0", "selector": "*", "waves": "50%,10%", "soak_s": "10m"}
    answer = api_lite.call("POST", "/api/v1/rollouts", bad)
    assert answer.status == 400
    assert "waves" in answer.body["detail"]
    unknown = {"bundle": "tiny@9.9.9", "selector": "*", "waves": "100%", "soak_s": 60}
    answer = api_lite.call("POST", "/api/v1/rollouts", unknown)
    assert answer.status == 400
    assert "not published" in answer.body["detail"]
