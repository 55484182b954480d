"""A running ``fleet-server serve`` (managed TLS Mosquitto, SQLite) with enrolled devices,
for the hostile-device suite: one device is the attacker, the others are its victims.

Each device is enrolled the way a real one is (a one-time token from the operator API,
a CSR whose key never leaves the "device", the certificate from ``POST /api/v1/enroll``),
so the attacker holds exactly what one enrolled device holds and nothing else. Counts are
read from the fleet database (SQLite, read-only) and every wait is bounded.
"""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.kernel.clientid import secret_client_id
from agent.wire import topics
from agent.wire.enroll import ENROLL_PATH
from agent.wire.messages import (
    DecisionRow,
    DecisionUpload,
    Event,
    Heartbeat,
    encode,
)
from fleet_server.ca import make_device_key_and_csr
from tests.fleet_server.fleet_api_support import OPERATOR_TOKEN, http
from tests.fleet_server.test_fleet_serve import write_config
from tests.support.broker import free_port
from tests.support.tls_peers import Peer

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
STORE_TIMEOUT_S = 30.0
ENROLLED_LABELS = {"line": "1", "site": "plant-a"}
ENROLLED_PROFILE = "x86-gateway"
_seq = itertools.count(1)


@dataclass
class Identity:
    device_id: str
    cert: Path
    key: Path


@dataclass
class HostileFleet:
    """The server process, its URLs and files, and the enrolled devices' identities."""

    proc: subprocess.Popen[bytes]
    url: str
    mqtt_port: int
    state: Path
    log: Path
    ca_file: Path
    devices: dict[str, Identity]

    @property
    def db(self) -> Path:
        return self.state / "fleet.db"

    def peer(self, device_id: str, client_id: str | None = None) -> Peer:
        """A connected MQTT client holding ``device_id``'s certificate, with the client id
        the agent's uplink uses unless ``client_id`` is given."""
        ident = self.devices[device_id]
        cid = client_id or secret_client_id(f"{device_id}-uplink", ident.key)
        peer = Peer(self.mqtt_port, self.ca_file, ident.cert, ident.key, cid)
        assert peer.connect(), f"{device_id} could not connect"
        return peer

    def healthz(self) -> tuple[int, dict[str, Any]]:
        answer = http("GET", self.url + "/healthz")
        return answer.status, answer.body

    def api(self, method: str, path: str, body: Any = None) -> Any:
        return http(method, self.url + path, body, token=OPERATOR_TOKEN)

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
        try:
            return con.execute(sql, args).fetchall()
        finally:
            con.close()

    def count(self, sql: str, *args: Any) -> int:
        return int(self.query(sql, *args)[0][0])

    def wait_count(self, sql: str, *args: Any, want: int) -> int:
        """The count once it reaches ``want`` (or what it is after the bound)."""
        deadline = time.monotonic() + STORE_TIMEOUT_S
        got = self.count(sql, *args)
        while got < want and time.monotonic() < deadline:
            assert self.proc.poll() is None, f"fleet-server exited: {self.log.read_text()}"
            time.sleep(0.1)
            got = self.count(sql, *args)
        return got

    def quarantined(self) -> int:
        return self.count("SELECT count(*) FROM quarantine")

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


def _wait_healthy(fleet_url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"fleet-server exited {proc.returncode}: {log.read_text()}"
        try:
            if http("GET", fleet_url + "/healthz").status == 200:
                return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"not healthy within {START_TIMEOUT_S} s: {log.read_text()}")


def enroll(fleet_url: str, device_id: str, directory: Path) -> tuple[Identity, str]:
    """Enroll ``device_id`` as a real agent does; its identity and the CA's PEM."""
    token = http(
        "POST",
        f"{fleet_url}/api/v1/devices/{device_id}/tokens",
        {"labels": ENROLLED_LABELS, "profile": ENROLLED_PROFILE},
        token=OPERATOR_TOKEN,
    )
    assert token.status == 201, token.body
    key_pem, csr_pem = make_device_key_and_csr(device_id)
    answer = http(
        "POST",
        fleet_url + ENROLL_PATH,
        {"token": token.body["token"], "csr": csr_pem.decode()},
    )
    assert answer.status == 200, answer.body
    key, cert = directory / f"{device_id}.key", directory / f"{device_id}.crt"
    key.write_bytes(key_pem)
    key.chmod(0o600)
    cert.write_text(answer.body["certificate"])
    return Identity(device_id, cert, key), answer.body["ca"]


def serve(directory: Path, repo: Path, keys: Path, device_ids: list[str]) -> Iterator[HostileFleet]:
    """Start fleet-server, enroll ``device_ids``, yield; SIGTERM at the end."""
    api, mqtt = free_port(), free_port()
    config = write_config(directory, (repo, keys), api, mqtt)
    log = directory / "serve.log"
    env = dict(os.environ)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet_server.cli.server", "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=directory,
        )
    url = f"http://127.0.0.1:{api}"
    try:
        _wait_healthy(url, proc, log)
        ids = directory / "identities"
        ids.mkdir()
        devices: dict[str, Identity] = {}
        ca_pem = ""
        for device_id in device_ids:
            devices[device_id], ca_pem = enroll(url, device_id, ids)
        ca_file = ids / "ca.crt"
        ca_file.write_text(ca_pem)
        yield HostileFleet(proc, url, mqtt, directory / "state", log, ca_file, devices)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)


# -- what a well-behaved device sends --------------------------------------------------


def heartbeat(device_id: str) -> tuple[str, bytes, str]:
    """(topic, payload, record id) of a fresh heartbeat."""
    beat = Heartbeat(device_id=device_id, seq=next(_seq), ts=time.time())
    return topics.heartbeat(device_id), encode(beat), beat.record_id


def event(device_id: str, payload: dict[str, Any] | None = None) -> tuple[str, bytes, str]:
    """(topic, payload, event id) of a fresh alarm event."""
    ev = Event(
        device_id=device_id,
        kind="alarm",
        event_id=f"ev-{uuid.uuid4().hex}",
        ts=time.time(),
        payload=payload or {"alarm": "test"},
    )
    return topics.events(device_id), encode(ev), ev.event_id


def decision_row(device_id: str, decision_id: str, **overrides: Any) -> DecisionRow:
    now = time.time()
    fields: dict[str, Any] = {
        "id": decision_id,
        "capture_time": now - 0.01,
        "decision_time": now,
        "device_id": device_id,
        "source": "cam1",
        "line": "1",
        "model_name": "cls",
        "model_version": "1.0.0",
        "bundle_digest": "sha256:" + "0" * 64,
        "backend": "onnxruntime",
        "config_hash": "c" * 16,
        "input_digest": "d" * 16,
        "outputs": {"top": [{"label": "ok", "score": 0.9}]},
        "outcome": "pass",
        "thresholds": {},
        "latencies_ms": {"total": 1.0},
        "e2e_ms": 1.0,
    }
    fields.update(overrides)
    return DecisionRow.model_validate(fields)


def decisions(device_id: str, rows: list[DecisionRow]) -> tuple[str, bytes]:
    return topics.decisions(device_id), encode(DecisionUpload(device_id=device_id, rows=rows))


def victims_report(
    fleet: HostileFleet, victims: list[str], beats: int = 10, events: int = 2
) -> Callable[[], None]:
    """Each victim sends ``beats`` heartbeats and ``events`` events (PUBACK success
    each); returns a check that every one is stored exactly once."""
    expected: list[tuple[str, str, str]] = []
    for device_id in victims:
        peer = fleet.peer(device_id)
        try:
            for _ in range(beats):
                topic, payload, rid = heartbeat(device_id)
                rc = peer.publish(topic, payload)
                assert not rc.is_failure, f"{device_id}: heartbeat refused: {rc}"
                expected.append(("heartbeats", device_id, rid))
            for _ in range(events):
                topic, payload, eid = event(device_id)
                rc = peer.publish(topic, payload)
                assert not rc.is_failure, f"{device_id}: event refused: {rc}"
                expected.append(("events", device_id, eid))
        finally:
            peer.close()

    def check() -> None:
        for table, device_id, rid in expected:
            column = "event_id" if table == "events" else "record_id"
            sql = f"SELECT count(*) FROM {table} WHERE device_id = ? AND {column} = ?"  # noqa: S608
            got = fleet.wait_count(sql, device_id, rid, want=1)
            assert got == 1, f"{table} {rid} of {device_id} stored {got} times"

    return check
