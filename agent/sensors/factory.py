"""Building a sensor source from its configuration."""

from __future__ import annotations

from collections.abc import Mapping

from agent.errors import SensorError
from agent.line.drivers.base import LinkConfig
from agent.mqtt_config import LocalMqttConfig
from agent.sensors.base import SensorSource
from agent.sensors.config import SensorConfig
from agent.sensors.mqtt_source import MqttSensor
from agent.sensors.plc_source import PlcSensor
from agent.sensors.replay import ReplaySensor


def make_sensor(
    config: SensorConfig,
    mqtt: LocalMqttConfig | None,
    plc: Mapping[str, LinkConfig] | None = None,
) -> SensorSource:
    """The source for ``config.kind`` (not started); ``plc``: the ``[[plc]]``
    connections by name, for a plc sensor.

    Raises:
        SensorError: an mqtt sensor without local broker settings, a plc sensor whose
            connection is not given or whose points don't parse.
    """
    if config.kind == "plc":
        link = (plc or {}).get(config.plc)
        if link is None:
            raise SensorError(config.name, f"no [[plc]] connection '{config.plc}'")
        extra = {"mqtt": mqtt} if getattr(link, "driver", "") == "mqtt" else {}
        return PlcSensor(config, link, **extra)
    if config.kind == "mqtt":
        if mqtt is None:
            raise SensorError(config.name, "an mqtt sensor needs the local MQTT broker settings")
        return MqttSensor(config, mqtt)
    return ReplaySensor(config)
