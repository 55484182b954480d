"""WS-Discovery (2005/04, the version ONVIF uses): one Probe for ONVIF
``NetworkVideoTransmitter`` sent to 239.255.255.250:3702 with a multicast TTL of 1 and to
[ff02::c]:3702 with a hop limit of 1, and the ProbeMatch replies read for a bounded time.

Only the local link is ever reached: the TTL and hop limit are 1. IPv4 goes out of the
named interface (``IP_MULTICAST_IF``), else the one the kernel routes the group to; IPv6's
ff02::c is link-scoped, so it goes out of the named interface, else each interface that is
up, multicast-capable and not loopback (at most MAX_LINKS). Both families run by default,
on their own sockets, in the same time window: IPv6 adds no wait. Every receive is bounded
by what is left of the deadline; replies are untrusted: size-capped, parsed by
:mod:`agent.discovery.xmlsafe`, and a reply that can't be read is counted in
:class:`ProbeStats` and skipped, never raised.
"""

from __future__ import annotations

import logging
import selectors
import socket
import struct
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from agent.discovery import xmlsafe
from agent.discovery.errors import DiscoveryError, ProbeNotSent, UntrustedXMLError
from agent.discovery.linklocal import with_zone

log = logging.getLogger(__name__)

GROUP = "239.255.255.250"
GROUP6 = "ff02::c"
PORT = 3702
TTL = 1
"""The multicast TTL (IPv4) and hop limit (IPv6): the probe never leaves the link."""
IP_CHOICES = ("4", "6", "both")
MAX_LINKS = 32
"""At most this many interfaces get an IPv6 probe when none is named."""
SYS_CLASS_NET = Path("/sys/class/net")
IFF_UP, IFF_LOOPBACK, IFF_MULTICAST = 0x1, 0x8, 0x1000  # <linux/if.h>
MAX_REPLY_BYTES = 16 * 1024
"""A ProbeMatches is 1-3 KB; anything over this is counted as oversized and dropped."""
MAX_DATAGRAMS = 1024
"""At most this many datagrams are read in one probe (bounds the loop on a flood)."""
MAX_MATCHES = 256
"""At most this many distinct endpoints are kept."""
REPEAT_AFTER_S = 0.25
"""The Probe is sent twice (SOAP-over-UDP's repeat for multicast), this far apart."""

NS_SOAP = "http://www.w3.org/2003/05/soap-envelope"
NS_ADDR = "http://schemas.xmlsoap.org/ws/2004/08/addressing"
NS_DISC = "http://schemas.xmlsoap.org/ws/2005/04/discovery"
NS_ONVIF_NET = "http://www.onvif.org/ver10/network/wsdl"
ACTION_PROBE = f"{NS_DISC}/Probe"
ACTION_PROBE_MATCHES = f"{NS_DISC}/ProbeMatches"
NVT = "NetworkVideoTransmitter"


@dataclass(frozen=True)
class ProbeMatch:
    """One endpoint that answered: its EndpointReference address, types, scopes, XAddrs
    (the device service URLs) and who sent the reply."""

    endpoint: str
    types: list[str]
    scopes: list[str]
    xaddrs: list[str]
    sender: str

    @property
    def name(self) -> str:
        """The ``onvif://www.onvif.org/name/...`` scope, URL-decoded ("" if none)."""
        return _scope(self.scopes, "name")

    @property
    def hardware(self) -> str:
        """The ``onvif://www.onvif.org/hardware/...`` scope, URL-decoded ("" if none)."""
        return _scope(self.scopes, "hardware")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields, name and hardware included."""
        return {**asdict(self), "name": self.name, "hardware": self.hardware}


@dataclass
class ProbeStats:
    """What one probe saw: datagrams read, and the ones skipped by reason."""

    datagrams: int = 0
    matches: int = 0
    duplicates: int = 0
    oversized: int = 0
    unparsable: int = 0
    unrelated: int = 0
    """Well-formed, but not a ProbeMatches answering this probe's MessageID."""
    not_camera: int = 0
    """A ProbeMatch without the NetworkVideoTransmitter type."""
    truncated: bool = False
    """MAX_DATAGRAMS or MAX_MATCHES was reached before the deadline."""
    elapsed_s: float = 0.0
    interface: str = ""
    ttl: int = TTL
    """IPv4 multicast TTL the probe was sent with (read back from the socket)."""
    hop_limit: int = TTL
    """IPv6 multicast hop limit the probe was sent with (read back from the socket)."""
    families: list[str] = field(default_factory=list)
    """``ipv4``, ``ipv6``: the families a probe socket was opened for."""
    links6: list[str] = field(default_factory=list)
    """The interfaces the IPv6 probe went out of."""
    errors: list[str] = field(default_factory=list)
    """What failed without stopping the probe (one family's socket or send)."""


@dataclass
class ProbeResult:
    """The cameras found, and the probe's stats."""

    matches: list[ProbeMatch] = field(default_factory=list)
    stats: ProbeStats = field(default_factory=ProbeStats)


def _scope(scopes: list[str], kind: str) -> str:
    prefix = f"onvif://www.onvif.org/{kind}/"
    for s in scopes:
        if s.startswith(prefix):
            return unquote(s[len(prefix) :])[:256]
    return ""


def probe_message(message_id: str) -> bytes:
    """The Probe envelope for ONVIF video transmitters, with ``message_id``."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<s:Envelope xmlns:s="{NS_SOAP}" xmlns:a="{NS_ADDR}" xmlns:d="{NS_DISC}" '
        f'xmlns:dn="{NS_ONVIF_NET}">'
        f'<s:Header><a:Action s:mustUnderstand="1">{ACTION_PROBE}</a:Action>'
        f"<a:MessageID>{message_id}</a:MessageID>"
        f"<a:ReplyTo><a:Address>{NS_ADDR}/role/anonymous</a:Address></a:ReplyTo>"
        '<a:To s:mustUnderstand="1">urn:schemas-xmlsoap-org:ws:2005:04:discovery</a:To>'
        f"</s:Header><s:Body><d:Probe><d:Types>dn:{NVT}</d:Types></d:Probe></s:Body>"
        "</s:Envelope>"
    ).encode()


def parse_probe_matches(data: bytes, message_id: str, sender: str) -> list[ProbeMatch]:
    """The ProbeMatch entries of a reply to the probe ``message_id``.

    Raises:
        UntrustedXMLError: the reply is oversized or not XML.
        ValueError: it is XML but not a ProbeMatches relating to ``message_id``.
    """
    root = xmlsafe.parse(data, MAX_REPLY_BYTES)
    if xmlsafe.local(root.tag) != "Envelope":
        raise ValueError("not a SOAP envelope")
    action = xmlsafe.text(xmlsafe.child(root, "Header", "Action"))
    relates = xmlsafe.text(xmlsafe.child(root, "Header", "RelatesTo"))
    if action != ACTION_PROBE_MATCHES or relates != message_id:
        raise ValueError(f"action {action[:80]!r} relating to {relates[:80]!r}")
    return [
        ProbeMatch(
            endpoint=xmlsafe.text(xmlsafe.child(pm, "EndpointReference", "Address")),
            types=xmlsafe.text(xmlsafe.child(pm, "Types")).split()[:32],
            scopes=xmlsafe.text(xmlsafe.child(pm, "Scopes"), 8192).split()[:64],
            xaddrs=xmlsafe.text(xmlsafe.child(pm, "XAddrs"), 8192).split()[:16],
            sender=sender,
        )
        for pm in xmlsafe.descendants(root, "ProbeMatch")[:MAX_MATCHES]
    ]


def _is_camera(m: ProbeMatch) -> bool:
    return any(t.rsplit(":", 1)[-1] == NVT for t in m.types)


def _index(interface: str) -> int:
    try:
        return socket.if_nametoindex(interface)
    except OSError as exc:
        raise DiscoveryError(f"no network interface {interface!r}") from exc


def _socket4(index: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    try:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, TTL)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        if index:
            mreqn = struct.pack("=4s4si", bytes(4), bytes(4), index)  # struct ip_mreqn
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, mreqn)
        sock.bind(("", 0))
    except OSError:
        sock.close()
        raise
    return sock


def _socket6() -> socket.socket:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, TTL)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, 1)
        sock.bind(("::", 0))
    except OSError:
        sock.close()
        raise
    return sock


def links(sys_class_net: Path = SYS_CLASS_NET) -> list[str]:
    """The interfaces an IPv6 probe goes out of when none is named: up, multicast-capable,
    not loopback (``/sys/class/net/*/flags``), at most MAX_LINKS, in index order."""
    out = []
    for index, name in socket.if_nameindex():
        try:
            flags = int((sys_class_net / name / "flags").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if flags & IFF_UP and flags & IFF_MULTICAST and not flags & IFF_LOOPBACK:
            out.append((index, name))
    return [name for _, name in sorted(out)[:MAX_LINKS]]


@dataclass
class _Probe:
    """One probe's sockets and where each sends."""

    message: bytes
    targets: list[tuple[socket.socket, tuple[Any, ...], str]] = field(default_factory=list)

    def send(self, stats: ProbeStats) -> int:
        sent = 0
        for sock, dest, label in self.targets:
            try:
                sock.sendto(self.message, dest)
                sent += 1
            except OSError as exc:
                reason = f"cannot send the probe to {label}: {exc.strerror or exc}"
                if reason not in stats.errors:
                    stats.errors.append(reason)
                log.info("%s", reason)
        return sent


def probe(
    timeout_s: float = 3.0,
    interface: str | None = None,
    *,
    ip: str = "both",
    group: str = GROUP,
    group6: str = GROUP6,
    port: int = PORT,
) -> ProbeResult:
    """Send the Probe (IPv4 to ``group``, IPv6 to ``group6`` on each link, as ``ip`` says:
    ``"4"``, ``"6"`` or ``"both"``) and collect ONVIF cameras' ProbeMatches for
    ``timeout_s`` seconds.

    Raises:
        DiscoveryError: the interface does not exist; :class:`ProbeNotSent` (a
            DiscoveryError) when no probe could be sent at all (no socket, no route to
            either group); with ``both``, one family failing is only recorded in the
            stats' ``errors``.
    """
    if ip not in IP_CHOICES:
        raise DiscoveryError(f"ip must be one of {', '.join(IP_CHOICES)}, not {ip!r}")
    index = _index(interface) if interface else 0
    message_id = f"urn:uuid:{uuid.uuid4()}"
    result = ProbeResult(stats=ProbeStats(interface=interface or ""))
    stats = result.stats
    plan = _Probe(probe_message(message_id))
    socks: list[socket.socket] = []
    try:
        if ip in ("4", "both"):
            try:
                s4 = _socket4(index)
                socks.append(s4)
                stats.ttl = s4.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL)
                plan.targets.append((s4, (group, port), f"{group}:{port}"))
                stats.families.append("ipv4")
            except OSError as exc:
                stats.errors.append(f"no IPv4 probe socket: {exc.strerror or exc}")
        if ip in ("6", "both"):
            try:
                s6 = _socket6()
                socks.append(s6)
                stats.hop_limit = s6.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS)
                stats.links6 = [interface] if interface else links()
                for name in stats.links6:
                    scope = socket.if_nametoindex(name)
                    plan.targets.append((s6, (group6, port, 0, scope), f"[{group6}%{name}]:{port}"))
                stats.families.append("ipv6")
            except OSError as exc:
                stats.errors.append(f"no IPv6 probe socket: {exc.strerror or exc}")
        _collect(plan, socks, timeout_s, message_id, result)
    finally:
        for s in socks:
            s.close()
    return result


def _collect(
    plan: _Probe,
    socks: list[socket.socket],
    timeout_s: float,
    message_id: str,
    result: ProbeResult,
) -> None:
    stats = result.stats
    seen: set[str] = set()
    start = time.monotonic()
    deadline = start + max(0.0, timeout_s)
    if not plan.targets or plan.send(stats) == 0:
        raise ProbeNotSent("; ".join(stats.errors) or "no interface to probe on")
    repeat_at: float | None = start + REPEAT_AFTER_S
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        while stats.datagrams < MAX_DATAGRAMS and len(seen) < MAX_MATCHES:
            now = time.monotonic()
            if now >= deadline:
                break
            if repeat_at is not None and now >= repeat_at:
                repeat_at = None
                plan.send(stats)  # SOAP-over-UDP's repeat; a failure is in stats.errors
            wake = deadline if repeat_at is None else min(deadline, repeat_at)
            for key, _ in sel.select(max(0.001, wake - now)):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data, addr = sock.recvfrom(65535)
                except OSError as exc:  # an ICMP error surfacing on the socket
                    log.info("probe socket: %s", exc)
                    continue
                stats.datagrams += 1
                _take(data, _sender(addr), message_id, result, seen)
        else:
            stats.truncated = True
    stats.matches = len(result.matches)
    stats.elapsed_s = round(time.monotonic() - start, 3)


def _sender(addr: tuple[Any, ...]) -> str:
    """``host:port``; IPv6 as ``[addr%zone]:port`` (the zone for a link-local sender, as
    ``getaddrinfo`` writes it)."""
    if len(addr) == 4:
        host, port, _flow, scope = addr
        if scope and "%" not in host:
            host = f"{host}%{_ifname(scope)}"
        return f"[{host}]:{port}"
    return f"{addr[0]}:{addr[1]}"


def _ifname(index: int) -> str:
    try:
        return socket.if_indextoname(index)
    except OSError:
        return str(index)


def _take(data: bytes, sender: str, message_id: str, result: ProbeResult, seen: set[str]) -> None:
    stats = result.stats
    try:
        matches = parse_probe_matches(data, message_id, sender)
    except UntrustedXMLError as exc:
        if len(data) > MAX_REPLY_BYTES:
            stats.oversized += 1
        else:
            stats.unparsable += 1
        log.info("reply from %s skipped: %s", sender, exc.reason)
        return
    except ValueError as exc:
        stats.unrelated += 1
        log.debug("reply from %s skipped: %s", sender, exc)
        return
    zone = sender.partition("%")[2].partition("]")[0]
    if zone:
        matches = [replace(m, xaddrs=[with_zone(x, zone) for x in m.xaddrs]) for m in matches]
    for m in matches:
        if not _is_camera(m):
            stats.not_camera += 1
        elif (m.endpoint or sender) in seen:
            stats.duplicates += 1
        elif len(seen) < MAX_MATCHES:
            seen.add(m.endpoint or sender)
            result.matches.append(m)
