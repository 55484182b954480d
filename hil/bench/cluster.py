"""The fleet bench at cluster scale (``hil bench fleet --replicas N --shards M``):
PostgreSQL, ``fleet-server brokers`` running the managed Mosquitto of every shard, and N
``fleet-server serve`` replicas (``[broker] run = false``, one state directory), while
light agents heartbeat and a rollout goes across all of them; mid-rollout the leader
replica is SIGKILLed.

The parts are real: the replicas are subprocesses of the ``fleet-server`` command, the
agents hold TLS identities from the fleet CA (issued once and cached:
:mod:`hil.bench.cluster_seed`) and connect to their shard's broker
(:mod:`hil.bench.cluster_agents`, many per process). The rollout is created through the
HTTP API of a follower. Once the rollout has ``kill_at`` of its devices done, the
replica holding ``cluster_leader`` is SIGKILLed; ``failover_s`` is the time until the
lead's epoch rose (another replica took it), ``failover_first_save_s`` until the
rollout was next saved under the new epoch. The killed replica is restarted after
``restart_after_s`` (as systemd would), which also hands its ingest session's queued
messages to a live worker again.

Figures: heartbeats acknowledged by the broker against those stored, by (device, seq):
``lost`` (acknowledged, not stored) and ``duplicated`` (stored twice); the rollout's
completion time; and ``two_directives``: devices that were sent two different directives
(different targets or mode) during the one rollout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from fleet_server.db import open_database
from fleet_server.db.tables import devices as devices_table
from fleet_server.db.tables import heartbeats, rollout_devices, rollouts
from fleet_server.errors import FleetError
from hil.bench.cluster_fleet import AgentFleet
from hil.bench.cluster_procs import Topology
from hil.bench.cluster_seed import (
    CA_PASSPHRASE_ENV,
    DEFAULT_CACHE,
    PASSPHRASE_NAME,
    insert_devices,
    prepare_seed,
)
from hil.bench.cluster_setup import Layout, make_layout, make_repository, targets_of
from hil.pgcluster import start_cluster, stop_cluster

log = logging.getLogger(__name__)

LABELS = {"line": "1"}
PROFILE = "x86-gateway"
TOKEN_ENV = "BENCH_OPERATOR_TOKEN"  # noqa: S105 (a variable name)
TERMINAL = frozenset({"completed", "completed_partial", "cancelled", "rolled_back", "paused"})
HTTP_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 60.0
POLL_S = 0.25


class BenchError(FleetError):
    """The cluster bench can't set up or run.

    Attributes:
        reason: what failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"cluster bench: {reason}")


def _create_rollout(url: str, token: str) -> str:
    spec = {"bundle": "tiny", "version": "1.0.0", "selector": dict(LABELS),
            "waves": ["1", "10%", "50%", "100%"], "soak_s": 1,
            "policy": {"gates": {"max_p99_ratio": None}}}  # fmt: skip
    req = urllib.request.Request(  # noqa: S310 (loopback URL of a replica started here)
        url + "/api/v1/rollouts",
        data=json.dumps(spec).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310
        return str(json.loads(resp.read())["rollout_id"])


def _rollout(engine: sa.Engine, rid: str) -> tuple[str, int, dict[str, int]]:
    """(phase, revision, devices per status)."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(rollouts.c.state, rollouts.c.revision).where(rollouts.c.rollout_id == rid)
        ).one()
        counts = conn.execute(
            sa.select(rollout_devices.c.status, sa.func.count())
            .where(rollout_devices.c.rollout_id == rid)
            .group_by(rollout_devices.c.status)
        ).all()
    return str(row.state), int(row.revision), {str(s): int(n) for s, n in counts}


def _seq(record_id: str) -> int:
    """The seq of a heartbeat's record id (``heartbeat:<seq>:<ts>``); -1 if none."""
    parts = record_id.split(":")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1


def _stored(engine: sa.Engine) -> set[tuple[str, int]]:
    """Stored heartbeats as (device, seq)."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(heartbeats.c.device_id, heartbeats.c.record_id)).all()
    return {(str(d), _seq(str(r))) for d, r in rows}


def _stored_rows(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(heartbeats)).scalar_one())


class _Failover:
    """Kills the leader once ``kill_at`` of the devices are done; times the takeover."""

    def __init__(self, topo: Topology, engine: sa.Engine, restart_after_s: float) -> None:
        self.topo, self.engine, self.restart_after_s = topo, engine, restart_after_s
        self.killed: str | None = None
        self.old_epoch = 0
        self.t_kill = 0.0
        self.new_leader: str | None = None
        self.failover_s: float | None = None
        self.first_save_s: float | None = None
        self.revision_at_takeover: int | None = None
        self.restarted = False
        self.note = ""

    def kill(self) -> None:
        holder, epoch = self.topo.leader()
        if holder is None or holder not in self.topo.procs:
            self.note = f"no leader to kill (cluster_leader holder {holder!r})"
            self.killed = ""
            return
        self.old_epoch = epoch
        self.t_kill = time.monotonic()
        self.topo.procs[holder].kill()
        self.killed = holder

    def poll(self, revision: int) -> None:
        if not self.killed:
            return
        now = time.monotonic()
        if self.failover_s is None:
            holder, epoch = self.topo.leader()
            if epoch > self.old_epoch:
                self.failover_s = now - self.t_kill
                self.new_leader = holder
                self.revision_at_takeover = revision
        elif self.first_save_s is None and revision != self.revision_at_takeover:
            self.first_save_s = now - self.t_kill
        if not self.restarted and now - self.t_kill >= self.restart_after_s:
            self.restarted = True
            self.topo.start_replica(self.killed)

    @property
    def settled(self) -> bool:
        return self.killed is not None and (self.killed == "" or self.restarted)


def _keep_logs(root: Path, dest: Path) -> None:
    """Copy the processes' logs of this run to ``dest`` (replacing the last run's)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    for path in root.glob("*.log"):
        shutil.copy2(path, dest / path.name)


def bench_cluster(
    devices: int = 60,
    replicas: int = 2,
    shards: int = 2,
    *,
    db_url: str | None = None,
    interval_s: float | None = None,
    kill_at: float | None = 0.3,
    restart_after_s: float = 5.0,
    clients_per_process: int = 500,
    cache: Path = DEFAULT_CACHE,
    work_dir: Path | None = None,
    rollout_timeout_s: float | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Run the scenario of the module docstring; the figures as a JSON-able dict.
    ``kill_at`` None: no leader kill.

    Raises:
        BenchError: a part failed to start, agents did not connect, or the database
            given already holds devices.
        TopologyError: a fleet-server process failed to start.
    """
    interval = interval_s if interval_s is not None else max(1.0, min(30.0, devices / 333))
    ids = [f"cl-{i:05d}" for i in range(devices)]
    pg = start_cluster(durable=True) if db_url is None else None
    root = Path(tempfile.mkdtemp(prefix="fleet-cluster-", dir=work_dir))
    try:
        url = pg.create_database("bench") if pg is not None else str(db_url)
        engine = open_database(url)
        try:
            with engine.connect() as conn:
                n = conn.execute(sa.select(sa.func.count()).select_from(devices_table))
                if n.scalar_one():
                    raise BenchError("the database holds devices: give an empty one")
            t0 = time.monotonic()
            seed = prepare_seed(cache, ids, progress)
            seed_s = time.monotonic() - t0
            progress(f"identities ready in {seed_s:.1f} s ({seed.issued_now} issued now)")
            token = secrets.token_urlsafe(24)
            env = dict(os.environ)
            env[PASSPHRASE_NAME] = secrets.token_urlsafe(24)
            env[CA_PASSPHRASE_ENV] = seed.ca_passphrase
            env[TOKEN_ENV] = token
            layout: Layout = make_layout(root, url, replicas, shards, devices, TOKEN_ENV)
            shutil.copytree(seed.ca_dir, layout.config.ca_path)
            make_repository(layout, env[PASSPHRASE_NAME])
            assigned = insert_devices(engine, seed, layout.config, ids, LABELS, PROFILE)
            with Topology(root, layout.replica_configs, layout.brokers_config,
                          list(layout.shard_ports.values()), engine, env) as topo:  # fmt: skip
                progress(f"{replicas} replicas and {shards} shard(s) up")
                result = _run(
                    topo, engine, layout, seed.devices_dir, assigned, interval, kill_at,
                    restart_after_s, clients_per_process, rollout_timeout_s, token, progress,
                )  # fmt: skip
            result["seed_s"] = round(seed_s, 2)
            return result
        finally:
            engine.dispose()
    finally:
        if pg is not None:
            stop_cluster(pg)
        _keep_logs(root, cache / "logs")
        shutil.rmtree(root, ignore_errors=True)


def _run(
    topo: Topology,
    engine: sa.Engine,
    layout: Layout,
    devices_dir: Path,
    assigned: dict[str, str],
    interval: float,
    kill_at: float | None,
    restart_after_s: float,
    per_process: int,
    rollout_timeout_s: float | None,
    token: str,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    devices = len(assigned)
    where = {d: ("127.0.0.1", layout.shard_ports[s]) for d, s in assigned.items()}
    spec = {"ca": str(layout.config.ca_path / "ca.crt"), "dir": str(devices_dir),
            "targets": targets_of(layout), "labels": LABELS, "interval_s": interval,
            "max_s": 3600.0}  # fmt: skip
    with AgentFleet(where, spec, per_process) as fleet:
        t0 = time.monotonic()
        ready, why = fleet.connect()
        connected_s = time.monotonic() - t0
        progress(f"{ready} agents connected in {connected_s:.1f} s")
        if ready < devices:
            raise BenchError(f"only {ready} of {devices} agents connected: {why}")
        fleet.go()
        time.sleep(2.0)  # the retained states reach the registry
        follower = list(layout.replica_urls)[-1]
        t_roll = time.monotonic()
        rid = _create_rollout(layout.replica_urls[follower], token)
        failover = _Failover(topo, engine, restart_after_s)
        kill_planned = kill_at is not None and len(topo.configs) > 1
        limit = t_roll + (rollout_timeout_s or 120.0 + devices * 0.1)
        phase, revision = "planned", 0
        counts: dict[str, int] = {}
        done_at: float | None = None
        while time.monotonic() < limit:
            phase, revision, counts = _rollout(engine, rid)
            due = kill_planned and counts.get("done", 0) >= (kill_at or 0.0) * devices
            if due and failover.killed is None:
                failover.kill()
                progress(f"SIGKILL leader {failover.killed or '-'} {failover.note}")
            failover.poll(revision)
            if phase in TERMINAL and done_at is None:
                done_at = time.monotonic()
                progress(f"rollout {rid}: {phase} after {done_at - t_roll:.1f} s")
            if done_at is not None and (failover.settled or not kill_planned):
                break
            time.sleep(POLL_S)
        # every device beats at least twice more, the restarted replica included
        time.sleep(2 * interval + 1.0)
        dead = topo.dead()
        reports = fleet.stop()
    acked = {(d, s) for r in reports for d, seqs in r["acked"].items() for s in seqs}
    stored = _stored(engine)
    drain = time.monotonic() + DRAIN_TIMEOUT_S
    while not acked <= stored and time.monotonic() < drain:
        time.sleep(0.5)
        stored = _stored(engine)
    rows = _stored_rows(engine)
    seen = {d: v for r in reports for d, v in r["directives"].items()}
    distinct = {d: {k for _c, k in v} for d, v in seen.items()}
    shard_devices: dict[str, int] = {}
    for s in assigned.values():
        shard_devices[s] = shard_devices.get(s, 0) + 1
    return {
        "devices": devices,
        "replicas": len(topo.configs),
        "shards": len(layout.shard_ports),
        "backend": engine.dialect.name,
        "shard_devices": shard_devices,
        "interval_s": interval,
        "connected_s": round(connected_s, 2),
        "heartbeats_sent": len(acked),
        "heartbeats_stored": len(stored),
        "lost": len(acked - stored),
        "lost_sample": sorted(acked - stored)[:5],
        "duplicated": rows - len(stored),
        "stored_not_acked": len(stored - acked),
        "rollout_phase": phase,
        "rollout_counts": counts,
        "rollout_completed_s": round(done_at - t_roll, 2)
        if done_at is not None and phase == "completed"
        else None,
        "leader_killed": failover.killed or None,
        "leader_after": failover.new_leader,
        "failover_s": None if failover.failover_s is None else round(failover.failover_s, 2),
        "failover_first_save_s": None
        if failover.first_save_s is None
        else round(failover.first_save_s, 2),
        "failover_note": failover.note,
        "two_directives": sum(len(k) > 1 for k in distinct.values()),
        "directives_received": sum(len(v) for v in seen.values()),
        "directives_reissued": sum(len(v) - len(distinct[d]) for d, v in seen.items()),
        "installs_reported": sum(r["installs"] for r in reports),
        "refused": sum(r["refused"] for r in reports),
        "unacked": sum(r["unacked"] for r in reports),
        "agent_failures": [f for r in reports for f in r["failures"]][:5],
        "dead_processes": dead,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster flags of ``hil bench fleet``."""
    group = parser.add_argument_group("cluster (with --replicas or --shards above 1)")
    group.add_argument("--replicas", type=int, default=1, help="fleet-server serve replicas")
    group.add_argument("--shards", type=int, default=1, help="broker shards (main included)")
    group.add_argument(
        "--interval", type=float, default=None,
        help="seconds between one device's heartbeats (default: devices/333, 1..30)",
    )  # fmt: skip
    group.add_argument(
        "--kill-at", type=float, default=0.3,
        help="SIGKILL the leader once this share of devices is done (default 0.3)",
    )  # fmt: skip
    group.add_argument("--no-kill", action="store_true", help="no leader kill")
    group.add_argument(
        "--clients-per-process", type=int, default=500, help="light agents per process"
    )
    group.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="identity cache")
    group.add_argument(
        "--rollout-timeout", type=float, default=None, help="seconds (default 120 + 0.1/device)"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``hil bench fleet`` with the cluster flags; the figures.

    Raises:
        FleetError: the bench can't set up or run.
    """
    return bench_cluster(
        args.devices,
        args.replicas,
        args.shards,
        db_url=args.db_url,
        interval_s=args.interval,
        kill_at=None if args.no_kill else args.kill_at,
        clients_per_process=args.clients_per_process,
        cache=args.cache,
        rollout_timeout_s=args.rollout_timeout,
        progress=lambda m: print(f"bench: {m}", file=sys.stderr, flush=True),
    )
