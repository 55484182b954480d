"""The simulated factory network: a bridge in this machine's namespace (the LAN the fleet
server listens on) and one network namespace per device, joined to the bridge by a veth
pair whose host end is the device's "switch port".

Names start with ``efhil`` (namespaces ``efhil-<n>``, the bridge ``efhil-br``, veth ends
``efh<n>h`` on the host and ``efh<n>d`` in the device), so :func:`cleanup_stale` can
remove what a crashed run left behind without touching anything else. Needs root (or
CAP_NET_ADMIN and CAP_SYS_ADMIN); :func:`netns_supported` says whether this user may.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import signal
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from hil import shell
from hil.errors import CommandFailed, HilError

PREFIX = "efhil"
BRIDGE = f"{PREFIX}-br"
_CANDIDATES = tuple(ipaddress.IPv4Network(f"10.{b}.{c}.0/24") for b in (231, 232) for c in range(8))
MAX_DEVICES = 200
SUBNET_LOCK = Path("/run/lock/efhil-subnet.lock")
"""Held while a free /24 is picked and its bridge made: ``hil run`` and the tests' LANs
(``make test`` and ``make hil`` run side by side in CI) never pick the same one."""


def _ip(*args: str, timeout_s: float = 10.0) -> str:
    return shell.run(["ip", *args], timeout_s=timeout_s).stdout


def netns_supported() -> str | None:
    """None when this user can make network namespaces here, else why not."""
    if shell.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except CommandFailed as exc:
        return f"`ip netns add` fails for uid {os.geteuid()}: {exc.output or exc}"
    try:
        _ip("netns", "del", probe)
    except CommandFailed as exc:
        return f"`ip netns del` fails: {exc.output or exc}"
    return None


def _addresses() -> list[ipaddress.IPv4Network]:
    out = json.loads(_ip("-j", "-4", "addr", "show") or "[]")
    nets = [
        ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False)
        for link in out
        for a in link.get("addr_info", [])
    ]
    for route in json.loads(_ip("-j", "-4", "route", "show") or "[]"):
        dst = route.get("dst", "default")
        if dst != "default":
            nets.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
    return nets


def pick_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.231-232.0-7.0 that no address or route on this machine overlaps.

    Raises:
        HilError: all of them are taken.
    """
    used = _addresses()
    for net in _CANDIDATES:
        if not any(net.overlaps(u) for u in used):
            return net
    raise HilError("no free /24 for the simulated LAN in 10.231-232.0-7.0/24")


def create_lan(name: str = BRIDGE) -> Lan:
    """A bridge ``name`` on a free /24 (:func:`pick_subnet`), picked and made under
    :data:`SUBNET_LOCK`, so that two processes making a LAN at once never share a subnet.

    Raises:
        HilError: no free /24.
        CommandFailed: ``ip`` refused (no bridge support, not root).
    """
    SUBNET_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with SUBNET_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lan = Lan(pick_subnet(), name=name)
        try:
            lan.create()
        except BaseException:
            lan.destroy()
            raise
    return lan


def cleanup_stale(names: Collection[str] | None = None) -> list[str]:
    """Remove namespaces, links and tmpfs mounts named ``efhil*`` (a crashed run's), after
    killing the processes left in those namespaces; returns what was removed. With
    ``names``, only those namespaces (and their host ends) go."""
    removed: list[str] = []
    for mount in Path("/proc/mounts").read_text().splitlines() if names is None else []:
        source, target = mount.split()[:2]
        if source.startswith(PREFIX):
            shell.run(["umount", "-l", target], check=False)
            removed.append(f"mount {target}")
    hosts: set[str] = set()
    for ns in json.loads(_ip("-j", "netns", "list") or "[]"):
        name = ns.get("name", "")
        if not name.startswith(PREFIX) or (names is not None and name not in names):
            continue
        hosts.add(f"efh{name.removeprefix(PREFIX + '-')}h")
        pids = shell.run(["ip", "netns", "pids", name], check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        shell.run(["ip", "netns", "del", name], check=False)
        removed.append(f"netns {name}" + (f" ({len(pids)} processes killed)" if pids else ""))
    for link in json.loads(_ip("-j", "link", "show") or "[]"):
        name = link.get("ifname", "")
        if name in hosts or (names is None and name.startswith(("efh", PREFIX))):
            shell.run(["ip", "link", "del", name], check=False)
            removed.append(f"link {name}")
    return removed


@dataclass
class Lan:
    """The bridge ``efhil-br`` with the fleet's address (the subnet's first host)."""

    subnet: ipaddress.IPv4Network
    name: str = BRIDGE
    up: bool = False

    @property
    def host_ip(self) -> str:
        return str(self.subnet.network_address + 1)

    def device_ip(self, index: int) -> str:
        """The address of device ``index`` (0-based)."""
        if not 0 <= index < MAX_DEVICES:
            raise HilError(f"device index {index} is not in [0, {MAX_DEVICES})")
        return str(self.subnet.network_address + 10 + index)

    def create(self) -> None:
        """Create the bridge and give it the fleet's address.

        Raises:
            CommandFailed: ``ip`` refused (no bridge support, not root).
        """
        _ip("link", "add", self.name, "type", "bridge")
        self.up = True
        _ip("addr", "add", f"{self.host_ip}/{self.subnet.prefixlen}", "dev", self.name)
        _ip("link", "set", self.name, "up")

    def destroy(self) -> None:
        """Remove the bridge (idempotent)."""
        if self.up:
            shell.run(["ip", "link", "del", self.name], check=False)
            self.up = False


@dataclass
class Netns:
    """One device's namespace on the LAN: ``index`` picks its names and address."""

    lan: Lan
    index: int
    created: bool = False

    @property
    def name(self) -> str:
        return f"{PREFIX}-{self.index}"

    @property
    def host_end(self) -> str:
        return f"efh{self.index}h"

    @property
    def device_end(self) -> str:
        return f"efh{self.index}d"

    @property
    def ip(self) -> str:
        return self.lan.device_ip(self.index)

    def exec_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def create(self) -> None:
        """The namespace, its loopback, the veth pair (host end on the bridge) and the
        device's address. On a failure what was made is removed again.

        Raises:
            CommandFailed: a step failed.
        """
        try:
            _ip("netns", "add", self.name)
            self.created = True
            _ip("link", "add", self.host_end, "type", "veth", "peer", "name", self.device_end)
            _ip("link", "set", self.device_end, "netns", self.name)
            _ip("link", "set", self.host_end, "master", self.lan.name)
            _ip("link", "set", self.host_end, "up")
            inside = ["-n", self.name]
            _ip(*inside, "link", "set", "lo", "up")
            cidr = f"{self.ip}/{self.lan.subnet.prefixlen}"
            _ip(*inside, "addr", "add", cidr, "dev", self.device_end)
            _ip(*inside, "link", "set", self.device_end, "up")
        except CommandFailed:
            self.destroy()
            raise

    def set_link(self, up: bool) -> None:
        """Plug (``up``) or pull the device's cable: its switch port goes up or down.

        Raises:
            CommandFailed: ``ip`` refused.
        """
        _ip("link", "set", self.host_end, "up" if up else "down")

    def link_up(self) -> bool:
        """Whether the switch port is up."""
        out = json.loads(_ip("-j", "link", "show", self.host_end) or "[]")
        return bool(out) and "UP" in out[0].get("flags", [])

    def pids(self) -> list[int]:
        """Processes running in the namespace."""
        out = shell.run(["ip", "netns", "pids", self.name], check=False).stdout
        return [int(p) for p in out.split()]

    def destroy(self) -> None:
        """Kill what still runs inside, delete the namespace and the host end (idempotent)."""
        if not self.created:
            return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shell.run(["ip", "netns", "del", self.name], check=False)
        shell.run(["ip", "link", "del", self.host_end], check=False)
        self.created = False
