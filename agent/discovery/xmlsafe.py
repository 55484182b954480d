"""The one entry point for XML that comes from the network (WS-Discovery replies, ONVIF
SOAP responses): a size cap, no DTD at all (so no entity expansion and no external
entities), then the standard library's expat parser.

Why not defusedxml: refusing any ``<!DOCTYPE`` before parsing gives the same protection for
SOAP, which never carries a DTD (SOAP 1.2 part 1, 5: "must not contain a DTD"), without a
new dependency.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from agent.discovery.errors import UntrustedXMLError


def parse(data: bytes, max_bytes: int) -> ET.Element:
    """Parse ``data`` as an XML document of at most ``max_bytes`` bytes.

    Raises:
        UntrustedXMLError: too large, has a DTD, or is not well-formed XML.
    """
    if len(data) > max_bytes:
        raise UntrustedXMLError(f"{len(data)} bytes, more than {max_bytes}")
    if b"<!doctype" in data.lower() or b"<!entity" in data.lower():
        raise UntrustedXMLError("a DTD (SOAP messages carry none)")
    try:
        return ET.fromstring(data)  # noqa: S314 - size-capped, DTD refused above
    except ET.ParseError as exc:
        raise UntrustedXMLError(f"not well-formed: {exc}") from exc
    except (ValueError, UnicodeError, RecursionError) as exc:
        raise UntrustedXMLError(f"not parsable: {type(exc).__name__}") from exc


def local(tag: str) -> str:
    """The local name of ``{namespace}name``."""
    return tag.rsplit("}", 1)[-1]


def children(node: ET.Element, name: str) -> list[ET.Element]:
    """Direct children of ``node`` with local name ``name``, whatever their namespace
    (cameras differ in the namespaces and prefixes they use)."""
    return [c for c in node if local(c.tag) == name]


def child(node: ET.Element, *path: str) -> ET.Element | None:
    """The first element along ``path`` of local names, or None."""
    cur: ET.Element | None = node
    for name in path:
        if cur is None:
            return None
        found = children(cur, name)
        cur = found[0] if found else None
    return cur


def descendants(node: ET.Element, name: str) -> list[ET.Element]:
    """Every descendant of ``node`` with local name ``name``, in document order."""
    return [e for e in node.iter() if local(e.tag) == name and e is not node]


def text(node: ET.Element | None, max_chars: int = 2048) -> str:
    """The stripped text of ``node`` ("" for None), cut at ``max_chars``."""
    if node is None or node.text is None:
        return ""
    return node.text.strip()[:max_chars]
