"""OPC UA node ids as a station's configuration spells them, checked without asyncua (so
check-config runs on a device that lacks it); asyncua parses them again when the driver
uses them (:mod:`agent.line.drivers.opcua`).

Forms: ``ns=2;s=Name``, ``ns=2;i=5``, ``i=85``, ``nsu=<uri>;s=Name``, ``ns=1;g=<guid>``,
``ns=1;b=<base64>`` (a string identifier may hold ``;`` and ``=``).
"""

from __future__ import annotations

import base64
import binascii
import re

from agent.line.drivers.base import Point
from agent.line.values import VALUE_TYPES, ValueType

MAX_ADDRESS_CHARS = 256
"""The longest node id accepted (a station's point is at most this long too)."""
VARIANT_NAMES: dict[str, str] = {
    "bool": "Boolean",
    "int16": "Int16",
    "uint16": "UInt16",
    "int32": "Int32",
    "uint32": "UInt32",
    "int64": "Int64",
    "float32": "Float",
    "float64": "Double",
    "string": "String",
}
"""The OPC UA built-in type (``ua.VariantType`` name) of each value type."""

_GUID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")
_UINT32_MAX = (1 << 32) - 1


def parse_point(address: str, vtype: ValueType) -> Point:
    """``address`` as an OPC UA node id for a value of ``vtype`` (the syntax only: whether
    the node exists and holds that type is the server's to say).

    Raises:
        ValueError: not a node id (what is wrong is named), too long, or not a value type.
    """
    if vtype not in VALUE_TYPES:
        raise ValueError(f"unknown value type {vtype!r} (known: {', '.join(VALUE_TYPES)})")
    if not address:
        raise ValueError("an OPC UA node id can't be empty")
    if len(address) > MAX_ADDRESS_CHARS:
        raise ValueError(f"an OPC UA node id is at most {MAX_ADDRESS_CHARS} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in address):
        raise ValueError(f"OPC UA node id {address!r} contains a control character")
    rest = address
    if address.startswith("ns="):
        ns, sep, rest = address[3:].partition(";")
        if not sep or not ns.isdigit() or len(ns) > 5 or int(ns) > 0xFFFF:
            raise ValueError(
                f"OPC UA node id {address!r}: `ns=` takes a namespace index 0..65535 "
                "followed by `;` (`ns=2;s=Name`)"
            )
    elif address.startswith("nsu="):
        uri, sep, rest = address[4:].partition(";")
        if not sep or not uri.strip():
            raise ValueError(
                f"OPC UA node id {address!r}: `nsu=` takes a namespace URI followed by `;` "
                "(`nsu=urn:acme:plc;s=Name`)"
            )
    _check_identifier(address, rest)
    return Point(address, vtype, address)


def _check_identifier(address: str, ident: str) -> None:
    kind, sep, value = ident.partition("=")
    if not sep or kind not in ("i", "s", "g", "b"):
        raise ValueError(
            f"OPC UA node id {address!r}: the identifier must be `i=<number>`, `s=<name>`, "
            "`g=<guid>` or `b=<base64>`"
        )
    if kind == "i":
        if not value.isdigit() or len(value) > 10 or int(value) > _UINT32_MAX:
            raise ValueError(f"OPC UA node id {address!r}: `i=` takes a number 0..{_UINT32_MAX}")
    elif kind == "s":
        if not value:
            raise ValueError(f"OPC UA node id {address!r}: `s=` takes a non-empty name")
    elif kind == "g":
        if not _GUID.fullmatch(value):
            raise ValueError(
                f"OPC UA node id {address!r}: `g=` takes a GUID "
                "(`72962B91-FA75-4AE6-8D28-B404DC7DAF63`)"
            )
    elif not value or value.startswith("0x"):
        raise ValueError(f"OPC UA node id {address!r}: `b=` takes a base64 byte string")
    else:
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(
                f"OPC UA node id {address!r}: `b=` takes a base64 byte string"
            ) from None
