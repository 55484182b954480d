"""The cluster bench's processes: ``fleet-server brokers`` and N ``fleet-server serve``
replicas as subprocesses, each with its own config file and log, all on one state
directory and one PostgreSQL.

Each process runs in a session of its own, so that stopping it also ends its children
(the managed Mosquittos of ``brokers``). :class:`Topology` starts them in order (brokers,
then the first replica alone, which issues the shared service identities, then the
others), finds the leader in ``cluster_leader``, SIGKILLs and restarts a replica, and
stops everything it started, also on a failure (``with Topology(...)``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import sqlalchemy as sa

from fleet_server.cli.server import build_parser
from fleet_server.db.tables import cluster_leader, cluster_replicas
from fleet_server.errors import FleetError

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
POLL_S = 0.1
READY_LINE = "fleet-server: serving"


class TopologyError(FleetError):
    """A process of the bench's cluster can't start, or died.

    Attributes:
        part: the process ("brokers", "r1", ...).
        reason: what failed (with the tail of its log).
    """

    def __init__(self, part: str, reason: str) -> None:
        self.part = part
        self.reason = reason
        super().__init__(f"cluster bench: {part}: {reason}")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """``data`` as TOML: scalars and lists of scalars, tables, arrays of tables."""
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for key, value in data.items():
        is_tables = isinstance(value, list) and value and all(isinstance(v, dict) for v in value)
        if isinstance(value, dict) or is_tables:
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, value in tables:
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += f"\n[{name}]\n" + to_toml(value, name + ".")
        else:
            for item in value:
                out += f"\n[[{name}]]\n" + to_toml(item, name + ".")
    return out


def has_brokers_command() -> bool:
    """Whether ``fleet-server brokers`` exists in this tree."""
    try:
        build_parser().parse_args(["brokers", "--config", "x"])
    except SystemExit:
        return False
    return True


def wait_port(host: str, port: int, timeout_s: float) -> bool:
    """Whether something accepts TCP connections on ``host:port`` within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            time.sleep(POLL_S)
    return False


@dataclass
class Proc:
    """One subprocess and its log."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def signal_group(self, sig: int) -> None:
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            return

    def kill(self) -> None:
        """SIGKILL the process (its own, not its session's children)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM the session, then SIGKILL what is left after STOP_TIMEOUT_S."""
        if self.popen is None:
            return
        self.signal_group(signal.SIGTERM)
        try:
            self.popen.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %.0f s: SIGKILL", self.name, STOP_TIMEOUT_S)
        self.signal_group(signal.SIGKILL)
        if self.popen.poll() is None:
            self.popen.wait(STOP_TIMEOUT_S)


@dataclass
class Topology:
    """The brokers process (when the tree has the command) and the replicas."""

    root: Path
    configs: dict[str, Path]
    brokers_config: Path | None
    broker_ports: list[int]
    engine: sa.Engine
    env: dict[str, str]
    procs: dict[str, Proc] = field(default_factory=dict)

    def _server(self, name: str, command: str, config: Path) -> Proc:
        argv = [sys.executable, "-m", "fleet_server.cli.server", command, "--config", str(config)]
        return Proc(name, argv, self.root / f"{name}.log")

    def _wait_ready(self, proc: Proc) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not proc.alive:
                raise TopologyError(proc.name, f"exited while starting: {proc.tail()}")
            if READY_LINE in proc.tail(100_000):
                return
            time.sleep(POLL_S)
        raise TopologyError(proc.name, f"not serving within {START_TIMEOUT_S:.0f} s")

    def start(self) -> None:
        """Brokers, then the first replica, then the others (each ready before the next).

        Raises:
            TopologyError: a process exited or did not get ready in time.
        """
        if self.brokers_config is not None:
            brokers = self._server("brokers", "brokers", self.brokers_config)
            self.procs["brokers"] = brokers
            brokers.start(self.env)
            for port in self.broker_ports:
                if not wait_port("127.0.0.1", port, START_TIMEOUT_S):
                    raise TopologyError("brokers", f"port {port} not open: {brokers.tail()}")
                if not brokers.alive:
                    raise TopologyError("brokers", f"exited: {brokers.tail()}")
        for name in self.configs:
            self.start_replica(name)

    def start_replica(self, name: str) -> None:
        """(Re)start replica ``name`` and wait until it serves.

        Raises:
            TopologyError: it exited or did not get ready in time.
        """
        proc = self._server(name, "serve", self.configs[name])
        self.procs[name] = proc
        proc.start(self.env)
        self._wait_ready(proc)

    def leader(self) -> tuple[str | None, int]:
        """(holder, epoch) of the ``rollouts`` lead, as stored; (None, 0) when none."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(cluster_leader.c.holder, cluster_leader.c.epoch).where(
                    cluster_leader.c.name == "rollouts"
                )
            ).first()
        return (None, 0) if row is None else (str(row.holder), int(row.epoch))

    def replicas_leading(self) -> list[str]:
        """Replicas whose last report says they lead."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(cluster_replicas.c.replica_id).where(cluster_replicas.c.leader)
            ).all()
        return [str(r.replica_id) for r in rows]

    def dead(self) -> list[str]:
        """Processes that exited though nobody stopped them."""
        return [p.name for p in self.procs.values() if p.popen is not None and not p.alive]

    def stop(self) -> None:
        """Stop the replicas, then the brokers (each SIGTERM, then SIGKILL)."""
        for name in [n for n in self.procs if n != "brokers"] + ["brokers"]:
            proc = self.procs.get(name)
            if proc is not None:
                try:
                    proc.stop()
                except (OSError, subprocess.SubprocessError):
                    log.exception("stopping %s", name)

    def __enter__(self) -> Topology:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
