"""The client's address and scheme behind reverse proxies the configuration trusts.

``X-Forwarded-For`` and ``X-Forwarded-Proto`` are anyone's to send: they are believed
only when the direct peer is in ``[auth] trusted_proxies`` (default: nobody). Then
``X-Forwarded-For`` is read right to left, each hop that is itself a trusted proxy
skipped; the first other address is the client (a client can prepend what it likes,
but not past the proxy that appended the real peer). The sign-in lockout counts by
this address, and the session cookie's ``Secure`` follows the forwarded scheme.

Pure (no HTTP framework here): :class:`fleet_server.api.forwarded.ForwardedMiddleware`
applies :func:`client_address` to each request's ``client`` and ``scheme`` (uvicorn's
own proxy-header handling is off, see ``fleet_server/serve.py``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_HOPS = 32
"""At most this many X-Forwarded-For entries are looked at (the rightmost)."""
_MAX_ADDRESS = 64


def parse_networks(values: Iterable[str]) -> list[Network]:
    """CIDR blocks (a bare address is a /32 or /128).

    Raises:
        ValueError: an entry is not an address or a CIDR block, naming it.
    """
    out: list[Network] = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{value!r} is not an address or CIDR block like 10.0.0.0/8") from None
    return out


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_trusted(address: str, trusted: Sequence[Network]) -> bool:
    """Whether ``address`` is in one of ``trusted``."""
    ip = _ip(address)
    return ip is not None and any(ip in net for net in trusted)


def client_address(peer: str, forwarded_for: Sequence[str], trusted: Sequence[Network]) -> str:
    """The client: ``peer`` unless it is trusted, else the rightmost untrusted hop of
    ``forwarded_for`` (the header's values, in order), else its leftmost hop."""
    if not trusted or not is_trusted(peer, trusted):
        return peer
    hops = [h.strip() for value in forwarded_for for h in value.split(",") if h.strip()]
    hops = hops[-MAX_HOPS:]
    for hop in reversed(hops):
        if not is_trusted(hop, trusted):
            return hop[:_MAX_ADDRESS]
    return hops[0][:_MAX_ADDRESS] if hops else peer


def throttle_key(address: str) -> str:
    """The key an address is throttled by: itself, or its /64 for IPv6 (one host often
    holds a whole /64)."""
    ip = _ip(address)
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip) if ip is not None else address
