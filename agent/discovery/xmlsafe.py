"""The one entry point for XML that comes from the network (WS-Discovery replies, ONVIF
SOAP responses): a size cap, no DTD at all (so no entity expansion and no external
entities), then a tree.

The DTD is refused by the parser itself (expat's doctype, entity and external-entity
handlers), after it has decoded the document in whatever encoding it declares (UTF-8,
UTF-16 with or without a byte order mark, ISO-8859-1, US-ASCII): a byte search for
``<!DOCTYPE`` sees only one encoding and lets a UTF-16 DTD through.

Why not defusedxml: refusing any DTD gives the same protection for SOAP, which never
carries one (SOAP 1.2 part 1, 5: "must not contain a DTD"), without a new dependency.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import NoReturn
from xml.parsers import expat

from agent.discovery.errors import UntrustedXMLError

_DTD = "a DTD (SOAP messages carry none)"


class _Refused(Exception):
    """Raised inside the parser's handlers to stop at a DTD."""


def _refuse(*_args: object) -> NoReturn:
    raise _Refused(_DTD)


def _name(raw: str) -> str:
    """expat's ``uri}local`` (namespace_separator "}") as ElementTree's ``{uri}local``."""
    return "{" + raw if "}" in raw else raw


def _tree(data: bytes) -> ET.Element:
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate(namespace_separator="}")
    parser.buffer_text = True
    parser.StartDoctypeDeclHandler = _refuse
    parser.EntityDeclHandler = _refuse
    parser.UnparsedEntityDeclHandler = _refuse
    parser.NotationDeclHandler = _refuse
    parser.ExternalEntityRefHandler = _refuse
    parser.StartElementHandler = lambda tag, attrs: builder.start(
        _name(tag), {_name(k): v for k, v in attrs.items()}
    )
    parser.EndElementHandler = lambda tag: builder.end(_name(tag))
    parser.CharacterDataHandler = builder.data
    parser.Parse(data, True)
    return builder.close()


def parse(data: bytes, max_bytes: int) -> ET.Element:
    """Parse ``data`` as an XML document of at most ``max_bytes`` bytes.

    Raises:
        UntrustedXMLError: too large, has a DTD, or is not well-formed XML.
    """
    if len(data) > max_bytes:
        raise UntrustedXMLError(f"{len(data)} bytes, more than {max_bytes}")
    try:
        return _tree(data)
    except _Refused as exc:
        raise UntrustedXMLError(str(exc)) from None
    except expat.ExpatError as exc:
        raise UntrustedXMLError(f"not well-formed: {exc}") from exc
    except (ValueError, UnicodeError, RecursionError, AssertionError) as exc:
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
