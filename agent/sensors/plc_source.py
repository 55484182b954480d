"""A sensor read from a PLC: every ``1 / rate_hz`` seconds one reading of its points
(OPC UA nodes, Modbus registers, Logix tags, S7 DB values), through a connection of its
own to the ``[[plc]]`` it names (:class:`agent.line.link.PlcLink`: backoff, timeouts,
reason words). A sensor model then runs on robot and PLC data like on MQTT readings.

While the PLC is unreachable the sensor is down (its window starts again when it is
back: a window never spans a gap); a value that is not a finite number is a bad reading.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from agent.errors import SensorError
from agent.line.drivers.base import LinkConfig
from agent.line.link import PlcLink
from agent.line.points import parse_point
from agent.sensors.base import SensorSource
from agent.sensors.config import SensorConfig


class PlcSensor(SensorSource):
    """Readings of ``config.points`` from the PLC ``link``."""

    def __init__(self, config: SensorConfig, link: LinkConfig, **driver_kw: Any) -> None:
        super().__init__(config)
        driver = str(getattr(link, "driver", ""))
        try:
            points = [parse_point(driver, p.point, p.type) for p in config.points]
        except ValueError as exc:
            raise SensorError(config.name, f"plc '{link.name}': {exc}") from None
        self._link = PlcLink(link, driver_kw=driver_kw or None, on_failure=self._failed)
        self._link.add_group(points, 1.0 / config.rate_hz, self._values, on_lost=self._lost)

    def start(self) -> None:
        self._link.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._link.stop(timeout_s)
        self._slot.close()
        self._set_up(False, "stopped", failure=False)

    def stats(self) -> dict[str, Any]:
        stats = dict(super().stats())
        stats["plc"] = self._link.name
        return stats

    def _values(self, values: list[Any], seen_ns: int) -> None:
        self._set_up(True, "reading")
        numbers = []
        for field, value in zip(self.config.fields, values, strict=True):
            number = float(value) if isinstance(value, int | float) else math.nan
            if not math.isfinite(number):
                self._reject(field, f"{value!r} is not a finite number")
                return
            numbers.append(number)
        self._deliver(np.asarray(numbers, dtype=np.float32), seen_ns, time.time())

    def _failed(self, reason: str, detail: str) -> None:
        self._count_error(f"{reason}: {detail}")

    def _lost(self) -> None:
        self._set_up(False, "plc connection lost")
        self._reset_window()
