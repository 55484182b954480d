"""The remote actions bench (``hil bench remote``): what device logs and remote actions
cost a device, idle and in use.

A real ``edge-agent run`` (supervisor, hot path, companion) on a loopback Mosquitto with
the fleet's signed repository served over it (the plain broker of ``[bundles] mqtt``: no
TLS, which the device pays for every message alike), and this process as the fleet: it
signs requests with the director key, publishes them retained, and counts every byte of
the answers and chunks it receives.

- **Idle**: the CPU of all the agent's processes over ``--idle`` seconds with remote
  actions on (and the rotating log files written) against the same agent with
  ``[remote] enabled = false`` and ``[logs] file = "never"``; the difference is their
  idle cost.
- **In use**: per action, the companion's CPU (``/proc/<pid>/stat``) from the request to
  its final answer, the wall time, and the MQTT payload bytes the device sent (answers and
  chunks): a logs request of ``--lines`` lines out of a log of ``--log-lines`` lines, the
  same holding a text, a diagnostics archive, ``--follow`` seconds of following a log
  written to at 10 lines a second (CPU per second), a restart and a reload (the time
  until the new companion answered).

Example::

    python -m hil.bench.remote --idle 30 --json .cache/bench-remote.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from agent.wire import topics
from fleet_server.distribution.file_server import MqttFileServer
from fleet_server.repository import KeyStore, Passphrases, Repository
from fleet_server.repository.director import sign_action
from hil.loopback import start_broker

DEVICE = "bench-1"
PASSPHRASE = "remote bench passphrase"  # noqa: S105 (generated keys, bench only)
TICK_S = os.sysconf("SC_CLK_TCK")
FINAL = ("ok", "refused", "failed")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK_S


def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        todo += [int(c) for c in children]
    return found


@dataclass
class Fleet:
    """Signs, publishes, and keeps what comes back with its size."""

    repo: Repository
    keys: KeyStore
    host: str
    port: int
    counter: int = 0
    got: list[tuple[float, str, dict[str, Any], int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    client: Any = None

    def start(self) -> None:
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-fleet", protocol=mqtt.MQTTv5)
        c.on_message = self._on
        c.connect(self.host, self.port)
        c.subscribe(f"{topics.PREFIX}/devices/+/actions/#", qos=1)
        c.loop_start()
        self.client = c

    def _on(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.topic.endswith("/request"):
            return
        with self.lock:
            self.got.append(
                (time.monotonic(), msg.topic, json.loads(msg.payload), len(msg.payload))
            )

    def ask(self, action: str, params: dict[str, Any]) -> str:
        self.counter += 1
        rid = f"bench-{self.counter}-{time.time_ns() % 10**6}"
        expires = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=10)
        data = sign_action(
            self.repo,
            self.keys,
            device_id=DEVICE,
            request_id=rid,
            action=action,
            params=params,
            counter=self.counter,
            expires=expires,
        )
        self.client.publish(
            topics.action_request(DEVICE), data, qos=1, retain=True
        ).wait_for_publish(10)
        return rid

    def final(self, rid: str, timeout_s: float = 120.0) -> tuple[dict[str, Any], float]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                done = [
                    (t, m)
                    for t, _, m, _ in self.got
                    if m.get("request_id") == rid
                    and m.get("kind") == "action_result"
                    and m["status"] in FINAL
                ]
            if done:
                return done[-1][1], done[-1][0]
            time.sleep(0.02)
        raise TimeoutError(f"no final answer to {rid} in {timeout_s:g} s")

    def sent(self, rid: str) -> tuple[int, int]:
        """(messages, payload bytes) the device sent for ``rid``."""
        with self.lock:
            mine = [n for _, _, m, n in self.got if m.get("request_id") == rid]
        return len(mine), sum(mine)


class Agent:
    def __init__(self, directory: Path, config: str) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "agent.toml").write_text(config)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, settle_s: float = 12.0) -> None:
        """Start it and wait until its companion runs and ``settle_s`` more (the standby
        hot path starts 5 s after the hot path: its imports must not count as idle)."""
        exe = Path(sys.executable).parent / "edge-agent"
        out = (self.dir / "agent.out").open("ab")
        self.proc = subprocess.Popen(
            [str(exe), "run", "--config", str(self.dir / "agent.toml")],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "companion started" not in self._out():
            time.sleep(0.1)
        time.sleep(settle_s)

    def _out(self) -> str:
        try:
            return (self.dir / "agent.out").read_text(errors="replace")
        except OSError:
            return ""

    def companion(self) -> int | None:
        try:
            text = (self.dir / "state" / "logs" / "companion.log").read_text(errors="replace")
        except OSError:
            text = ""
        if "remote actions: listening" not in text and "companion: pid" not in text:
            return None
        pids = [
            int(x.split("companion: pid ")[1].split(",")[0])
            for x in text.splitlines()
            if "companion: pid " in x
        ]
        return pids[-1] if pids else None

    def total_cpu(self) -> float:
        assert self.proc is not None
        return sum(cpu_s(p) for p in tree_pids(self.proc.pid))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def config(root: Path, host: str, port: int, *, remote: bool) -> str:
    extra = "" if remote else '[remote]\nenabled = false\n[logs]\nfile = "never"\n'
    return (
        f'[agent]\ndevice_id = "{DEVICE}"\nstate_dir = "state"\nprofile = "x86-gateway"\n'
        "[runtime]\nworkers = 1\npin = false\n[http]\nport = 0\n"
        f'[bundles]\nenabled = true\ninitial_root = "{root}"\n'
        f'mqtt = {{ host = "{host}", port = {port} }}\n{extra}'
    )


def idle_cpu(agent: Agent, seconds: float) -> float:
    before = agent.total_cpu()
    time.sleep(seconds)
    return (agent.total_cpu() - before) / seconds


def measure(fleet: Fleet, agent: Agent, action: str, params: dict[str, Any]) -> dict[str, Any]:
    pid = agent.companion()
    assert pid is not None
    cpu0, t0 = cpu_s(pid), time.monotonic()
    rid = fleet.ask(action, params)
    answer, at = fleet.final(rid)
    messages, payload = fleet.sent(rid)
    return {
        "action": action,
        "params": params,
        "status": answer["status"],
        "reason": answer["reason"],
        "wall_s": round(at - t0, 3),
        "companion_cpu_s": round(cpu_s(pid) - cpu0, 4)
        if action in ("logs", "diagnostics")
        else None,
        "messages": messages,
        "payload_bytes": payload,
        "data_bytes": answer.get("bytes", 0),
    }


def fill_log(agent: Agent, lines: int) -> None:
    """A rotated hot path file of ``lines`` lines, as a busy day writes them."""
    path = agent.dir / "state" / "logs" / "hotpath.log.1"
    now = time.time() - 600
    with path.open("w", encoding="utf-8") as f:
        for i in range(lines):
            ts = now + i * 0.05
            stamp = (
                time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
                + f".{int(ts * 1000) % 1000:03d}Z"
            )
            f.write(
                f"{stamp} hotpath INFO agent.pipeline.runner: pipeline p1: decision {i:07d} "
                f"reject score 0.{i % 97:02d} camera c1 frame {i * 3} (line 3, station s1)\n"
            )


def follow_cpu(fleet: Fleet, agent: Agent, seconds: int) -> dict[str, Any]:
    pid = agent.companion()
    assert pid is not None
    stop = threading.Event()

    def writer() -> None:
        path = agent.dir / "state" / "logs" / "hotpath.log"
        while not stop.wait(0.1):
            with path.open("a", encoding="utf-8") as f:
                now = time.time()
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".000Z"
                f.write(f"{stamp} hotpath INFO agent.bench: a line written while followed\n")

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    cpu0 = cpu_s(pid)
    rid = fleet.ask("logs", {"lines": 10, "since_s": 60, "follow_s": seconds})
    answer, _ = fleet.final(rid, timeout_s=seconds + 60)
    stop.set()
    messages, payload = fleet.sent(rid)
    return {
        "action": "logs --follow",
        "follow_s": seconds,
        "status": answer["status"],
        "companion_cpu_s_per_s": round((cpu_s(pid) - cpu0) / seconds, 5),
        "messages": messages,
        "payload_bytes": payload,
        "lines": answer["detail"].get("lines"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hil bench remote", description=__doc__.split("\n")[0])
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measured")
    parser.add_argument("--lines", type=int, default=500, help="lines a logs request asks")
    parser.add_argument("--log-lines", type=int, default=20_000, help="lines in the log read")
    parser.add_argument("--follow", type=int, default=10, help="seconds of following")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    (work / "broker").mkdir()
    broker = start_broker(work / "broker")
    pp = Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE})
    keys = KeyStore.create(work / "keys", root_keys=1, root_threshold=1, passphrases=pp)
    repo = Repository(work / "repo")
    repo.init(keys)
    files = MqttFileServer(repo.path, broker.host, broker.port)
    files.start(10)
    fleet = Fleet(repo, keys, broker.host, broker.port)
    fleet.start()
    root = repo.path / "metadata" / "1.root.json"
    report: dict[str, Any] = {"device": "this machine", "cpus": os.cpu_count()}
    try:
        off = Agent(work / "off", config(root, broker.host, broker.port, remote=False))
        off.start()
        report["idle_cpu_s_per_s_without"] = round(idle_cpu(off, args.idle), 5)
        off.stop()
        agent = Agent(work / "on", config(root, broker.host, broker.port, remote=True))
        agent.start()
        report["idle_cpu_s_per_s_with"] = round(idle_cpu(agent, args.idle), 5)
        fill_log(agent, args.log_lines)
        rows = [
            measure(fleet, agent, "logs", {"lines": args.lines, "since_s": 3600}),
            measure(
                fleet,
                agent,
                "logs",
                {"lines": args.lines, "since_s": 3600, "grep": "reject score 0.42"},
            ),
            measure(fleet, agent, "diagnostics", {"lines": 200}),
            follow_cpu(fleet, agent, args.follow),
            measure(fleet, agent, "restart", {}),
        ]
        time.sleep(3.0)
        rows.append(measure(fleet, agent, "reload", {}))
        report["actions"] = rows
        agent.stop()
    finally:
        fleet.client.loop_stop()
        files.stop()
        broker.stop()
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
