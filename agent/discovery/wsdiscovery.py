"""WS-Discovery (2005/04, the version ONVIF uses): one Probe for ONVIF
``NetworkVideoTransmitter`` sent to 239.255.255.250:3702 with a multicast TTL of 1, and
the ProbeMatch replies read for a bounded time.

Only the local link is ever reached: the TTL is 1 and the probe goes out of one interface
when one is named (``IP_MULTICAST_IF`` with the interface index), else the route the kernel
picks for the group. Every receive is bounded by what is left of the deadline; replies are
untrusted: size-capped, parsed by :mod:`agent.discovery.xmlsafe`, and a reply that can't be
read is counted in :class:`ProbeStats` and skipped, never raised.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import unquote

from agent.discovery import xmlsafe
from agent.discovery.errors import DiscoveryError, UntrustedXMLError

log = logging.getLogger(__name__)

GROUP = "239.255.255.250"
PORT = 3702
TTL = 1
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


def _socket(interface: str | None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    try:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, TTL)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        if interface:
            try:
                index = socket.if_nametoindex(interface)
            except OSError as exc:
                raise DiscoveryError(f"no network interface {interface!r}") from exc
            mreqn = struct.pack("=4s4si", bytes(4), bytes(4), index)  # struct ip_mreqn
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, mreqn)
        sock.bind(("", 0))
    except OSError as exc:
        sock.close()
        raise DiscoveryError(f"cannot open the probe socket: {exc}") from exc
    except DiscoveryError:
        sock.close()
        raise
    return sock


def probe(
    timeout_s: float = 3.0,
    interface: str | None = None,
    *,
    group: str = GROUP,
    port: int = PORT,
) -> ProbeResult:
    """Send the Probe and collect ONVIF cameras' ProbeMatches for ``timeout_s`` seconds.

    Raises:
        DiscoveryError: the interface does not exist or the socket can't be opened or
            send (no route to the group, for one).
    """
    message_id = f"urn:uuid:{uuid.uuid4()}"
    message = probe_message(message_id)
    result = ProbeResult(stats=ProbeStats(interface=interface or ""))
    stats = result.stats
    seen: set[str] = set()
    start = time.monotonic()
    deadline = start + max(0.0, timeout_s)
    with _socket(interface) as sock:
        stats.ttl = sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL)
        try:
            sock.sendto(message, (group, port))
        except OSError as exc:
            raise DiscoveryError(f"cannot send the probe to {group}:{port}: {exc}") from exc
        repeat_at: float | None = start + REPEAT_AFTER_S
        while stats.datagrams < MAX_DATAGRAMS and len(seen) < MAX_MATCHES:
            now = time.monotonic()
            if now >= deadline:
                break
            if repeat_at is not None and now >= repeat_at:
                repeat_at = None
                try:
                    sock.sendto(message, (group, port))
                except OSError as exc:
                    log.warning("probe repeat not sent: %s", exc)
            wake = deadline if repeat_at is None else min(deadline, repeat_at)
            sock.settimeout(max(0.001, wake - now))
            try:
                data, addr = sock.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError as exc:  # an ICMP error surfacing on the socket
                log.info("probe socket: %s", exc)
                continue
            stats.datagrams += 1
            _take(data, f"{addr[0]}:{addr[1]}", message_id, result, seen)
        else:
            stats.truncated = True
    stats.matches = len(result.matches)
    stats.elapsed_s = round(time.monotonic() - start, 3)
    return result


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
    for m in matches:
        if not _is_camera(m):
            stats.not_camera += 1
        elif (m.endpoint or sender) in seen:
            stats.duplicates += 1
        elif len(seen) < MAX_MATCHES:
            seen.add(m.endpoint or sender)
            result.matches.append(m)
