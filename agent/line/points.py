"""Parse an address in a driver's syntax without importing its protocol library, so
check-config can refuse a bad address on a device that lacks the library.

Each driver module keeps its address syntax in a ``parse_point(address, vtype)`` function
at module level that imports nothing but the standard library and :mod:`agent.line`.
"""

from __future__ import annotations

import importlib

from agent.line.drivers import DRIVERS
from agent.line.drivers.base import Point
from agent.line.values import ValueType


def parse_point(driver: str, address: str, vtype: ValueType) -> Point:
    """``address`` parsed by ``driver``'s syntax for a value of ``vtype``.

    Raises:
        ValueError: not an address of that protocol, or the type can't live there.
    """
    module_name, _ = DRIVERS[driver]
    module = importlib.import_module(module_name)
    point: Point = module.parse_point(address, vtype)
    return point


def writable(driver: str, point: Point) -> bool:
    """Whether ``driver`` can write ``point`` (a Modbus discrete input or input register
    can't); a driver without a ``writable`` function writes every address it parses."""
    module_name, _ = DRIVERS[driver]
    check = getattr(importlib.import_module(module_name), "writable", None)
    return True if check is None else bool(check(point))
