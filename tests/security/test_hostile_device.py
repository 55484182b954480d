"""One enrolled device, hostile, against a running ``fleet-server serve``: it holds its own
certificate and nothing else, and tries each class of attack that once hurt the fleet.
After every attack the other devices' records are stored exactly once, every service
still answers, and ``/healthz`` tells the truth.

The attacker is ``atk``; ``v1``..``v3`` are well-behaved devices of the same fleet.
"""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from agent.kernel.clientid import secret_client_id
from agent.wire import topics
from agent.wire.fetch import STATUS_OK, FetchRequest, decode_response, encode_request
from agent.wire.messages import encode
from agent.wire.quality import DRIFT_BINS, DriftBatch, DriftHour, ShadowBatch
from agent.wire.reports import BundleRef, ReportedState
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    make_repository,
)
from tests.fleet_server.quality.shadow_data import shadow_record
from tests.security.hostile_fleet import (
    ENROLLED_LABELS,
    ENROLLED_PROFILE,
    HostileFleet,
    decision_row,
    decisions,
    heartbeat,
    serve,
    victims_report,
)
from tests.support.tls_peers import Peer

ATTACKER = "atk"
VICTIMS = ["v1", "v2", "v3"]
WAIT_S = 15.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileFleet]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CREDENTIALS_DIRECTORY", raising=False)
        mp.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
        mp.setenv(TOKEN_ENV, OPERATOR_TOKEN)
        repo, keys = make_repository(tmp_path_factory.mktemp("hostile-repo"))
        yield from serve(tmp_path_factory.mktemp("hostile"), repo, keys, [ATTACKER, *VICTIMS])


def assert_healthy(fleet: HostileFleet) -> dict[str, Any]:
    status, body = fleet.healthz()
    assert status == 200, body
    assert body["status"] == "ok", body
    return body


# -- class 1: poison records ------------------------------------------------------------

DEEP = 100_000
POISON: dict[str, tuple[str, bytes]] = {
    # Payloads that are JSON and look like messages, but can't be stored as they are.
    "nul-in-string": ("events", b'"payload":{"note":"a\\u0000b"}'),
    "lone-surrogate": ("events", b'"payload":{"note":"\\ud800"}'),
    "lone-surrogate-key": ("events", b'"payload":{"\\udfff":1}'),
    "int-beyond-64-bits": ("events", b'"payload":{"n":18446744073709551617}'),
    "int-of-5000-digits": ("events", b'"payload":{"n":' + b"9" * 5000 + b"}"),
    "float-overflow": ("events", b'"payload":{"x":1e400}'),
    "nested-31": ("events", b'"payload":' + b'{"a":' * 31 + b"1" + b"}" * 31),
    "nested-deep": ("events", b'"payload":' + b"[" * DEEP + b"]" * DEEP),
    "huge-key-count": (
        "events",
        b'"payload":{' + b",".join(b'"k%d":%d' % (i, i) for i in range(20_000)) + b"}",
    ),
}


def _event_with(fragment: bytes) -> bytes:
    head = (
        b'{"schema_version":1,"device_id":"atk","kind":"alarm","event_id":"'
        + uuid.uuid4().hex.encode()
        + b'","ts":'
        + repr(time.time()).encode()
        + b","
    )
    return head + fragment + b"}"


@pytest.mark.parametrize("name", sorted(POISON))
def test_a_poison_record_is_isolated_and_other_devices_records_are_stored_once(
    fleet: HostileFleet, name: str
) -> None:
    _kind, fragment = POISON[name]
    before = fleet.quarantined()
    atk = fleet.peer(ATTACKER)
    try:
        payload = _event_with(fragment)
        atk.publish(topics.events(ATTACKER), payload)
        # The same poison retained on the state topic comes back at every resubscribe.
        state = b'{"schema_version":1,"device_id":"atk","kind":"state","ts":1.0,' + fragment + b"}"
        atk.publish(topics.state(ATTACKER), state, retain=True)
    finally:
        atk.close()
    check = victims_report(fleet, VICTIMS, beats=5, events=1)
    check()
    # The poison was either stored as a well-formed record or set aside with its reason.
    stored = fleet.count("SELECT count(*) FROM events WHERE device_id = ?", ATTACKER)
    assert fleet.quarantined() > before or stored > 0
    assert_healthy(fleet)


def test_quarantined_records_name_their_reason(fleet: HostileFleet) -> None:
    atk = fleet.peer(ATTACKER)
    try:
        atk.publish(topics.events(ATTACKER), _event_with(POISON["lone-surrogate"][1]))
    finally:
        atk.close()
    deadline = time.monotonic() + WAIT_S
    rows: list[tuple[Any, ...]] = []
    while time.monotonic() < deadline and not rows:
        rows = fleet.query(
            "SELECT reason FROM quarantine WHERE topic = ? AND reason LIKE '%surrogate%'",
            topics.events(ATTACKER),
        )
        time.sleep(0.1)
    assert rows, "no quarantine row names the lone surrogate"


# -- class 2: a message that kills a callback thread --------------------------------------


class FetchPeer(Peer):
    """A Peer that keeps each response's MQTT 5 properties."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.responses: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        super().__init__(*args, **kwargs)

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        self.responses.put(msg)


def fetch_peer(fleet: HostileFleet, device_id: str) -> FetchPeer:
    ident = fleet.devices[device_id]
    cid = secret_client_id(f"{device_id}-fetch", ident.key)
    peer = FetchPeer(fleet.mqtt_port, fleet.ca_file, ident.cert, ident.key, cid)
    assert peer.connect()
    assert not peer.subscribe(topics.fetch_response(device_id))[0].is_failure
    return peer


BAD_FETCH: dict[str, bytes] = {
    "deep-json": b"[" * DEEP + b"]" * DEEP,
    "deep-json-in-object": b'{"id":"x1","path":' + b"[" * DEEP + b"]" * DEEP + b"}",
    "lone-surrogate-path": b'{"id":"x2","path":"metadata/\\ud800.json","offset":0,"max":10}',
    "nul-path": b'{"id":"x3","path":"metadata/a\\u0000.json","offset":0,"max":10}',
    "huge-offset": b'{"id":"x4","path":"metadata/1.root.json","offset":1e400,"max":10}',
    "int-offset-beyond-64-bits": (
        b'{"id":"x5","path":"metadata/1.root.json","offset":' + b"9" * 30 + b',"max":10}'
    ),
    "not-utf8": b'{"id":"x6","path":"\xff\xfe"}',
    "path-traversal": b'{"id":"x7","path":"metadata/../../../etc/passwd","offset":0,"max":10}',
    "oversized": b'{"id":"x8","path":"' + b"a" * 8000 + b'"}',
}


def _fetch_root(fleet: HostileFleet, device_id: str) -> None:
    """A well-formed fetch of the trust root is answered with its bytes."""
    victim = fetch_peer(fleet, device_id)
    try:
        request = FetchRequest(id=uuid.uuid4().hex, path="metadata/1.root.json", offset=0, max=4096)
        victim.publish(topics.fetch_request(device_id), encode_request(request))
        msg = victim.responses.get(timeout=WAIT_S)
        response = decode_response(bytes(msg.payload), msg.properties)
        assert response.id == request.id
        assert response.status == STATUS_OK, response
        assert response.data.startswith(b"{")
    finally:
        victim.close()


def test_bad_fetch_requests_never_stop_the_file_server_for_other_devices(
    fleet: HostileFleet,
) -> None:
    atk = fleet.peer(ATTACKER)
    try:
        for payload in BAD_FETCH.values():
            atk.publish(topics.fetch_request(ATTACKER), payload)
    finally:
        atk.close()
    _fetch_root(fleet, "v1")
    body = assert_healthy(fleet)
    assert any(name.startswith("file") for name in body["services"]), body


def test_a_bad_fetch_request_with_an_id_gets_an_error_answer(fleet: HostileFleet) -> None:
    atk = fetch_peer(fleet, ATTACKER)
    try:
        atk.publish(topics.fetch_request(ATTACKER), BAD_FETCH["lone-surrogate-path"])
        msg = atk.responses.get(timeout=WAIT_S)
        response = decode_response(bytes(msg.payload), msg.properties)
        assert response.id == "x2"
        assert response.status != STATUS_OK
    finally:
        atk.close()


# -- class 3: diverting the fleet's stream -----------------------------------------------

SHARE_GROUPS = ["ingest", "fleet-ingest", "fleet", "edgefleet", "group", "g"]


def test_a_device_in_a_shared_subscription_group_diverts_nothing(fleet: HostileFleet) -> None:
    atk = fleet.peer(ATTACKER)
    try:
        for group in SHARE_GROUPS:
            for kind in ("heartbeat", "events", "telemetry", "decisions"):
                atk.subscribe(f"$share/{group}/edgefleet/devices/+/{kind}")
        atk.subscribe("#")
        atk.subscribe("edgefleet/devices/+/directive")
        check = victims_report(fleet, VICTIMS, beats=20, events=3)
        check()
        leaked = [t for t, _ in atk.flush() if not t.startswith(f"edgefleet/devices/{ATTACKER}/")]
        assert leaked == [], leaked[:5]
    finally:
        atk.close()
    assert_healthy(fleet)


# -- class 4: taking over another client's session ---------------------------------------


def _taken_ids() -> list[str]:
    host = socket.gethostname()
    return [
        "v1",
        "v1-uplink",
        "edge-agent-v1-updates",
        f"fleet-ingest-{host}-0",
        f"fleet-files-{host}",
        "fleet-server",
        "fleet:ingest-0",
        "fleet:files",
        "fleet:rollouts",
    ]


@pytest.mark.parametrize("client_id", _taken_ids())
def test_a_device_cannot_take_over_another_clients_session(
    fleet: HostileFleet, client_id: str
) -> None:
    victim = fleet.peer("v1")  # with the id a real agent's uplink uses
    try:
        ident = fleet.devices[ATTACKER]
        atk = Peer(fleet.mqtt_port, fleet.ca_file, ident.cert, ident.key, client_id)
        connected = atk.connect()
        if connected:
            topic, payload, _ = heartbeat(ATTACKER)
            atk.publish(topic, payload)
        # The victim is still connected and its records still arrive.
        topic, payload, rid = heartbeat("v1")
        assert not victim.publish(topic, payload).is_failure
        assert not victim.closed, f"v1 was kicked by a client id {client_id!r}"
        got = fleet.wait_count(
            "SELECT count(*) FROM heartbeats WHERE device_id = 'v1' AND record_id = ?",
            rid,
            want=1,
        )
        assert got == 1
        if connected:
            atk.close()
    finally:
        victim.close()
    victims_report(fleet, ["v2"], beats=3, events=1)()
    _fetch_root(fleet, "v2")  # the file server still answers
    assert_healthy(fleet)


# -- class 5: a device's clock is data ---------------------------------------------------

FUTURE_TIMES = [1e300, 1e18, 253402300800.0, 4102444800.0]


@pytest.mark.parametrize("ts", FUTURE_TIMES)
def test_a_far_future_clock_breaks_no_view(fleet: HostileFleet, ts: float) -> None:
    atk = fleet.peer(ATTACKER)
    try:
        beat = (
            b'{"schema_version":1,"device_id":"atk","kind":"heartbeat","seq":7,"ts":'
            + repr(ts).encode()
            + b"}"
        )
        atk.publish(topics.heartbeat(ATTACKER), beat)
        row = decision_row(ATTACKER, f"future-{uuid.uuid4().hex[:12]}", decision_time=ts)
        atk.publish(*decisions(ATTACKER, [row]))
        fine = decision_row(ATTACKER, f"now-{uuid.uuid4().hex[:12]}")
        atk.publish(*decisions(ATTACKER, [fine]))
        state = (
            b'{"schema_version":1,"device_id":"atk","kind":"state","ts":' + repr(ts).encode() + b"}"
        )
        atk.publish(topics.state(ATTACKER), state, retain=True)
        # A well-behaved heartbeat afterwards.
        topic, payload, rid = heartbeat(ATTACKER)
        atk.publish(topic, payload)
    finally:
        atk.close()
    fleet.wait_count(
        "SELECT count(*) FROM heartbeats WHERE device_id = ? AND record_id = ?",
        ATTACKER,
        rid,
        want=1,
    )
    for path in ("/ui/", f"/ui/devices/{ATTACKER}", "/ui/decisions", "/ui/rollouts"):
        answer = _get_page(fleet, path)
        assert answer == 200, f"{path}: {answer}"
    fleet.wait_count(
        "SELECT count(*) FROM decisions WHERE device_id = ? AND id = ?",
        ATTACKER,
        fine.id,
        want=1,
    )
    export = _get_raw(fleet, "/api/v1/decisions/export.csv")
    assert fine.id.encode() in export, export[:400]  # the export is not cut at the future row
    device = fleet.api("GET", f"/api/v1/devices/{ATTACKER}").body
    last_seen = device.get("last_seen")
    assert last_seen is None or last_seen < time.time() + 2 * 86400, device
    listed = subprocess.run(
        [str(Path(sys.executable).parent / "fleetctl"), "devices", "list", "--server", fleet.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**_env(), "EDGEFLEET_API_TOKEN": OPERATOR_TOKEN},
    )
    assert listed.returncode == 0, listed.stderr
    assert ATTACKER in listed.stdout
    victims_report(fleet, ["v2"], beats=3, events=1)()


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def _get_raw(fleet: HostileFleet, path: str) -> bytes:
    import urllib.request

    req = urllib.request.Request(  # noqa: S310 (loopback)
        fleet.url + path, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
        data: bytes = resp.read()
        return data


def _get_page(fleet: HostileFleet, path: str) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(  # noqa: S310 (loopback)
        fleet.url + path, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


# -- class 6: the fleet owns its facts ---------------------------------------------------


def test_reported_labels_and_profile_never_replace_the_fleets(fleet: HostileFleet) -> None:
    atk = fleet.peer(ATTACKER)
    try:
        state = json.dumps(
            {
                "schema_version": 1,
                "device_id": ATTACKER,
                "kind": "state",
                "ts": time.time(),
                "profile": "jetson-orin-nano",
                "labels": {"line": "9", "site": "elsewhere", "canary": "true"},
            }
        ).encode()
        atk.publish(topics.state(ATTACKER), state, retain=True)
        topic, payload, _rid = heartbeat(ATTACKER)
        atk.publish(topic, payload)
    finally:
        atk.close()
    deadline = time.monotonic() + WAIT_S
    device: dict[str, Any] = {}
    while time.monotonic() < deadline:
        device = fleet.api("GET", f"/api/v1/devices/{ATTACKER}").body
        if device.get("reported_profile") == "jetson-orin-nano":
            break
        time.sleep(0.1)
    assert device["labels"] == ENROLLED_LABELS, device
    assert device["profile"] == ENROLLED_PROFILE, device
    assert device.get("reported_profile") == "jetson-orin-nano", device
    selected = fleet.api("GET", "/api/v1/devices?selector=line%3D9").body
    assert ATTACKER not in json.dumps(selected), selected


# -- class 8: decision ids are per device ------------------------------------------------


def test_a_device_cannot_pre_claim_another_devices_decision_id(fleet: HostileFleet) -> None:
    shared_id = f"claimed-{uuid.uuid4().hex[:12]}"
    atk = fleet.peer(ATTACKER)
    try:
        atk.publish(*decisions(ATTACKER, [decision_row(ATTACKER, shared_id, outcome="reject")]))
    finally:
        atk.close()
    fleet.wait_count(
        "SELECT count(*) FROM decisions WHERE id = ? AND device_id = ?",
        shared_id,
        ATTACKER,
        want=1,
    )
    victim = fleet.peer("v1")
    try:
        victim.publish(*decisions("v1", [decision_row("v1", shared_id, outcome="pass")]))
    finally:
        victim.close()
    got = fleet.wait_count(
        "SELECT count(*) FROM decisions WHERE id = ? AND device_id = 'v1'", shared_id, want=1
    )
    assert got == 1, "the victim's decision was not stored"
    outcome = fleet.query(
        "SELECT outcome FROM decisions WHERE id = ? AND device_id = 'v1'", shared_id
    )[0][0]
    assert outcome == "pass"


# -- class 7: size before read (HTTP) ----------------------------------------------------


def _raw_http(fleet: HostileFleet, head: bytes, body_chunks: Iterator[bytes]) -> bytes:
    port = int(fleet.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(head)
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
        except OSError:
            pass  # the server closed early: what a size-before-read server does
        sock.settimeout(WAIT_S)
        answer = b""
        try:
            while b"\r\n" not in answer:
                data = sock.recv(4096)
                if not data:
                    break
                answer += data
        except OSError:
            pass
    return answer


@pytest.mark.parametrize("path", ["/login", "/api/v1/enroll", "/logout"])
def test_an_oversized_body_is_refused_by_content_length_before_it_is_read(
    fleet: HostileFleet, path: str
) -> None:
    rss_before = fleet.rss_kib()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {512 * 1024 * 1024}\r\n\r\n"
    ).encode()
    answer = _raw_http(fleet, head, iter([b"{" * 65536]))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert fleet.rss_kib() - rss_before < 64 * 1024
    assert_healthy(fleet)


@pytest.mark.parametrize("path", ["/login", "/api/v1/enroll"])
def test_a_streamed_body_is_cut_at_the_limit_without_buffering_it(
    fleet: HostileFleet, path: str
) -> None:
    rss_before = fleet.rss_kib()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    block = b"a" * 65536
    chunk = f"{len(block):x}\r\n".encode() + block + b"\r\n"
    answer = _raw_http(fleet, head, iter([chunk] * 2048))  # 128 MiB offered
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert fleet.rss_kib() - rss_before < 64 * 1024
    assert_healthy(fleet)


# -- class 8: sign-in --------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"username":' + b"[" * DEEP + b"]" * DEEP + b"}",
        b'{"username":"a\\u0000","password":"x"}',
        b'{"username":"\\ud800","password":"\\udfff"}',
        b'{"username":"a","password":' + b"9" * 5000 + b"}",
        b"\xff\xfe",
        b"[]",
    ],
)
def test_a_malformed_sign_in_body_is_a_clear_4xx_never_a_500(
    fleet: HostileFleet, body: bytes
) -> None:
    from tests.fleet_server.fleet_api_support import http

    answer = http("POST", fleet.url + "/login", raw=body)
    assert 400 <= answer.status < 500, (answer.status, answer.body)
    assert isinstance(answer.body, dict)
    assert answer.body.get("detail")


def test_forged_forwarded_headers_do_not_escape_the_sign_in_throttle(
    fleet: HostileFleet,
) -> None:
    import urllib.error
    import urllib.request

    statuses = []
    for i in range(30):
        req = urllib.request.Request(  # noqa: S310 (loopback)
            fleet.url + "/login",
            data=json.dumps({"username": "admin", "password": f"guess-{i}"}).encode(),
            headers={"Content-Type": "application/json", "X-Forwarded-For": f"203.0.113.{i}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
                statuses.append(resp.status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)
    assert 429 in statuses, statuses
    assert 500 not in statuses


# -- class 9: quality records follow the fleet's facts -----------------------------------
# (the shadow gate's classes: tests/security/test_hostile_shadow_gate.py)

FOREIGN_LINES = ["2", "9", "", " 1", "1 ", "\uff11", "line-1", "1\u200b", "*"]


def _bucket(version: str, line: str, source: str) -> dict[str, Any]:
    bins = len(DRIFT_BINS["brightness"]) - 1
    return DriftHour(
        model_name="cls", model_version=version, line=line, source=source,
        hour=int(time.time()) // 60 * 60, period_s=60, n=50, outcomes={"pass": 50},
        top_class={"ok": 50}, hist={"brightness": [50 if i == 7 else 0 for i in range(bins)]},
    ).model_dump(mode="json")  # fmt: skip


def _quality(peer: Peer, device_id: str, message: Any) -> None:
    peer.publish(topics.quality(device_id), encode(message))


def _runs(peer: Peer, version: str) -> None:
    """The attacker reports a state running cls ``version`` (its own word, recorded)."""
    active = BundleRef(name="cls", version=version, release=1)
    state = ReportedState(device_id=ATTACKER, ts=time.time(), active=active)
    peer.publish(topics.state(ATTACKER), encode(state), retain=True)


@pytest.mark.parametrize("line", FOREIGN_LINES)
def test_drift_for_a_line_the_device_is_not_enrolled_on_is_refused(
    fleet: HostileFleet, line: str
) -> None:
    version = f"5.{FOREIGN_LINES.index(line)}.0"
    source = f"cam-{uuid.uuid4().hex[:8]}"
    before = fleet.quarantined()
    atk = fleet.peer(ATTACKER)
    try:
        _runs(atk, version)
        fleet.wait_count(
            "SELECT count(*) FROM events WHERE device_id = ? AND kind = 'state' "
            "AND payload LIKE ?", ATTACKER, f'%"{version}"%', want=1,
        )  # fmt: skip
        foreign = DriftBatch.model_validate(
            {"device_id": ATTACKER, "hours": [_bucket(version, line, source)]}
        )
        _quality(atk, ATTACKER, foreign)
        own = DriftBatch.model_validate(
            {"device_id": ATTACKER, "hours": [_bucket(version, ENROLLED_LABELS["line"], source)]}
        )
        _quality(atk, ATTACKER, own)  # the same device's bucket for its own line is kept
    finally:
        atk.close()
    stored = fleet.wait_count(
        "SELECT count(*) FROM drift_hours WHERE device_id = ? AND model_version = ? "
        "AND line = ?", ATTACKER, version, ENROLLED_LABELS["line"], want=1,
    )  # fmt: skip
    assert stored == 1
    fleet.wait_count("SELECT count(*) FROM quarantine", want=before + 1)
    assert (
        fleet.count(
            "SELECT count(*) FROM drift_hours WHERE device_id = ? AND line = ?", ATTACKER, line
        )
        == 0
    )
    reasons = [r for (r,) in fleet.query("SELECT reason FROM quarantine WHERE reason LIKE ?",
                                         f"%{source}%")]  # fmt: skip
    assert any(f"device {ATTACKER} is enrolled on line 1" in r for r in reasons), reasons


@pytest.mark.parametrize("kind", ["drift", "shadow"])
def test_a_single_decision_row_does_not_make_a_version_known(
    fleet: HostileFleet, kind: str
) -> None:
    version = "8.8.1" if kind == "drift" else "8.8.2"
    decision_id = f"known-{uuid.uuid4().hex[:12]}"
    atk = fleet.peer(ATTACKER)
    try:
        atk.publish(*decisions(ATTACKER, [decision_row(ATTACKER, decision_id,
                                                      model_version=version)]))  # fmt: skip
        fleet.wait_count("SELECT count(*) FROM decisions WHERE device_id = ? AND id = ?",
                         ATTACKER, decision_id, want=1)  # fmt: skip
        if kind == "drift":
            message: Any = DriftBatch.model_validate(
                {"device_id": ATTACKER, "hours": [_bucket(version, "1", "cam1")]}
            )
        else:
            record = shadow_record(decision_id, time.time(), agree=True, live_version=version,
                                   line="1")  # fmt: skip
            message = ShadowBatch(device_id=ATTACKER, records=[record])
        _quality(atk, ATTACKER, message)
    finally:
        atk.close()
    fleet.wait_count(
        "SELECT count(*) FROM quarantine WHERE reason LIKE ?",
        f"%{version} is unknown for device {ATTACKER}%", want=1,
    )  # fmt: skip
    assert fleet.count(
        "SELECT count(*) FROM drift_hours WHERE device_id = ? AND model_version = ?",
        ATTACKER, version,
    ) == 0  # fmt: skip
    assert fleet.count(
        "SELECT count(*) FROM shadow_results WHERE device_id = ? AND live_version = ?",
        ATTACKER, version,
    ) == 0  # fmt: skip
