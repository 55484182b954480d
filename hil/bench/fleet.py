"""The fleet scale bench (``make bench``): a fleet server in this process, N light agents
with real TLS identities on its managed Mosquitto, heartbeats at 1/s each while a
rollout goes across all of them.

Each light agent enrolls through the API (one-time token, EC key and CSR made here),
connects with its own certificate, publishes a retained reported state, sends a
heartbeat every second (QoS 1) and answers a directive the way the real agent reports
an install: an ``install`` event (outcome ``committed``, step ``commit``) and a new
state whose ``active`` is the assigned bundle. The agents run in a few spawned child
processes, each driving its clients from one thread (``client.loop(timeout=0)`` in
turn). :func:`bench_fleet` returns the figures: heartbeats sent (acknowledged by the
broker) and stored, lost and duplicated, ingest messages per second per worker and the
rollout's completion time.

With ``--replicas`` or ``--shards`` above 1, ``hil bench fleet`` runs the cluster bench
instead (:mod:`hil.bench.cluster`): PostgreSQL, ``fleet-server brokers`` and N
``fleet-server serve`` replicas as subprocesses, and the leader SIGKILLed mid-rollout.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import secrets
import ssl
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import sqlalchemy as sa
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from agent.kernel.bundle import init_bundle
from agent.wire import topics
from agent.wire.enroll import ENROLL_PATH
from agent.wire.messages import BundleRef, Event, Heartbeat, ReportedState, encode
from fleet_server.ca import make_device_key_and_csr
from fleet_server.cli.server import services_for
from fleet_server.config import parse_config
from fleet_server.db import store
from fleet_server.db.tables import heartbeats
from fleet_server.errors import FleetError
from fleet_server.repository import KeyStore, Passphrases, Repository
from fleet_server.repository.bundledir import manifest_target
from fleet_server.serve import FleetServer, Service, ServiceFactory
from fleet_server.services import IngestService
from hil.bench import cluster
from hil.loopback import free_port

log = logging.getLogger(__name__)

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "tests" / "data" / "tiny_classifier.tflite"
PASSPHRASE_ENV = "EDGEFLEET_KEY_PASSPHRASE"  # noqa: S105 (a variable name)
LABELS = {"line": "1"}
PROFILE = "x86-gateway"
CONNECT_TIMEOUT_S = 150.0
DRAIN_TIMEOUT_S = 30.0
CLIENTS_PER_PROCESS = 300
ENROLL_TIMEOUT_S = 120.0
HTTP_TIMEOUT_S = 30.0
TERMINAL = frozenset({"completed", "completed_partial", "cancelled", "rolled_back", "paused"})

Targets = dict[str, tuple[str, str, int]]
"""Directive target path -> (bundle, version, release)."""


class BenchError(FleetError):
    """The fleet bench can't set up or run.

    Attributes:
        reason: what failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"fleet bench: {reason}")


class _LightAgent:
    """One simulated device: its own paho client and certificate."""

    def __init__(self, device_id: str, host: str, port: int, ca: str, d: str, targets: Targets):
        self.device_id = device_id
        self.targets = targets
        self.seq = 0
        self.connected = False
        self.failure = ""
        self.beats_pending: set[int] = set()
        self.beats_acked = 0
        self.refused = 0
        self.installs = 0
        context = ssl.create_default_context(cafile=ca)
        context.load_cert_chain(f"{d}/{device_id}.crt", f"{d}/{device_id}.key")
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device_id, protocol=mqtt.MQTTv5)
        client.tls_set_context(context)
        client.max_inflight_messages_set(100)
        client.will_set(topics.state(device_id), encode(ReportedState.offline(device_id)), 1, True)
        client.on_connect = self._on_connect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        self.client = client
        self.host, self.port = host, port

    def _state(self, active: BundleRef | None) -> None:
        state = ReportedState(
            device_id=self.device_id,
            ts=time.time(),
            agent_version="bench",
            profile=PROFILE,
            labels=LABELS,
            active=active,
        )
        self.client.publish(topics.state(self.device_id), encode(state), qos=1, retain=True)

    def _on_connect(self, c: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        if rc.is_failure:
            self.failure = str(rc)
            return
        self.connected = True
        self._state(None)
        c.subscribe(topics.directive(self.device_id), qos=1)

    def _on_publish(self, _c: mqtt.Client, _u: Any, mid: int, rc: Any, _p: Any) -> None:
        if mid in self.beats_pending:
            self.beats_pending.discard(mid)
            if rc.is_failure:
                self.refused += 1
            else:
                self.beats_acked += 1

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if not msg.payload:
            return  # a cleared directive
        try:
            signed = json.loads(msg.payload)["signed"]
            name, version, release = next(
                self.targets[p] for p in signed["targets"] if p in self.targets
            )
        except (ValueError, KeyError, TypeError, StopIteration):
            self.failure = f"directive not understood: {msg.payload[:80]!r}"
            return
        now = time.time()
        report = {"at": now, "source": "bench", "bundle": name, "release": release,
                  "version": version, "counter": signed.get("version"),
                  "outcome": "committed", "step": "commit", "reason": "", "slot": "b"}  # fmt: skip
        event = Event(
            device_id=self.device_id,
            kind="install",
            event_id=f"install:{release}:{signed.get('version')}",
            ts=now,
            payload=report,
        )
        self.client.publish(topics.events(self.device_id), encode(event), qos=1)
        self._state(BundleRef(name=name, version=version, release=release))
        self.installs += 1

    def beat(self) -> None:
        beat = Heartbeat(device_id=self.device_id, seq=self.seq, ts=time.time())
        self.seq += 1
        info = self.client.publish(topics.heartbeat(self.device_id), encode(beat), qos=1)
        if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
            self.beats_pending.add(info.mid)
        else:
            self.refused += 1


def _pump(agents: list[_LightAgent]) -> None:
    for a in agents:
        rc = a.client.loop(timeout=0)
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS and not a.failure:
            a.failure = f"loop: {rc!s}"


def run_agents(spec: dict[str, Any], results: Any, go: Any, stop: Any) -> None:
    """A child process: connect ``spec["devices"]``, once ``go`` is set beat for
    ``duration_s``, keep answering directives until ``stop`` is set (at most
    ``linger_s`` more), then put one dict of counts on ``results``."""
    host, port, ca, d = spec["host"], spec["port"], spec["ca"], spec["dir"]
    targets = {k: tuple(v) for k, v in spec["targets"].items()}
    agents = [_LightAgent(i, host, port, ca, d, targets) for i in spec["devices"]]
    for a in agents:
        a.client.connect(host, port, keepalive=60)
        a.client.loop(timeout=0)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while not all(a.connected for a in agents) and time.monotonic() < deadline:
        _pump(agents)
        time.sleep(0.005)
    failed = [f"{a.device_id}: {a.failure}" for a in agents if not a.connected]
    results.put({"ready": sum(a.connected for a in agents), "failures": failed[:3]}, timeout=10)
    wait_go = time.monotonic() + CONNECT_TIMEOUT_S
    while not go.is_set() and not stop.is_set() and time.monotonic() < wait_go:
        _pump(agents)
        time.sleep(0.01)
    start, duration = time.time(), spec["duration_s"]
    tick = 0
    end = start + duration + spec["linger_s"]
    while time.time() < end and not stop.is_set():
        if time.time() >= start + tick and tick < duration:
            for a in agents:
                a.beat()
            tick += 1
        _pump(agents)
        time.sleep(0.002)
    drain = time.monotonic() + DRAIN_TIMEOUT_S
    while any(a.beats_pending for a in agents) and time.monotonic() < drain:
        _pump(agents)
        time.sleep(0.002)
    for a in agents:
        a.client.disconnect()
        a.client.loop(timeout=0)
    results.put(
        {
            "sent": sum(a.beats_acked for a in agents),
            "refused": sum(a.refused for a in agents),
            "unacked": sum(len(a.beats_pending) for a in agents),
            "installs": sum(a.installs for a in agents),
            "failures": [f"{a.device_id}: {a.failure}" for a in agents if a.failure][:5],
        },
        timeout=10,
    )


def _make_repository(directory: Path, model: Path) -> tuple[Path, Path]:
    pp = Passphrases(environ={PASSPHRASE_ENV: os.environ[PASSPHRASE_ENV]})
    keys = KeyStore.create(directory / "keystore", root_keys=1, root_threshold=1, passphrases=pp)
    repo = Repository(directory / "repository")
    repo.init(keys)
    init_bundle(model, directory / "bundle", name="tiny", version="1.0.0")
    repo.publish(directory / "bundle", keys)
    return repo.path, keys.path


def _enroll(url: str, engine: sa.Engine, device_id: str, out: Path) -> None:
    token = secrets.token_urlsafe(24)
    store.create_token(
        engine, store.hash_token(token), device_id, labels=LABELS, profile=PROFILE, ttl_s=3600
    )
    key_pem, csr_pem = make_device_key_and_csr(device_id)
    body = json.dumps({"token": token, "csr": csr_pem.decode()}).encode()
    req = urllib.request.Request(  # noqa: S310 (loopback URL of the server started here)
        url + ENROLL_PATH, data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310
        answer = json.loads(resp.read())
    (out / f"{device_id}.crt").write_text(answer["certificate"])
    key = out / f"{device_id}.key"
    key.write_bytes(key_pem)
    key.chmod(0o600)


def _stored(engine: sa.Engine) -> tuple[int, int]:
    """(heartbeat rows, distinct (device, record id) among them)."""
    distinct = sa.select(heartbeats.c.device_id, heartbeats.c.record_id).distinct().subquery()
    with engine.connect() as conn:
        rows = conn.execute(sa.select(sa.func.count()).select_from(heartbeats)).scalar_one()
        unique = conn.execute(sa.select(sa.func.count()).select_from(distinct)).scalar_one()
    return int(rows), int(unique)


def _recording(built: list[Service], factories: list[ServiceFactory]) -> list[ServiceFactory]:
    def wrap(factory: ServiceFactory) -> Callable[[Any], Service]:
        def make(ctx: Any) -> Service:
            service = factory(ctx)
            built.append(service)
            return service

        return make

    return [wrap(f) for f in factories]


def bench_fleet(
    devices: int = 1000,
    duration_s: float = 30.0,
    *,
    db_url: str | None = None,
    processes: int | None = None,
    model: Path = DEFAULT_MODEL,
    work_dir: Path | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Run the scenario of the module docstring; the figures as a JSON-able dict.

    Raises:
        BenchError: agents not connected, or a part failed to start.
    """
    os.environ.setdefault(PASSPHRASE_ENV, secrets.token_urlsafe(24))
    with tempfile.TemporaryDirectory(prefix="fleet-bench-", dir=work_dir) as tmp:
        root = Path(tmp)
        repo, keys = _make_repository(root, model)
        data: dict[str, Any] = {
            "server": {"state_dir": str(root / "state"), "log_level": "warning"},
            "http": {"port": 0, "max_concurrency": 1000},
            "broker": {"mosquitto": {"port": free_port(), "persistence": False}},
            "repository": {"path": str(repo), "keystore": str(keys)},
            "rollouts": {"tick_s": 0.5},
        }
        if db_url is not None:
            data["database"] = {"url": db_url}
        cfg = parse_config(data)
        built: list[Service] = []
        with FleetServer(cfg, services=_recording(built, services_for(cfg))) as server:
            ctx = server.context
            ids = [f"bench-{i:05d}" for i in range(devices)]
            out = root / "devices"
            out.mkdir()
            t0 = time.monotonic()
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda d: _enroll(server.url, ctx.engine, d, out), ids))
            enroll_s = time.monotonic() - t0
            progress(f"enrolled {devices} devices in {enroll_s:.1f} s")
            targets = {
                manifest_target(b.name, b.release): (b.name, b.version, b.release)
                for b in ctx.repository.bundles("tiny")
            }
            spawn = mp.get_context("spawn")
            # paho's loop() uses select(): each client holds 3 descriptors, all < 1024
            n = processes or -(-devices // CLIENTS_PER_PROCESS)
            results = spawn.Queue(maxsize=4 * n)
            go, stop = spawn.Event(), spawn.Event()
            base = {
                "host": ctx.broker.host, "port": ctx.broker.port, "ca": str(ctx.ca.cert_path),
                "dir": str(out), "targets": targets, "duration_s": int(duration_s),
                "linger_s": 120.0,
            }  # fmt: skip
            procs = []
            for k in range(n):
                spec = base | {"devices": ids[k::n]}
                p = spawn.Process(target=run_agents, args=(spec, results, go, stop), daemon=True)
                p.start()
                procs.append(p)
            hello = [results.get(timeout=CONNECT_TIMEOUT_S + 30) for _ in procs]
            ready = sum(h["ready"] for h in hello)
            progress(f"{ready} agents connected in {time.monotonic() - t0 - enroll_s:.1f} s")
            if ready < devices:
                stop.set()
                why = [f for h in hello for f in h["failures"]]
                raise BenchError(f"only {ready} of {devices} agents connected: {why}")
            go.set()
            start_at = time.time()
            time.sleep(2.0)  # the retained states reach the registry
            if ctx.rollouts is None:
                raise BenchError("the rollout service is not attached")
            spec_r = {"bundle": "tiny", "version": "1.0.0", "selector": dict(LABELS),
                      "waves": ["1", "10%", "50%", "100%"], "soak_s": 1,
                      "policy": {"gates": {"max_p99_ratio": None}}}  # fmt: skip
            t_roll = time.monotonic()
            rid = ctx.rollouts.create(spec_r)
            phase = "planned"
            limit = t_roll + max(duration_s, 60.0) + 60.0
            while phase not in TERMINAL and time.monotonic() < limit:
                time.sleep(0.25)
                phase = ctx.rollouts.get(rid)["phase"]
            rollout_s = time.monotonic() - t_roll
            progress(f"rollout {rid}: {phase} after {rollout_s:.1f} s")
            time.sleep(max(0.0, start_at + duration_s - time.time()) + 0.5)
            stop.set()
            reports = [results.get(timeout=DRAIN_TIMEOUT_S + 30) for _ in procs]
            for p in procs:
                p.join(30)
            sent = sum(r["sent"] for r in reports)
            stored, unique = _stored(ctx.engine)
            drain = time.monotonic() + DRAIN_TIMEOUT_S
            while stored < sent and time.monotonic() < drain:
                time.sleep(0.2)
                stored, unique = _stored(ctx.engine)
            view = ctx.rollouts.get(rid)
            workers = [w for s in built if isinstance(s, IngestService) for w in s.workers]
            stats = [w.stats() for w in workers]
        rates = [
            s.stored / (s.last_flushed - s.first_received)
            for s in stats
            if s.last_flushed > s.first_received
        ]
        return {
            "devices": devices,
            "duration_s": duration_s,
            "backend": ctx.engine.dialect.name,
            "enroll_s": round(enroll_s, 2),
            "heartbeats_sent": sent,
            "heartbeats_stored": stored,
            "lost": sent - stored,
            "duplicated": stored - unique,
            "ingest_duplicates_seen": sum(s.duplicates for s in stats),
            "ingest_quarantined": sum(s.quarantined for s in stats),
            "ingest_msgs_per_s_per_worker": round(sum(rates) / len(rates), 1) if rates else 0.0,
            "ingest_workers": len(stats),
            "rollout_phase": view["phase"],
            "rollout_counts": view["counts"],
            "rollout_completion_s": round(rollout_s, 2) if phase == "completed" else None,
            "installs_reported": sum(r["installs"] for r in reports),
            "refused": sum(r["refused"] for r in reports),
            "unacked": sum(r["unacked"] for r in reports),
            "agent_failures": [f for r in reports for f in r["failures"]][:5],
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hil bench fleet",
        description="Scale bench: N light agents with TLS identities, heartbeats, a rollout.",
        epilog="examples: hil bench fleet --devices 1000 --duration 30\n"
        "          hil bench fleet --devices 10000 --replicas 3 --shards 2 --json out.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--devices", type=int, default=1000, help="simulated devices")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of heartbeats")
    parser.add_argument(
        "--db-url",
        default=None,
        help="PostgreSQL URL (default SQLite; the cluster bench starts its own PostgreSQL)",
    )
    parser.add_argument(
        "--processes", type=int, default=None, help="agent processes (default: 1 per 300)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    cluster.add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.replicas > 1 or args.shards > 1:
            result = cluster.run(args)
        else:
            result = bench_fleet(
                args.devices,
                args.duration,
                db_url=args.db_url,
                processes=args.processes,
                progress=lambda m: print(f"bench: {m}", file=sys.stderr, flush=True),
            )
    except FleetError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    for key, value in result.items():
        print(f"{key:32} {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
