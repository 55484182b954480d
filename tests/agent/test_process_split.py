"""The two processes of ``edge-agent run`` against real parts: a fleet-server with its
managed Mosquitto, agents enrolled over its API and run as subprocesses, the device's
SQLite decision log and the fleet's database read as they are. The companion SIGKILLed
in the middle of a drain loses and doubles nothing; the hot path SIGKILLed is restarted,
reported and leaves its log intact; the control channel refuses what is malformed and
changes nothing."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.control.client import ControlClient
from agent.control.protocol import MAX_REQUEST_BYTES
from agent.decisionlog.connection import connect_reader
from agent.enrollment.identity import Identity
from hil.linkproxy import LinkProxy
from hil.procs import agent_children, descendants
from tests.agent.installer.installer_helpers import make_bundle
from tests.fleet_server import test_fleet_e2e as e2e
from tests.fleet_server.fleet_api_support import OPERATOR_TOKEN, PASSPHRASE, TOKEN_ENV, http
from tests.support.broker import free_port

BIN = Path(sys.executable).parent
PROFILE = "x86-gateway"
SIGKILL_EXIT = "killed by signal 9 (SIGKILL)"


@dataclass(frozen=True)
class Fleet:
    """The served fleet-server: its URL, a bundle, its SQLite database."""

    url: str
    bundle: Path
    db: Path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The fleet end to end test's fleet-server with its managed Mosquitto, one for the
    module: each test enrolls a device of its own and reads only that device's rows."""
    root = tmp_path_factory.mktemp("fleet")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CREDENTIALS_DIRECTORY", raising=False)
        mp.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
        mp.setenv(TOKEN_ENV, OPERATOR_TOKEN)
        with e2e.served_fleet(root) as (url, bundle):
            yield Fleet(url, bundle, root / "state" / "fleet.db")


def _wait(cond: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    """A bound on a wait, not a timing: fails only when ``cond`` never holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


# -- the device -------------------------------------------------------------------------


class Device:
    """One agent's directory: its config, state and log, and ``edge-agent run``."""

    def __init__(self, root: Path, device_id: str, bundle: Path, *, fps: float) -> None:
        self.dir = root / device_id
        self.dir.mkdir()
        self.device_id = device_id
        self.bundle = bundle
        self.fps = fps
        self.config = self.dir / "agent.toml"
        self.state = self.dir / "state"
        self.http_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.write_config()

    @property
    def log_path(self) -> Path:
        return self.state / "decisions.db"

    def write_config(self, uplink: str = "") -> None:
        self.config.write_text(
            f'[agent]\ndevice_id = "{self.device_id}"\nstate_dir = "state"\n'
            f'profile = "{PROFILE}"\n'
            "[runtime]\nworkers = 1\npin = false\n"
            f"[http]\nport = {self.http_port}\n"
            '[decision_log]\nthumbnails = "none"\nflush_interval_s = 0.1\n'
            + (f"[uplink]\n{uplink}" if uplink else "")
            + f'[[cameras]]\nname = "c1"\nkind = "synthetic"\nfps = {self.fps}\n'
            f'[[pipelines]]\nname = "p"\nsource = "c1"\nbundle = "{self.bundle}"\n'
        )

    def enroll(self, url: str) -> Identity:
        token = http(
            "POST",
            f"{url}/api/v1/devices/{self.device_id}/tokens",
            {"labels": {"line": "3"}, "profile": PROFILE},
            token=OPERATOR_TOKEN,
        ).body["token"]
        enrolled = subprocess.run(
            [str(BIN / "edge-agent"), "enroll", url, "--token", "-", "--config", str(self.config)],
            input=token.encode(),
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert enrolled.returncode == 0, enrolled.stderr
        identity = Identity.load(self.state)
        assert identity is not None
        return identity

    def start(self) -> None:
        with (self.dir / "agent.log").open("wb") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "edge-agent"), "run", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> int:
        """SIGTERM the supervisor; its exit code (SIGKILL to the group after a bound)."""
        proc = self.proc
        assert proc is not None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            raise AssertionError("the supervisor did not stop within 30 s") from None

    def alive(self) -> bool:
        assert self.proc is not None
        assert self.proc.poll() is None, (self.dir / "agent.log").read_text(errors="replace")
        return True

    def children(self) -> dict[str, int]:
        """The supervisor's children by role (``python -m agent.child ROLE``)."""
        assert self.proc is not None
        return agent_children(self.proc.pid)

    def child(self, role: str) -> int | None:
        return self.children().get(role)

    def rows(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        if not self.log_path.is_file():
            return []
        conn = connect_reader(self.log_path)
        try:
            return list(conn.execute(sql, params))
        finally:
            conn.close()

    def count(self) -> int:
        """Rows in the log (0 before the hot path has made it)."""
        try:
            return int(self.rows("SELECT count(*) FROM decisions")[0][0])
        except (IndexError, sqlite3.OperationalError):  # no file, or no table yet
            return 0

    def between(self, t0: float, t1: float) -> int:
        """Decisions made between two wall-clock times."""
        sql = "SELECT count(*) FROM decisions WHERE decision_time > ? AND decision_time < ?"
        return int(self.rows(sql, t0, t1)[0][0])

    def healthz(self) -> dict[str, Any] | None:
        url = f"http://127.0.0.1:{self.http_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                body: dict[str, Any] = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 503: answered, not healthy
            body = json.loads(exc.read())
        except OSError:
            return None
        return body

    def socket_path(self) -> Path:
        """The control socket the supervisor gave the hot path."""
        pid = self.child("hotpath")
        assert pid is not None
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        for item in environ:
            if item.startswith(b"EDGEFLEET_CONTROL_SOCKET="):
                return Path(item.split(b"=", 1)[1].decode())
        raise AssertionError("the hot path has no control socket in its environment")


@pytest.fixture
def devices(tmp_path: Path) -> Iterator[list[Device]]:
    """The devices a test makes; each still running at the end is stopped and must exit 0."""
    made: list[Device] = []
    yield made
    for device in made:
        if device.proc is not None:
            assert device.stop() == 0, (device.dir / "agent.log").read_text(errors="replace")


def _fleet_rows(fleet: Fleet, sql: str, *params: object) -> list[tuple[Any, ...]]:
    path = fleet.db
    if not path.is_file():
        return []
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=10)
    try:
        return list(conn.execute(sql, params))
    finally:
        conn.close()


def _fleet_ids(fleet: Fleet, device_id: str) -> list[str]:
    rows = _fleet_rows(fleet, "SELECT id FROM decisions WHERE device_id = ?", device_id)
    return [str(r[0]) for r in rows]


# -- 1. the companion SIGKILLed in the middle of a drain ----------------------------------

BACKLOG = 40
DRAIN = (
    'drain_pacing = "fixed"\ndrain_rate_per_s = 1.0\ndecisions_batch = 5\n'
    "decisions_interval_s = 0.2\nreconnect_max_s = 1\nheartbeat_interval_s = 0.5\n"
    "health_interval_s = 30.0\n"
)


def test_the_companion_killed_mid_drain_is_restarted_and_every_decision_arrives_once(
    tmp_path: Path, fleet: Fleet, devices: list[Device]
) -> None:
    url, bundle = fleet.url, fleet.bundle
    dev = Device(tmp_path, "split-drain", bundle, fps=4)
    devices.append(dev)
    identity = dev.enroll(url)
    link = LinkProxy(identity.broker_host, identity.broker_port).start()
    link.cut()  # the device's link to the fleet is down from the start
    try:
        dev.write_config(f"enabled = true\nbroker_port = {link.port}\n{DRAIN}")
        dev.start()
        _wait(lambda: dev.alive() and dev.count() >= BACKLOG, 90, f"{BACKLOG} decisions offline")
        assert _fleet_ids(fleet, dev.device_id) == []
        backlog = dev.count()

        link.restore()
        # one batch of 5 a second against 4 decisions a second: several seconds to drain
        _wait(lambda: len(_fleet_ids(fleet, dev.device_id)) > 0, 60, "the drain to start")
        companion = dev.child("companion")
        assert companion is not None
        arrived = len(_fleet_ids(fleet, dev.device_id))
        t_kill = time.time()
        os.kill(companion, signal.SIGKILL)
        assert 0 < arrived < backlog, "the kill must come in the middle of the drain"

        # the line decides while the companion is down; the supervisor starts a new one
        _wait(lambda: dev.child("companion") not in (None, companion), 30, "a new companion")
        t_back = time.time()
        assert dev.child("hotpath") is not None
        _wait(
            lambda: dev.between(t_kill, t_back) > 0,
            10,
            "decisions made while the companion was down to be in the log",
        )

        # a cut-off after the restart: everything logged up to it reaches the fleet
        _wait(lambda: dev.count() > backlog, 30, "decisions after the restart")
        cutoff = {str(r[0]) for r in dev.rows("SELECT id FROM decisions")}
        _wait(
            lambda: cutoff <= set(_fleet_ids(fleet, dev.device_id)),
            120,
            f"the {len(cutoff)} decisions up to the cut-off at the fleet",
        )
        dev.alive()
        logged = {str(r[0]) for r in dev.rows("SELECT id FROM decisions")}
        stored = _fleet_ids(fleet, dev.device_id)
        assert len(stored) == len(set(stored)), "a decision stored twice"
        assert set(stored) <= logged, "the fleet has decisions the device never logged"
        twice = _fleet_rows(
            fleet,
            "SELECT id, count(*) FROM decisions WHERE device_id = ? GROUP BY id "
            "HAVING count(*) > 1",
            dev.device_id,
        )
        assert twice == []

        # and the device knows it: no row of the cut-off left queued or waiting
        def all_marked() -> bool:
            waiting = dev.rows("SELECT id FROM decisions WHERE uploaded != 1")
            return not cutoff & {str(r[0]) for r in waiting}

        _wait(all_marked, 30, "the device to mark the cut-off's decisions uploaded")
    finally:
        link.close()


# -- 2. the hot path SIGKILLed ------------------------------------------------------------


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_hot_path_killed_is_restarted_reported_and_its_log_is_intact(
    tmp_path: Path, fleet: Fleet, devices: list[Device]
) -> None:
    url, bundle = fleet.url, fleet.bundle
    dev = Device(tmp_path, "split-crash", bundle, fps=5)
    devices.append(dev)
    dev.enroll(url)
    dev.write_config("enabled = true\nheartbeat_interval_s = 0.5\nhealth_interval_s = 1.0\n")
    dev.start()
    _wait(lambda: dev.alive() and dev.count() >= 10, 90, "decisions")

    def seen_by_companion() -> bool:
        body = dev.healthz()
        return body is not None and body["hotpath_process"]["pid"] == dev.child("hotpath")

    _wait(seen_by_companion, 60, "the companion to see the hot path")
    old = dev.child("hotpath")
    assert old is not None
    client = ControlClient(dev.socket_path())
    try:
        workers = set(client.call("status")["worker_pids"])
    finally:
        client.close()
    assert workers
    assert workers <= descendants(old)
    before = dev.count()
    t_kill = time.time()
    os.kill(old, signal.SIGKILL)

    counts = [before]

    def deciding_again() -> bool:
        counts.append(dev.count())
        return dev.between(t_kill, time.time() + 3600) > 0

    _wait(deciding_again, 60, "decisions from the restarted hot path")
    new = dev.child("hotpath")
    assert new not in (None, old)
    # the killed hot path's pool workers went with it
    _wait(lambda: not any(_running(w) for w in workers), 30, "the old pool workers to exit")

    def reported() -> list[tuple[Any, ...]]:
        return _fleet_rows(
            fleet,
            "SELECT event_id, payload FROM events WHERE device_id = ? AND kind = 'crash'",
            dev.device_id,
        )

    _wait(lambda: len(reported()) > 0, 60, "the crash event at the fleet")
    [(event_id, raw)] = reported()
    payload = json.loads(raw)
    assert payload["process"] == "hotpath"
    assert payload["starts"] == 2
    assert payload["last_exit"] == SIGKILL_EXIT
    assert payload["pid"] == new
    client = ControlClient(dev.socket_path())
    try:
        hello = client.call("hello")
    finally:
        client.close()
    assert event_id == f"crash-hotpath-{hello['boot']}"

    def healthz_shows_the_restart() -> bool:
        body = dev.healthz()
        return body is not None and body["hotpath_process"]["pid"] == new

    _wait(healthz_shows_the_restart, 30, "/healthz to show the new hot path")
    body = dev.healthz()
    assert body is not None
    assert body["hotpath_process"] == {"pid": new, "starts": 2, "last_exit": SIGKILL_EXIT}
    assert body["status"] == "ok", body

    counts.append(dev.count())
    assert all(a <= b for a, b in itertools.pairwise(counts)), counts
    assert counts[-1] > before
    assert dev.rows("PRAGMA integrity_check") == [("ok",)]
    dev.alive()


# -- 3. the control channel refuses what is malformed -------------------------------------

_HEADER = struct.Struct(">I")


def _send(
    sock: socket.socket, body: bytes, *, announce: int | None = None
) -> dict[str, Any] | None:
    """Send one frame (its length prefix ``announce`` when given, the body's otherwise);
    the answer, or None when the hot path closed the connection."""
    sock.sendall(_HEADER.pack(len(body) if announce is None else announce) + body)
    header = sock.recv(_HEADER.size, socket.MSG_WAITALL)
    if not header:
        return None
    (size,) = _HEADER.unpack(header)
    answer: dict[str, Any] = json.loads(sock.recv(size, socket.MSG_WAITALL))
    return answer


def _request(op: object, args: object = None) -> bytes:
    message: dict[str, object] = {"op": op}
    if args is not None:
        message["args"] = args
    return json.dumps(message).encode()


def test_the_control_channel_refuses_malformed_frames_and_nothing_changes(
    tmp_path: Path, devices: list[Device]
) -> None:
    dev = Device(tmp_path, "split-ctl", make_bundle(tmp_path).path, fps=5)
    devices.append(dev)
    dev.start()
    _wait(lambda: dev.alive() and dev.count() > 0, 90, "decisions")
    _wait(lambda: dev.child("companion") is not None, 30, "the companion")
    path = dev.socket_path()
    client = ControlClient(path, timeout_s=10)
    try:
        hello = client.call("hello")
        pids = client.call("status")["worker_pids"]
    finally:
        client.close()
    assert pids

    def refused(answer: dict[str, Any] | None, *words: str) -> str:
        assert answer is not None, "the connection was closed instead of an answer"
        assert answer["ok"] is False, answer
        error = str(answer["error"])
        for word in words:
            assert word in error, error
        return error

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        refused(_send(sock, b"{not json"), "not JSON")
        refused(_send(sock, b"\xff\xfe"), "not JSON", "UTF-8")
        refused(_send(sock, b"[1, 2]"), "not an object")
        refused(_send(sock, _request("shutdown")), "unknown operation 'shutdown'", "reload")
        refused(_send(sock, _request(7)), "unknown operation 7")
        refused(_send(sock, _request("alarms", {"max": "all"})), "alarms", "'max'", "int")
        refused(_send(sock, _request("alarms", {})), "alarms", "'max'", "missing")
        refused(_send(sock, _request("reload", {"now": True})), "reload", "unknown argument", "now")
        refused(_send(sock, _request("reload", [])), "reload", "args must be an object")
        # the connection outlives what it refused: a good request is still answered
        answer = _send(sock, _request("hello"))
        assert answer is not None
        assert answer["ok"] is True
        assert answer["result"]["boot"] == hello["boot"]
        # a frame over the limit is refused unread, and that connection is closed
        over = MAX_REQUEST_BYTES + 1
        refused(
            _send(sock, b"", announce=over),
            f"{over} bytes",
            f"over the limit of {MAX_REQUEST_BYTES} bytes",
        )
        assert sock.recv(1) == b""

    # nothing changed: the same hot path and pool (no reload), and it goes on deciding
    count = dev.count()
    _wait(lambda: dev.count() > count, 30, "decisions after the refusals")
    client = ControlClient(path, timeout_s=10)
    try:
        after = client.call("hello")
        assert client.call("status")["worker_pids"] == pids
    finally:
        client.close()
    assert (after["boot"], after["pid"], after["starts"]) == (
        hello["boot"],
        hello["pid"],
        hello["starts"],
    )
    assert dev.child("hotpath") == hello["pid"]
    dev.alive()
