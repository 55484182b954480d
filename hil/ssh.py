"""A real device reached over SSH (a Jetson, an ARM board, an x86 gateway).

The same steps as a simulated device, as commands over ``ssh`` (key authentication,
``BatchMode``): assets and config copied with ``scp``/``cat``, the agent and the robot
started with ``nohup setsid`` and signalled by their process ids, root commands (``ip``,
``tc``, ``nft``, ``mount``) with ``sudo -n``. The device needs edge-agent, mosquitto
(and its clients), curl, sqlite3 and nftables installed, and passwordless sudo for the
harness's user. See hil/README.md for a worked example.

URL: ``ssh://USER@HOST[:PORT]?iface=eth0&dir=edgefleet-hil&link=nft&fleet_iface=IFACE``

- ``iface``: the device's interface towards the fleet (default eth0);
- ``dir``: the device-side working directory, relative to the user's home;
- ``link``: how the uplink is cut: ``nft`` (default) drops the device's traffic to and
  from the fleet's ports, so the SSH session the harness drives it through survives;
  ``ip`` takes ``iface`` down (only when SSH reaches the device over another interface,
  e.g. a Jetson's USB device-mode network 192.168.55.1);
- ``agent``, ``python``: the edge-agent command and the Python it runs on;
- ``fleet_iface``: this machine's interface towards the device, for the throttle fault.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hil import agentconf, shell
from hil.assets import Assets
from hil.device import Device, RunningProc
from hil.errors import CommandFailed, DeviceError, UsageError

LINK_TABLE = "efhil_link"
_OPTS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5")


@dataclass(frozen=True)
class SshTarget:
    """Where and how to reach the device (see the module docstring)."""

    user: str
    host: str
    port: int = 22
    iface: str = "eth0"
    directory: str = "edgefleet-hil"
    link: str = "nft"
    agent: str = "edge-agent"
    python: str = "python3"
    fleet_iface: str | None = None

    @classmethod
    def parse(cls, url: str) -> SshTarget:
        """Parse an ssh:// URL.

        Raises:
            UsageError: not ssh://USER@HOST[:PORT], or an unknown or bad option.
        """
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "ssh" or not parts.hostname or not parts.username:
            raise UsageError("--device", f"{url!r}: give sim or ssh://USER@HOST[:PORT]")
        try:
            port = parts.port or 22
        except ValueError:
            raise UsageError("--device", f"{url!r}: the port is not a number") from None
        query = dict(urllib.parse.parse_qsl(parts.query))
        names = {"iface", "dir", "link", "agent", "python", "fleet_iface"}
        unknown = sorted(set(query) - names)
        if unknown:
            raise UsageError("--device", f"unknown option(s) {unknown} (known: {sorted(names)})")
        link = query.get("link", "nft")
        if link not in ("nft", "ip"):
            raise UsageError("--device", f"link={link!r}: nft or ip")
        return cls(
            user=parts.username,
            host=parts.hostname,
            port=port,
            iface=query.get("iface", "eth0"),
            directory=query.get("dir", "edgefleet-hil"),
            link=link,
            agent=query.get("agent", "edge-agent"),
            python=query.get("python", "python3"),
            fleet_iface=query.get("fleet_iface"),
        )

    def ssh(self, command: str) -> list[str]:
        return ["ssh", *_OPTS, "-p", str(self.port), f"{self.user}@{self.host}", "--", command]


class RemoteProc:
    """A process started on the device in its own session; signalled by id over SSH."""

    def __init__(self, device: SshDevice, pid: int, name: str, log: str) -> None:
        self.device, self.pid, self.name, self.log = device, pid, name, log

    def alive(self) -> bool:
        return self.device.sh(f"kill -0 {self.pid}", check=False).returncode == 0

    def signal(self, sig: int) -> None:
        self.device.sh(f"kill -{int(sig)} {self.pid}", check=False)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        self.device.sh(f"kill -9 -- -{self.pid}", check=False)  # its session's group
        return None

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def tail(self, lines: int = 20) -> str:
        return self.device.sh(f"tail -n {int(lines)} {shlex.quote(self.log)}", check=False).stdout


class SshDevice(Device):
    """A real device (see the module docstring).

    Args:
        fleet: (fleet host, its ports) that a cut uplink must no longer reach.
    """

    kind = "ssh"

    def __init__(
        self, target: SshTarget, device_id: str, fleet: tuple[str, list[int]] | None = None
    ) -> None:
        super().__init__(device_id)
        self.target = target
        self.fleet = fleet
        self._procs: list[RemoteProc] = []
        self._mounts: list[str] = []
        self._home: str | None = None

    # -- plumbing ------------------------------------------------------------------------

    def sh(
        self, command: str, *, check: bool = True, timeout_s: float = 60.0, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command line on the device as the user."""
        argv = self.target.ssh(command)
        return shell.run(argv, check=check, timeout_s=timeout_s, input_text=stdin)

    @property
    def home(self) -> str:
        if self._home is None:
            base = self.sh("echo $HOME").stdout.strip()
            self._home = f"{base}/{self.target.directory}/{self.device_id}"
        return self._home

    @property
    def edge_agent(self) -> str:
        return self.target.agent

    @property
    def python(self) -> str:
        return self.target.python

    @property
    def uplink_iface(self) -> str:
        return self.target.iface

    def profile(self) -> str:
        """The firmware profile the agent detects on the device."""
        code = "from runtime.profiles import load_profile; print(load_profile('auto').name)"
        return self.sh(f"{self.python} -c {shlex.quote(code)}").stdout.strip()

    # -- Device --------------------------------------------------------------------------

    def setup(self) -> None:
        self.sh(f"rm -rf {shlex.quote(self.home)} && mkdir -p {shlex.quote(self.home)}")
        port = agentconf.LOCAL_MQTT_PORT
        if f":{port} " not in self.sh("ss -ltnH", check=False).stdout + " ":
            self.spawn(["mosquitto", "-p", str(port)], name="mosquitto")
            time.sleep(1.0)
        self.start_robot()

    def teardown(self) -> None:
        self.stop_all_agents()
        self.stop_robot()
        for proc in reversed(self._procs):
            proc.stop(5.0)
        self._procs.clear()
        for table in (LINK_TABLE, "efhil_loss"):
            self.run(["nft", "delete", "table", "inet", table], check=False)
        self.run(["tc", "qdisc", "del", "dev", self.uplink_iface, "root"], check=False)
        if self.target.link == "ip":
            self.set_link(True)
        for path in reversed(self._mounts):
            self.umount(path)

    def run(
        self, argv: Sequence[str], *, timeout_s: float = 30.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.sh("sudo -n " + shlex.join(argv), check=check, timeout_s=timeout_s)

    def spawn(
        self, argv: Sequence[str], *, name: str, env: Mapping[str, str] | None = None
    ) -> RunningProc:
        log = f"{self.home}/{name}.log"
        envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        line = (
            f"cd {shlex.quote(self.home)} && {envs} nohup setsid {shlex.join(argv)} "
            f">>{shlex.quote(log)} 2>&1 </dev/null & echo $!"
        )
        out = self.sh(line).stdout.strip()
        if not out.isdigit():
            raise CommandFailed(list(argv), None, f"no pid from the device: {out!r}")
        proc = RemoteProc(self, int(out), name, log)
        self._procs.append(proc)
        return proc

    def stage_assets(self, assets: Assets) -> tuple[str, str]:
        remote = f"{self.home}/assets"
        self.sh(f"mkdir -p {shlex.quote(remote)}")
        dest = f"{self.target.user}@{self.target.host}:{remote}/"
        scp = ["scp", *_OPTS, "-P", str(self.target.port), "-r"]
        shell.run([*scp, str(assets.video), str(assets.bundle), dest], timeout_s=300)
        return f"{remote}/{assets.video.name}", f"{remote}/{assets.bundle.name}"

    def write_file(self, path: str, data: bytes) -> None:
        q = shlex.quote(path)
        parent = shlex.quote(path.rsplit("/", 1)[0] or "/")
        self.sh(f"mkdir -p {parent} && cat > {q}", stdin=data.decode())

    def read_file(self, path: str) -> bytes:
        done = self.sh(f"cat {shlex.quote(path)}", check=False)
        if done.returncode != 0:
            raise DeviceError(self.device_id, f"cannot read {path}: {done.stderr.strip()}")
        return done.stdout.encode()

    def set_link(self, up: bool) -> None:
        if self.target.link == "ip":
            self.run(["ip", "link", "set", self.uplink_iface, "up" if up else "down"])
            return
        if up:
            self.run(["nft", "delete", "table", "inet", LINK_TABLE], check=False)
            return
        if self.fleet is None:
            raise DeviceError(self.device_id, "no fleet address to cut the uplink from")
        host, ports = self.fleet
        plist = "{ " + ", ".join(str(p) for p in ports) + " }"
        self.run(["nft", "add", "table", "inet", LINK_TABLE])
        for chain, hook, rule in (
            ("in", "input", f"ip saddr {host} tcp sport {plist} drop"),
            ("out", "output", f"ip daddr {host} tcp dport {plist} drop"),
        ):
            spec = f"{{ type filter hook {hook} priority 0 ; }}"
            self.run(["nft", "add", "chain", "inet", LINK_TABLE, chain, spec])
            self.run(["nft", "add", "rule", "inet", LINK_TABLE, chain, *rule.split()])

    def host_egress(self) -> tuple[list[str], str] | None:
        return None if self.target.fleet_iface is None else ([], self.target.fleet_iface)

    def query(self, db: str, sql: str) -> list[dict[str, Any]]:
        uri = shlex.quote(f"file:{db}?mode=ro")
        done = self.sh(f"sqlite3 -json {uri} {shlex.quote(sql)}", check=False)
        if done.returncode != 0:
            raise DeviceError(self.device_id, f"sqlite3 {db}: {done.stderr.strip()}")
        rows = json.loads(done.stdout or "[]")
        return [dict(r) for r in rows]

    def mount_tmpfs(self, path: str, size_mb: int) -> None:
        self.sh(f"mkdir -p {shlex.quote(path)}")
        ids = self.sh("echo uid=$(id -u),gid=$(id -g)").stdout.strip()
        opts = f"size={size_mb}m,mode=0700,{ids}"
        self.run(["mount", "-t", "tmpfs", "-o", opts, f"efhil-{self.device_id}", path])
        self._mounts.append(path)

    def umount(self, path: str) -> None:
        self.run(["umount", "-l", path], check=False)
        if path in self._mounts:
            self._mounts.remove(path)

    def enroll(self, url: str, token: str) -> None:
        argv = [self.edge_agent, "enroll", url, "--token", "-", "--config", self.config_path]
        self.sh(shlex.join(argv), stdin=token, timeout_s=120)
