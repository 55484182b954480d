"""An MQTT sensor outlives what a publisher on the local broker sends it, and says when
it hears nothing: a real Mosquitto, mosquitto_pub, the real :class:`MqttSensor`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent.metrics import AgentMetrics
from agent.mqtt_config import LocalMqttConfig
from agent.sensors import SensorConfig
from agent.sensors.mqtt_source import MqttSensor
from agent.status import sensor_health
from tests.agent.sensors.test_sensors_mqtt import publish, wait_for
from tests.support.broker import Broker

WAIT_S = 10.0


@pytest.fixture
def made() -> Iterator[list[MqttSensor]]:
    sensors: list[MqttSensor] = []
    yield sensors
    for sensor in sensors:
        sensor.stop(timeout_s=5.0)


def _sensor(made: list[MqttSensor], broker: Broker, name: str, **options: Any) -> MqttSensor:
    config = SensorConfig.model_validate(
        {"name": name, "kind": "mqtt", "topic": f"line/{name}", "fields": ["v"], **options}
    )
    sensor = MqttSensor(config, LocalMqttConfig(host=broker.host, port=broker.port))
    sensor.guard.check_s = 0.05
    sensor.start()
    made.append(sensor)
    wait_for(lambda: sensor.up, WAIT_S, f"sensor {name} subscribed")
    return sensor


def _readings(sensor: MqttSensor) -> int:
    return int(sensor.stats()["readings"])


POISON = [
    "[" * 5000 + "]" * 5000,  # RecursionError in a plain json.loads
    '{"v": 1e999}',
    '{"v": "\\ud800"}',
    '{"v": ' + "9" * 5000 + "}",
]


def test_the_sensor_survives_poison_readings_and_reads_the_next_one(
    made: list[MqttSensor], mosquitto: Broker
) -> None:
    sensor = _sensor(made, mosquitto, "poisoned")
    publish(mosquitto, "line/poisoned", *POISON, "21.5")
    wait_for(lambda: _readings(sensor) == 1, WAIT_S, "the good reading after the poison")
    st = sensor.stats()
    assert int(st["bad_readings"]) + int(st["callback_errors"]) == len(POISON)
    assert st["thread_alive"] is True
    assert st["thread_restarts"] == 0
    assert st["up"] is True


def test_an_exception_in_delivery_is_caught_counted_and_the_thread_goes_on(
    made: list[MqttSensor], mosquitto: Broker
) -> None:
    sensor = _sensor(made, mosquitto, "buggy")
    deliver = sensor._deliver
    calls = 0

    def fails_once(*args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OverflowError("a bug downstream of the parser")
        deliver(*args)

    sensor._deliver = fails_once  # type: ignore[method-assign,assignment]
    publish(mosquitto, "line/buggy", "1", "2")
    wait_for(lambda: _readings(sensor) == 1, WAIT_S, "the reading after the failed one")
    st = sensor.stats()
    assert st["callback_errors"] == 1
    assert st["thread_alive"] is True
    assert sensor.guard.last_error.startswith("on_message line/buggy: OverflowError")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_mqtt_thread_is_restarted_and_counted(
    made: list[MqttSensor], mosquitto: Broker
) -> None:
    sensor = _sensor(made, mosquitto, "killed")
    client = sensor._client
    assert client is not None
    guarded = client.on_message

    def unguarded(*_args: Any) -> None:
        client.on_message = guarded  # one shot
        raise RuntimeError("escaped the guard")

    client.on_message = unguarded
    publish(mosquitto, "line/killed", "1")
    assert sensor.guard.wait_restarts(1, WAIT_S)
    wait_for(lambda: sensor.up, WAIT_S, "subscribed again after the restart")
    publish(mosquitto, "line/killed", "2")
    wait_for(lambda: _readings(sensor) == 1, WAIT_S, "a reading after the restart")
    st = sensor.stats()
    assert st["thread_restarts"] == 1
    assert st["thread_alive"] is True
    metrics = AgentMetrics()
    metrics.update_sensor("killed", st)
    text = metrics.render().decode()
    assert 'edgefleet_sensor_thread_restarts_total{sensor="killed"} 1.0' in text


def test_a_silent_sensor_is_reported_and_a_reading_ends_the_silence(
    made: list[MqttSensor], mosquitto: Broker
) -> None:
    sensor = _sensor(made, mosquitto, "quiet", max_silence_s=0.3)
    wait_for(lambda: bool(sensor.stats()["silent"]), WAIT_S, "the sensor reported silent")
    assert sensor.up  # connected and subscribed, and still nothing comes
    health = sensor_health(sensor)
    assert health["silent"] is True
    assert health["up"] is True
    assert health["thread_alive"] is True
    metrics = AgentMetrics()
    metrics.update_sensor("quiet", sensor.stats())
    text = metrics.render().decode()
    assert 'edgefleet_sensor_silent{sensor="quiet"} 1.0' in text
    assert 'edgefleet_sensor_up{sensor="quiet"} 1.0' in text
    assert 'edgefleet_sensor_thread_restarts_total{sensor="quiet"} 0.0' in text
    since = sensor._since
    publish(mosquitto, "line/quiet", "5")
    wait_for(lambda: _readings(sensor) == 1, WAIT_S, "the reading")
    assert sensor._since > since  # the silence is counted from the last reading


def test_max_silence_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_silence_s"):
        SensorConfig.model_validate(
            {"name": "x", "kind": "mqtt", "topic": "t", "fields": ["v"], "max_silence_s": 0}
        )
