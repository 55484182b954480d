"""What the remote action tests share: a signed repository and its file server on a
real Mosquitto, a real ``edge-agent run`` (supervisor, hot path, companion) on that
broker, and the fleet's side of the protocol (sign, publish, read the answers)."""

from __future__ import annotations

import base64
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.wire import topics
from agent.wire.actions import FINAL
from fleet_server.distribution.file_server import MqttFileServer
from fleet_server.repository import KeyStore, Passphrases, Repository
from fleet_server.repository.director import sign_action
from tests.support.broker import Broker, start_broker

BIN = Path(sys.executable).parent
PASSPHRASE = "remote actions test passphrase"  # noqa: S105 (generated keys, test only)
HELD_SECRET = "held-secret-9f2c71d04b"  # noqa: S105 (a test's made-up secret)
HELD_ENV = "EDGEFLEET_TEST_BROKER_PASSWORD"
PROFILE = "x86-gateway"
WAIT_S = 30.0
LISTENING = "remote actions: listening"


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


@dataclass
class Fleet:
    """The fleet's side: the signing repository, its file server, and a client that
    publishes requests and keeps every answer and chunk."""

    broker: Broker
    repo: Repository
    keys: KeyStore
    directory: Path
    counters: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    answers: list[dict[str, Any]] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    client: mqtt.Client | None = None

    def start(self) -> None:
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"fleet-{time.time_ns()}",
                        protocol=mqtt.MQTTv5)  # fmt: skip
        c.on_message = self._on_message
        c.connect(self.broker.host, self.broker.port)
        c.subscribe(f"{topics.PREFIX}/devices/+/actions/result", qos=1)
        c.subscribe(f"{topics.PREFIX}/devices/+/actions/chunk", qos=1)
        c.loop_start()
        self.client = c

    def stop(self) -> None:
        if self.client is not None:
            self.client.loop_stop()
            self.client.disconnect()

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        body = json.loads(msg.payload)
        with self._lock:
            (self.chunks if msg.topic.endswith("/chunk") else self.answers).append(body)

    def sign(
        self,
        device: str,
        action: str,
        params: dict[str, Any] | None = None,
        *,
        request_id: str | None = None,
        counter: int | None = None,
        expires_in: timedelta = timedelta(minutes=10),
        keys: KeyStore | None = None,
    ) -> tuple[str, bytes]:
        """(request id, signed request) with the next counter."""
        n = next(self.counters) if counter is None else counter
        rid = request_id or f"req-{n}-{time.time_ns() % 10**9}"
        expires = datetime.now(timezone.utc).replace(microsecond=0) + expires_in
        data = sign_action(
            self.repo, keys or self.keys, device_id=device, request_id=rid,
            action=action, params=params or {}, counter=n, expires=expires,
        )  # fmt: skip
        return rid, data

    def publish(
        self, device: str, data: bytes, *, retain: bool = True, expiry_s: int | None = None
    ) -> None:
        assert self.client is not None
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        if expiry_s is not None:
            props.MessageExpiryInterval = expiry_s
        info = self.client.publish(
            topics.action_request(device), data, qos=1, retain=retain, properties=props
        )
        info.wait_for_publish(10)

    def request(self, device: str, action: str, params: dict[str, Any] | None = None) -> str:
        rid, data = self.sign(device, action, params)
        self.publish(device, data)
        return rid

    def answers_of(self, rid: str) -> list[dict[str, Any]]:
        with self._lock:
            return [a for a in self.answers if a["request_id"] == rid]

    def final(self, rid: str, timeout_s: float = WAIT_S) -> dict[str, Any]:
        """The final answer (ok, refused, failed) to ``rid``."""

        def done() -> dict[str, Any] | None:
            finals = [a for a in self.answers_of(rid) if a["status"] in FINAL]
            return finals[-1] if finals else None

        answer: dict[str, Any] = wait_for(done, timeout_s, f"the final answer to {rid}")
        return answer

    def data_of(self, rid: str) -> bytes:
        with self._lock:
            mine = sorted(
                (c for c in self.chunks if c["request_id"] == rid), key=lambda c: c["seq"]
            )
        return b"".join(
            c["data"].encode() if c["encoding"] == "utf-8" else base64.b64decode(c["data"])
            for c in mine
        )


def make_fleet(directory: Path) -> tuple[Fleet, MqttFileServer]:
    """A broker, a signed repository served over it, and the fleet's client (started)."""
    (directory / "broker").mkdir(parents=True)
    broker = start_broker(directory / "broker")
    pp = Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE})
    keys = KeyStore.create(directory / "keys", root_keys=1, root_threshold=1, passphrases=pp)
    repo = Repository(directory / "repo")
    repo.init(keys)
    files = MqttFileServer(repo.path, broker.host, broker.port)
    files.start(10)
    fleet = Fleet(broker, repo, keys, directory)
    fleet.start()
    return fleet, files


def forged(directory: Path, device: str, action: str, request_id: str) -> bytes:
    """A request signed by another repository's director (a forger's keys, well formed
    in every other way)."""
    pp = Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE})
    keys = KeyStore.create(directory / "keys", root_keys=1, root_threshold=1, passphrases=pp)
    repo = Repository(directory / "repo")
    repo.init(keys)
    expires = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=10)
    return sign_action(
        repo, keys, device_id=device, request_id=request_id, action=action, params={},
        counter=10**6, expires=expires,
    )  # fmt: skip


@dataclass
class RunningAgent:
    """``edge-agent run`` on the fleet's broker (not enrolled: ``[bundles] mqtt``)."""

    directory: Path
    device: str
    config: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def state(self) -> Path:
        return self.directory / "state"

    @property
    def output(self) -> Path:
        return self.directory / "agent.out"

    def start(self) -> RunningAgent:
        env = {**os.environ, HELD_ENV: HELD_SECRET, **self.env}
        env.pop("CREDENTIALS_DIRECTORY", None)
        with self.output.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "edge-agent"), "run", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        listening = self._count("companion.log", LISTENING)
        wait_for(
            lambda: self._count("companion.log", LISTENING) > listening or self._dead(),
            WAIT_S,
            "the agent's remote actions",
        )
        return self

    def _count(self, name: str, marker: str) -> int:
        try:
            return (self.state / "logs" / name).read_text(errors="replace").count(marker)
        except OSError:
            return 0

    def _dead(self) -> bool:
        assert self.proc is not None
        assert self.proc.poll() is None, self.output.read_text(errors="replace")
        return False

    def hello(self) -> dict[str, Any] | None:
        """The running processes, from the supervisor's and children's log files: the
        companion's and hot path's pids of the newest start (None before both run)."""
        logs = self.state / "logs"
        hot = _last_pid(logs / "hotpath.log", "hotpath: pid ")
        comp = _last_pid(logs / "companion.log", "companion: pid ")
        return {"hotpath": hot, "companion": comp} if hot and comp else None

    def stop(self) -> int:
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(10)


def _last_pid(path: Path, marker: str) -> int | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    found = None
    for line in text.splitlines():
        if marker in line:
            word = line.split(marker, 1)[1].split(",", 1)[0].strip().split()[0]
            found = int(word) if word.isdigit() else found
    return found


def make_agent(fleet: Fleet, directory: Path, device: str, extra: str = "") -> RunningAgent:
    """An agent for ``device`` (not started) trusting the fleet's root."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "agent.toml"
    root = fleet.repo.path / "metadata" / "1.root.json"
    config.write_text(
        f'[agent]\ndevice_id = "{device}"\nstate_dir = "state"\nprofile = "{PROFILE}"\n'
        "[runtime]\nworkers = 1\npin = false\n[http]\nport = 0\n"
        f'[bundles]\nenabled = true\ninitial_root = "{root}"\n'
        f'mqtt = {{ host = "{fleet.broker.host}", port = {fleet.broker.port}, '
        f'username = "{device}", password_env = "{HELD_ENV}" }}\n'
        f"{extra}"
    )
    return RunningAgent(directory, device, config)
