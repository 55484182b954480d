"""Fault injectors: each puts one real fault on a device (or the fleet) and takes it away.

``apply()`` puts the fault on, ``clear()`` takes it off (both idempotent, also usable as
a context manager); ``unavailable()`` says why an injector can't work here (None when it
can), and ``record()`` is what the report shows: the method used and its figures.

Network faults act on the device's uplink only: the local broker, the robot and the
agent's HTTP endpoint stay reachable on the device's loopback. Packet loss and latency
use ``tc netem`` where the kernel has it (both directions where the harness holds the
fleet side of the link); without sch_netem, loss falls back to nftables rules in the
device (``numgen random mod 100 < N drop`` on the uplink, in and out, with counters),
and latency is unavailable, with the reason.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from hil import shell
from hil.device import Device
from hil.errors import CommandFailed, FaultUnavailable
from hil.fleet import Fleet

NFT_TABLE = "efhil_loss"


class Fault(ABC):
    """One injector (see the module docstring)."""

    name: ClassVar[str]
    summary: ClassVar[str]

    def __init__(self) -> None:
        self.method = ""
        self.active = False
        self.figures: dict[str, Any] = {}
        self._since = 0.0
        self.applied_s = 0.0

    def unavailable(self) -> str | None:
        """Why this injector can't work here; None when it can."""
        return None

    def apply(self) -> None:
        """Put the fault on.

        Raises:
            FaultUnavailable: it can't work here (see :meth:`unavailable`).
            CommandFailed: a command that puts it on failed.
        """
        if self.active:
            return
        why = self.unavailable()
        if why is not None:
            raise FaultUnavailable(self.name, why)
        self._apply()
        self.active = True
        self._since = time.monotonic()

    def clear(self) -> None:
        """Take the fault off (idempotent).

        Raises:
            CommandFailed: a command that takes it off failed.
        """
        if not self.active:
            return
        self._clear()
        self.active = False
        self.applied_s += time.monotonic() - self._since

    @abstractmethod
    def _apply(self) -> None: ...

    @abstractmethod
    def _clear(self) -> None: ...

    def record(self) -> dict[str, Any]:
        """What the report shows of this fault."""
        return {
            "fault": self.name,
            "method": self.method,
            "applied_s": round(self.applied_s, 2),
            **self.figures,
        }

    def __enter__(self) -> Fault:
        self.apply()
        return self

    def __exit__(self, *exc: object) -> None:
        self.clear()


class LinkDown(Fault):
    """The device's uplink cable pulled (its switch port down), then plugged again."""

    name = "link-down"
    summary = "uplink down/up (ip link set ... down/up)"

    def __init__(self, device: Device) -> None:
        super().__init__()
        self.device = device
        self.method = "ip link"

    def _apply(self) -> None:
        self.device.set_link(False)

    def _clear(self) -> None:
        self.device.set_link(True)


def _netem_targets(device: Device) -> list[tuple[list[str], str, Device | None]]:
    """Where netem goes: the device's uplink egress, and the fleet side's egress towards
    the device where the harness holds it (both directions then)."""
    out: list[tuple[list[str], str, Device | None]] = [([], device.uplink_iface, device)]
    host = device.host_egress()
    if host is not None:
        out.append((host[0], host[1], None))
    return out


def _tc(device: Device | None, prefix: list[str], args: list[str]) -> None:
    argv = [*prefix, "tc", *args]
    if device is not None:
        device.run(argv)
    else:
        shell.run(argv)


class _Netem(Fault):
    """netem on every egress the harness holds; ``netem_args`` says what it does."""

    def __init__(self, device: Device) -> None:
        super().__init__()
        self.device = device
        self._netem_error: str | None = None
        self._done: list[tuple[list[str], str, Device | None]] = []

    @abstractmethod
    def netem_args(self) -> list[str]: ...

    def netem_missing(self) -> str | None:
        """Why netem can't be used on the device (None when it can): probed by adding
        and removing a harmless netem qdisc."""
        if self._netem_error is None:
            iface = self.device.uplink_iface
            try:
                _tc(
                    self.device, [], ["qdisc", "add", "dev", iface, "root", "netem", "delay", "0ms"]
                )
                _tc(self.device, [], ["qdisc", "del", "dev", iface, "root"])
                self._netem_error = ""
            except CommandFailed as exc:
                self._netem_error = exc.output or str(exc)
        return self._netem_error or None

    def _apply_netem(self) -> None:
        targets = _netem_targets(self.device)
        for prefix, iface, dev in targets:
            _tc(
                dev, prefix, ["qdisc", "replace", "dev", iface, "root", "netem", *self.netem_args()]
            )
            self._done.append((prefix, iface, dev))
        self.method = "tc netem"
        self.figures["directions"] = "both" if len(targets) > 1 else "device->fleet"

    def _clear_netem(self) -> None:
        while self._done:
            prefix, iface, dev = self._done.pop()
            _tc(dev, prefix, ["qdisc", "del", "dev", iface, "root"])


class PacketLoss(_Netem):
    """``percent`` % of the uplink's packets dropped, both ways."""

    name = "packet-loss"
    summary = "packet loss on the uplink (tc netem; nftables numgen where netem is missing)"

    def __init__(self, device: Device, percent: int) -> None:
        super().__init__(device)
        if not 0 < percent < 100:
            raise ValueError(f"packet loss {percent}% is not in (0, 100)")
        self.percent = percent
        self.figures["percent"] = percent
        self._tables: list[tuple[str, Device | None, list[str], str, str]] = []

    def netem_args(self) -> list[str]:
        return ["loss", f"{self.percent}%"]

    def _nft(self, dev: Device | None, prefix: list[str], args: list[str]) -> str:
        argv = [*prefix, "nft", *args]
        return (dev.run(argv) if dev is not None else shell.run(argv)).stdout

    def _apply(self) -> None:
        why = self.netem_missing()
        if why is None:
            self._apply_netem()
            return
        # netdev ingress hooks drop a packet as the wire would: before any stack sees
        # it, and the sender is not told. Fleet to device: ingress of the device's
        # uplink; device to fleet: ingress of the fleet side's end where the harness
        # holds it, else the device's output hook (its sender then gets EPERM).
        drop = ["numgen", "random", "mod", "100", "<", str(self.percent), "counter", "drop"]
        dev, iface = self.device, self.device.uplink_iface
        plan: list[tuple[str, Device | None, list[str], str, str]] = [
            ("in", dev, [], iface, "ingress")
        ]
        host = dev.host_egress()
        plan.append(("out", None, host[0], host[1], "ingress") if host else
                    ("out", dev, [], iface, "output"))  # fmt: skip
        for direction, runner, prefix, where, hook in plan:
            table = f"{NFT_TABLE}_{where}"
            if hook == "ingress":
                family, spec = (
                    "netdev",
                    f'{{ type filter hook ingress device "{where}" priority 0 ; }}',
                )
                match = []
            else:
                family, spec = "inet", "{ type filter hook output priority 0 ; }"
                match = ["oifname", where]
            self._nft(runner, prefix, ["add", "table", family, table])
            self._tables.append((direction, runner, prefix, family, table))
            self._nft(runner, prefix, ["add", "chain", family, table, "loss", spec])
            self._nft(runner, prefix, ["add", "rule", family, table, "loss", *match, *drop])
        self.method = "nftables numgen"
        self.figures["directions"] = "both"
        self.figures["netem_missing"] = why

    def dropped(self) -> dict[str, int]:
        """Packets the nftables rules dropped so far, per direction ({} with netem)."""
        counts: dict[str, int] = {}
        for direction, runner, prefix, family, table in self._tables:
            out = self._nft(runner, prefix, ["-j", "list", "table", family, table])
            for item in json.loads(out or "{}").get("nftables", []):
                for expr in (item.get("rule") or {}).get("expr", []):
                    if "counter" in expr:
                        counts[direction] = int(expr["counter"]["packets"])
        return counts

    def _clear(self) -> None:
        if self.method == "tc netem":
            self._clear_netem()
            return
        self.figures["dropped_packets"] = self.dropped()
        while self._tables:
            _, runner, prefix, family, table = self._tables.pop()
            self._nft(runner, prefix, ["delete", "table", family, table])


class Latency(_Netem):
    """``ms`` of added delay on the uplink (tc netem only)."""

    name = "latency"
    summary = "added latency on the uplink (tc netem; unavailable without sch_netem)"

    def __init__(self, device: Device, ms: float) -> None:
        super().__init__(device)
        self.ms = ms
        self.figures["delay_ms"] = ms

    def netem_args(self) -> list[str]:
        return ["delay", f"{self.ms:g}ms"]

    def unavailable(self) -> str | None:
        why = self.netem_missing()
        if why is None:
            return None
        return f"tc netem does not work here ({why}); nftables can drop but not delay packets"

    def _apply(self) -> None:
        self._apply_netem()

    def _clear(self) -> None:
        self._clear_netem()


class Throttle(Fault):
    """The fleet-to-device direction limited to ``kbit`` kbit/s (tc tbf on the fleet
    side's end of the link): a download then lasts long enough to be cut."""

    name = "throttle"
    summary = "fleet->device bandwidth limit (tc tbf)"

    def __init__(self, device: Device, kbit: int) -> None:
        super().__init__()
        self.device = device
        self.kbit = kbit
        self.method = "tc tbf"
        self.figures["kbit_s"] = kbit

    def unavailable(self) -> str | None:
        if self.device.host_egress() is None:
            return "the harness holds no fleet-side end of this device's link"
        return None

    def _apply(self) -> None:
        host = self.device.host_egress()
        assert host is not None  # unavailable() said so
        rate = ["rate", f"{self.kbit}kbit", "burst", "16kb", "latency", "2s"]
        _tc(None, host[0], ["qdisc", "replace", "dev", host[1], "root", "tbf", *rate])

    def _clear(self) -> None:
        host = self.device.host_egress()
        assert host is not None
        _tc(None, host[0], ["qdisc", "del", "dev", host[1], "root"])


class BrokerRestart(Fault):
    """The fleet broker (the managed Mosquitto) stopped, then started again: fleet-server
    is stopped with SIGTERM and started as its service manager would (Mosquitto saves its
    sessions and queued messages on the way down)."""

    name = "broker-restart"
    summary = "fleet broker restart (fleet-server and its managed Mosquitto)"

    def __init__(self, fleet: Fleet) -> None:
        super().__init__()
        self.fleet = fleet
        self.method = "fleet-server SIGTERM + start"

    def _apply(self) -> None:
        self.fleet.stop()

    def _clear(self) -> None:
        self.figures["start_s"] = round(self.fleet.start(), 2)


class AgentKill(Fault):
    """The agent's main process SIGKILLed (a crash), then started again."""

    name = "agent-kill"
    summary = "agent SIGKILL, then restart"

    def __init__(self, device: Device) -> None:
        super().__init__()
        self.device = device
        self.method = "SIGKILL"

    def _apply(self) -> None:
        self.device.kill_agent()

    def _clear(self) -> None:
        self.device.start_agent()
