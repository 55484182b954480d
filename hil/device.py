"""A device under test: where the agent runs, and where faults are put on it.

:class:`Device` is what scenarios and fault injectors use; :class:`~hil.sim.SimDevice`
(a network namespace on this machine) and :class:`~hil.ssh.SshDevice` (a real device over
SSH) implement it. Paths given to a device are paths *on the device*, as strings.

Every device runs: a local Mosquitto on its loopback (robots and PLCs; it keeps working
while the uplink is down), a "robot" (``mosquitto_sub`` on the action topics, each
message stamped with its arrival time), and the agent (``edge-agent run``).
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from hil import agentconf
from hil.assets import Assets
from hil.errors import CommandFailed, DeviceError


class RunningProc(Protocol):
    """A process a device runs for the harness."""

    name: str

    def alive(self) -> bool: ...

    def signal(self, sig: int) -> None: ...

    def stop(self, timeout_s: float = 15.0) -> int | None: ...

    def kill(self) -> None: ...

    def tail(self, lines: int = 20) -> str: ...


@dataclass(frozen=True)
class RobotMessage:
    """One action message the robot received."""

    arrived: float
    """Unix time it reached the robot (the subscriber's clock)."""
    decision_id: str
    outcome: str
    capture_time: float
    decision_time: float


@dataclass(frozen=True)
class LocalDecision:
    """One row of the device's decision log."""

    id: str
    decision_time: float
    e2e_ms: float | None
    uploaded: int
    """0: not queued, 2: in an outbox batch, 1: acknowledged by the broker."""


class Device(ABC):
    """One device under test (see the module docstring)."""

    kind: ClassVar[str]

    def __init__(self, device_id: str) -> None:
        self.device_id = device_id
        self.agent: RunningProc | None = None
        self.agent_env: dict[str, str] = {}
        """Extra environment for the agent (the clock-jump injector's LD_PRELOAD)."""
        self._dead_agents: list[RunningProc] = []
        self._robot: RunningProc | None = None

    # -- what each kind of device provides ----------------------------------------------

    @property
    @abstractmethod
    def home(self) -> str:
        """The device-side directory with agent.toml and ``state/``."""

    @property
    @abstractmethod
    def edge_agent(self) -> str:
        """The edge-agent command on the device."""

    @property
    @abstractmethod
    def uplink_iface(self) -> str:
        """The device's network interface towards the fleet."""

    @abstractmethod
    def setup(self) -> None:
        """Network, local broker and the robot's subscriber.

        Raises:
            DeviceError: a part can't be set up.
        """

    @abstractmethod
    def teardown(self) -> None:
        """Stop everything started on the device and undo the network (idempotent)."""

    @abstractmethod
    def run(
        self, argv: Sequence[str], *, timeout_s: float = 30.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a command on the device (as root: ``sudo`` on a real device).

        Raises:
            CommandFailed: it failed (with ``check``) or timed out.
        """

    @abstractmethod
    def spawn(
        self, argv: Sequence[str], *, name: str, env: Mapping[str, str] | None = None
    ) -> RunningProc:
        """Start a long-running command on the device; its output goes to
        ``<home>/<name>.log``.

        Raises:
            CommandFailed: it could not be started.
        """

    @abstractmethod
    def stage_assets(self, assets: Assets) -> tuple[str, str]:
        """Put the video and the fallback bundle on the device: their device paths."""

    @abstractmethod
    def write_file(self, path: str, data: bytes) -> None:
        """Write a file on the device (parents created)."""

    @abstractmethod
    def read_file(self, path: str) -> bytes:
        """Read a file on the device.

        Raises:
            DeviceError: it can't be read.
        """

    @abstractmethod
    def set_link(self, up: bool) -> None:
        """Plug or pull the device's uplink."""

    @abstractmethod
    def host_egress(self) -> tuple[list[str], str] | None:
        """The fleet side's end of the link, as (command prefix, interface), where traffic
        towards the device can be shaped; None where the harness has no such end."""

    @abstractmethod
    def mount_tmpfs(self, path: str, size_mb: int) -> None:
        """Mount a tmpfs of ``size_mb`` MiB on ``path`` (created); unmounted at teardown.

        Raises:
            CommandFailed: mount refused.
        """

    @abstractmethod
    def umount(self, path: str) -> None:
        """Unmount what :meth:`mount_tmpfs` mounted on ``path`` (lazily; idempotent)."""

    @abstractmethod
    def enroll(self, url: str, token: str) -> None:
        """``edge-agent enroll`` the device with a one-time token (read from stdin).

        Raises:
            CommandFailed: enrollment failed.
        """

    @property
    @abstractmethod
    def python(self) -> str:
        """A Python interpreter on the device (the agent's)."""

    @abstractmethod
    def query(self, db: str, sql: str) -> list[dict[str, Any]]:
        """Rows of a read-only SQLite query on a database on the device.

        Raises:
            DeviceError: the database can't be read.
        """

    # -- shared -------------------------------------------------------------------------

    def fleet_side_tx_bytes(self) -> int | None:
        """Bytes sent towards the device on the fleet side of its link (None where the
        harness can't count them)."""
        return None

    def path(self, *parts: str) -> str:
        """A path under the device's home."""
        return "/".join([self.home.rstrip("/"), *parts])

    @property
    def config_path(self) -> str:
        return self.path("agent.toml")

    @property
    def state_dir(self) -> str:
        return self.path("state")

    def http(self, path: str, timeout_s: float = 5.0) -> tuple[int, str]:
        """GET the agent's local HTTP endpoint (``curl`` on the device): status and body;
        status 0 when nothing answered."""
        url = f"http://127.0.0.1:{agentconf.HTTP_PORT}{path}"
        argv = ["curl", "-s", "-m", f"{timeout_s:g}", "-w", "\n%{http_code}", url]
        try:
            done = self.run(argv, timeout_s=timeout_s + 5, check=False)
        except CommandFailed:
            return 0, ""
        body, _, code = done.stdout.rpartition("\n")
        return (int(code) if code.isdigit() else 0), body

    def healthz(self) -> dict[str, Any] | None:
        """The agent's /healthz JSON (None when it does not answer)."""
        status, body = self.http("/healthz")
        if status == 0:
            return None
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            return None
        return data if isinstance(data, dict) else None

    def start_agent(self) -> None:
        """Start ``edge-agent run`` (a previous one must have ended).

        Raises:
            DeviceError: one still runs.
            CommandFailed: it could not be started.
        """
        if self.agent is not None and self.agent.alive():
            raise DeviceError(self.device_id, "the agent already runs")
        if self.agent is not None:
            self._dead_agents.append(self.agent)
        argv = [self.edge_agent, "run", "--config", self.config_path]
        self.agent = self.spawn(argv, name="agent", env=self.agent_env)

    def stop_agent(self, timeout_s: float = 20.0) -> int | None:
        """Stop the agent (SIGTERM: it flushes its log); its exit status."""
        if self.agent is None:
            return None
        return self.agent.stop(timeout_s)

    def kill_agent(self) -> None:
        """SIGKILL the agent's main process (a crash; its workers are left to notice)."""
        if self.agent is not None:
            self.agent.signal(signal.SIGKILL)

    def stop_all_agents(self) -> None:
        """Stop the agent and reap what crashed agents left behind."""
        self.stop_agent()
        for proc in self._dead_agents:
            proc.stop(5.0)
        self._dead_agents.clear()

    def start_robot(self) -> None:
        """Subscribe to the action topics on the local broker (QoS 1), each message with
        its arrival time, into ``<home>/robot.log``."""
        argv = [
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            str(agentconf.LOCAL_MQTT_PORT),
            "-q",
            "1",
            "-t",
            agentconf.ROBOT_FILTER,
            "-F",
            "%U %p",
        ]
        self._robot = self.spawn(argv, name="robot")

    def stop_robot(self) -> None:
        if self._robot is not None:
            self._robot.stop(5.0)
            self._robot = None

    def robot_messages(self) -> list[RobotMessage]:
        """Every action message the robot received so far."""
        try:
            text = self.read_file(self.path("robot.log")).decode(errors="replace")
        except DeviceError:
            return []
        out: list[RobotMessage] = []
        for line in text.splitlines():
            stamp, _, payload = line.partition(" ")
            try:
                body = json.loads(payload)
                out.append(
                    RobotMessage(
                        float(stamp),
                        str(body["decision_id"]),
                        str(body["outcome"]),
                        float(body["capture_time"]),
                        float(body["decision_time"]),
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by a read during a write
        return out

    def decisions(self) -> list[LocalDecision]:
        """Every row of the device's decision log (id, decision time, e2e ms)."""
        db = self.path("state", "decisions.db")
        try:
            rows = self.query(db, "SELECT id, decision_time, e2e_ms, uploaded FROM decisions")
        except DeviceError:
            return []
        return [
            LocalDecision(
                str(r["id"]),
                float(r["decision_time"]),
                None if r["e2e_ms"] is None else float(r["e2e_ms"]),
                int(r["uploaded"]),
            )
            for r in rows
        ]


def sqlite_rows(path: str, sql: str) -> list[dict[str, Any]]:
    """Rows of ``sql`` on the SQLite file ``path``, opened read-only.

    Raises:
        DeviceError: the file can't be opened or queried.
    """
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        raise DeviceError(path, f"cannot open: {exc}") from exc
    try:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(sql)]
    except sqlite3.Error as exc:
        raise DeviceError(path, f"query failed: {exc}") from exc
    finally:
        conn.close()
