"""IPv6 link-local addresses in URLs: a camera that answers a WS-Discovery probe over IPv6
often names itself ``http://[fe80::...]/onvif/device_service``, with no zone, and such an
address means nothing without the interface it lives on. The zone of the interface its
reply came in on is added in RFC 6874's form, ``[fe80::1%25eth0]`` (``urllib`` unquotes
the host, so a bare ``%eth0`` would be read as a percent-escape); ``%eth0`` is read too."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit, urlunsplit


def zone(url: str) -> str:
    """The zone of ``url``'s IPv6 host ("" when none, or not an IPv6 literal)."""
    netloc = urlsplit(url).netloc.rpartition("@")[2]
    if not netloc.startswith("[") or "]" not in netloc:
        return ""
    host = netloc[1 : netloc.index("]")].replace("%25", "%")
    return host.partition("%")[2]


def with_zone(url: str, zone_name: str) -> str:
    """``url`` with ``zone_name`` added to its host when that is a link-local IPv6 literal
    without a zone (written ``%25ZONE``); any other URL as it is."""
    if not zone_name:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    if not hostport.startswith("[") or "]" not in hostport:
        return url
    end = hostport.index("]")
    host, rest = hostport[1:end].replace("%25", "%"), hostport[end + 1 :]
    address, _, have = host.partition("%")
    try:
        link_local = ipaddress.IPv6Address(address).is_link_local
    except ValueError:
        return url
    if not link_local:
        return url
    netloc = f"[{address}%25{have or zone_name}]{rest}"
    if userinfo:
        netloc = f"{userinfo}@{netloc}"
    return urlunsplit(parts._replace(netloc=netloc))
