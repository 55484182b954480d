"""Sensors: numeric readings from a local MQTT topic or a replayed file, windowed into
float32 tensors for tabular and time-series models.

    sensor = make_sensor(SensorConfig(name="temp", kind="mqtt", topic="line1/temp",
                                      fields=["value"], window=8, stride=4), mqtt_config)
    sensor.start()
    window = sensor.latest(timeout_s=1.0)   # SensorWindow or None; values (1, 8, 1)
    sensor.stop()
"""

from agent.sensors.base import SensorSource, SensorStats
from agent.sensors.config import SensorConfig
from agent.sensors.factory import make_sensor
from agent.sensors.mqtt_source import MqttSensor
from agent.sensors.parse import BadReading, parse_payload
from agent.sensors.replay import ReplaySensor
from agent.sensors.window import SensorWindow, Windower

__all__ = [
    "BadReading",
    "MqttSensor",
    "ReplaySensor",
    "SensorConfig",
    "SensorSource",
    "SensorStats",
    "SensorWindow",
    "Windower",
    "make_sensor",
    "parse_payload",
]
