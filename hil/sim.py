"""A simulated device: the real agent in a network namespace of this machine.

The namespace has its own loopback (the local Mosquitto, the robot, the agent's HTTP
endpoint) and one veth link to the simulated LAN (:mod:`hil.netns`), so pulling that
link cuts the device from the fleet and from nothing else. Files stay on this machine's
file system, under ``<workdir>/devices/<device_id>``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hil import agentconf, shell
from hil.assets import Assets
from hil.device import Device, RunningProc, sqlite_rows
from hil.errors import CommandFailed, DeviceError
from hil.netns import PREFIX, Lan, Netns

BIN = Path(sys.executable).parent
_LISTEN = "0A"


class SimDevice(Device):
    """A device in namespace ``efhil-<index>`` on ``lan`` (see the module docstring)."""

    kind = "sim"

    def __init__(self, device_id: str, lan: Lan, index: int, workdir: Path) -> None:
        super().__init__(device_id)
        self.ns = Netns(lan, index)
        self._home = (workdir / "devices" / device_id).resolve()
        self._procs: list[shell.Proc] = []
        self._mounts: list[Path] = []

    @property
    def home(self) -> str:
        return str(self._home)

    @property
    def edge_agent(self) -> str:
        return str(BIN / "edge-agent")

    @property
    def uplink_iface(self) -> str:
        return self.ns.device_end

    @property
    def address(self) -> str:
        """The device's address on the LAN."""
        return self.ns.ip

    def setup(self) -> None:
        if self._home.exists():
            shutil.rmtree(self._home)
        self._home.mkdir(parents=True)
        try:
            self.ns.create()
            conf = self._home / "mosquitto.conf"
            conf.write_text(
                f"listener {agentconf.LOCAL_MQTT_PORT} 127.0.0.1\nallow_anonymous true\n"
                "persistence false\nlog_dest stderr\n"
            )
            self._start_broker(conf)
            self.start_robot()
        except (CommandFailed, DeviceError):
            self.teardown()
            raise

    def _start_broker(self, conf: Path) -> None:
        mosquitto = shell.which("mosquitto")
        if mosquitto is None:
            raise DeviceError(self.device_id, "mosquitto is not installed (make sysdeps)")
        broker = self.spawn([mosquitto, "-c", str(conf)], name="mosquitto")
        deadline = time.monotonic() + 10.0
        while not self.listening(agentconf.LOCAL_MQTT_PORT):
            if not broker.alive() or time.monotonic() > deadline:
                raise DeviceError(
                    self.device_id, f"local mosquitto did not start: {broker.tail(5)}"
                )
            time.sleep(0.05)

    def listening(self, port: int) -> bool:
        """Whether a TCP socket listens on ``port`` in the namespace."""
        out = self.run(["cat", "/proc/net/tcp"], check=False).stdout
        want = f":{port:04X}"
        return any(
            f[1].endswith(want) and f[3] == _LISTEN
            for f in (line.split() for line in out.splitlines()[1:])
            if len(f) > 3
        )

    def teardown(self) -> None:
        self.stop_all_agents()
        self.stop_robot()
        for proc in reversed(self._procs):
            proc.stop(5.0)
        self._procs.clear()
        for mount in reversed(self._mounts):
            self.umount(str(mount))
        self.ns.destroy()

    def run(
        self, argv: Sequence[str], *, timeout_s: float = 30.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return shell.run(self.ns.exec_argv(list(argv)), timeout_s=timeout_s, check=check)

    def spawn(
        self, argv: Sequence[str], *, name: str, env: Mapping[str, str] | None = None
    ) -> RunningProc:
        proc = shell.Proc(
            self.ns.exec_argv(list(argv)),
            self._home / f"{name}.log",
            env={**os.environ, **(env or {})},
            name=name,
        )
        self._procs.append(proc)
        return proc

    def stage_assets(self, assets: Assets) -> tuple[str, str]:
        return str(assets.video), str(assets.bundle)  # the same file system

    def fleet_side_tx_bytes(self) -> int:
        """Bytes sent towards the device on its switch port so far."""
        stats = Path(f"/sys/class/net/{self.ns.host_end}/statistics/tx_bytes")
        return int(stats.read_text())

    def write_file(self, path: str, data: bytes) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)

    def read_file(self, path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise DeviceError(self.device_id, f"cannot read {path}: {exc.strerror}") from exc

    def set_link(self, up: bool) -> None:
        self.ns.set_link(up)

    def host_egress(self) -> tuple[list[str], str] | None:
        return [], self.ns.host_end

    def query(self, db: str, sql: str) -> list[dict[str, Any]]:
        return sqlite_rows(db, sql)

    @property
    def python(self) -> str:
        return sys.executable

    def enroll(self, url: str, token: str) -> None:
        # from this machine's namespace: the API listens on loopback; the identity lands
        # in the state directory the agent then uses
        argv = [self.edge_agent, "enroll", url, "--token", "-", "--config", self.config_path]
        shell.run(argv, input_text=token, timeout_s=60.0)

    def mount_tmpfs(self, path: str, size_mb: int) -> None:
        target = Path(path)
        target.mkdir(parents=True, exist_ok=True)
        source = f"{PREFIX}-{self.device_id}"
        shell.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", source, path])
        self._mounts.append(target)

    def umount(self, path: str) -> None:
        shell.run(["umount", "-l", path], check=False)
        target = Path(path)
        if target in self._mounts:
            self._mounts.remove(target)
