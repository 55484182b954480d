"""PLC driver registry.

Each driver module declares ``KEY``, a config model and a :class:`Driver` class. The
registry imports them lazily: a driver whose library can't be imported on this device is
reported as unavailable with the reason, never a crash (the runtime's backends do the
same). Config models live in :mod:`agent.line.drivers.configs`, which imports no
protocol library, so every configuration loads on every device.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from agent.line.drivers.base import Driver, LinkConfig, Point
from agent.line.errors import LineError

__all__ = ["Driver", "DriverInfo", "LinkConfig", "Point", "available_drivers", "driver_class"]

# key -> (module, class name)
DRIVERS: dict[str, tuple[str, str]] = {
    "opcua": ("agent.line.drivers.opcua", "OpcUaDriver"),
    "modbus": ("agent.line.drivers.modbus", "ModbusDriver"),
    "logix": ("agent.line.drivers.logix", "LogixDriver"),
    "s7": ("agent.line.drivers.s7", "S7Driver"),
    "mqtt": ("agent.line.drivers.mqtt", "MqttDriver"),
}


@dataclass(frozen=True)
class DriverInfo:
    key: str
    available: bool
    reason: str  # why not, or "ok"


def driver_class(key: str, link: str = "") -> type[Driver]:
    """Import and return a driver class.

    Raises:
        LineError: ``unavailable``: unknown key, or its library can't be imported here.
    """
    try:
        module_name, class_name = DRIVERS[key]
    except KeyError:
        raise LineError(
            link or key, "unavailable", f"unknown driver {key!r} (known: {', '.join(DRIVERS)})"
        ) from None
    try:
        module = importlib.import_module(module_name)
        cls: type[Driver] = getattr(module, class_name)
        cls.check_library()
    except LineError:
        raise
    except Exception as exc:  # ImportError, ABI errors ... all mean "unavailable"
        raise LineError(link or key, "unavailable", f"{type(exc).__name__}: {exc}") from exc
    return cls


def available_drivers() -> list[DriverInfo]:
    """Every known driver, with whether its library imports here and why not."""
    infos = []
    for key in DRIVERS:
        try:
            driver_class(key)
        except LineError as exc:
            infos.append(DriverInfo(key, False, exc.detail))
        else:
            infos.append(DriverInfo(key, True, "ok"))
    return infos
