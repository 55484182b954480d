"""Building a sensor source from its configuration."""

from __future__ import annotations

from agent.errors import SensorError
from agent.mqtt_config import LocalMqttConfig
from agent.sensors.base import SensorSource
from agent.sensors.config import SensorConfig
from agent.sensors.mqtt_source import MqttSensor
from agent.sensors.replay import ReplaySensor


def make_sensor(config: SensorConfig, mqtt: LocalMqttConfig | None) -> SensorSource:
    """The source for ``config.kind`` (not started).

    Raises:
        SensorError: an mqtt sensor without local broker settings.
    """
    if config.kind == "mqtt":
        if mqtt is None:
            raise SensorError(config.name, "an mqtt sensor needs the local MQTT broker settings")
        return MqttSensor(config, mqtt)
    return ReplaySensor(config)
