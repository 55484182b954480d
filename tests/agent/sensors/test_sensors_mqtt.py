"""MQTT sensors against a real Mosquitto, fed by mosquitto_pub: readings, garbage,
windows, and a broker that goes away and comes back."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.mqtt_config import LocalMqttConfig
from agent.sensors import SensorConfig, SensorSource, SensorWindow, make_sensor
from tests.support.broker import Broker, free_port


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def publish(broker: Broker, topic: str, *payloads: str) -> None:
    """Each payload as one message, in order, by one mosquitto_pub (-l: a line each)."""
    subprocess.run(
        ["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), "-t", topic, "-l"],
        input="".join(f"{p}\n" for p in payloads).encode(),
        check=True,
        timeout=10,
    )


@pytest.fixture
def sensors() -> Iterator[list[SensorSource]]:
    started: list[SensorSource] = []
    yield started
    for sensor in started:
        sensor.stop(timeout_s=5.0)


def subscribe(
    sensors: list[SensorSource], broker: Broker, name: str, topic: str, **options: object
) -> SensorSource:
    config = SensorConfig.model_validate({"name": name, "kind": "mqtt", "topic": topic, **options})
    sensor = make_sensor(config, LocalMqttConfig(host=broker.host, port=broker.port))
    sensor.start()
    sensors.append(sensor)
    wait_for(lambda: sensor.up, 10, f"sensor {name} subscribed")
    return sensor


def test_bare_number_payloads_arrive_as_one_field_windows(
    sensors: list[SensorSource], mosquitto: Broker
) -> None:
    sensor = subscribe(sensors, mosquitto, "temp1", "line1/temp1", fields=["value"])
    publish(mosquitto, "line1/temp1", "21.5")
    window = sensor.latest(10.0)
    assert window is not None
    assert window.sensor == "temp1"
    assert window.values.shape == (1, 1)
    assert window.values.dtype == np.float32
    assert window.values.tolist() == [[21.5]]
    assert 0 < time.perf_counter_ns() - window.t_capture_ns < 10 * 10**9


def test_json_payloads_fill_windows_and_garbage_is_counted_not_lost(
    sensors: list[SensorSource], mosquitto: Broker
) -> None:
    sensor = subscribe(
        sensors, mosquitto, "press1", "line1/press1", fields=["p", "t"], window=3, stride=3
    )
    publish(
        mosquitto,
        "line1/press1",
        '{"p": 1.0, "t": 10}',
        "garbage",
        '{"p": 2.0}',
        '{"p": 2.0, "t": 20}',
        '{"p": NaN, "t": 1}',
        "7",
        '{"t": 30, "p": 3.0, "unit": "bar"}',
    )
    window = sensor.latest(10.0)
    assert window is not None
    assert window.values.shape == (1, 3, 2)
    assert window.values[0].tolist() == [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]
    wait_for(lambda: sensor.stats()["bad_readings"] == 4, 10, "the garbage counted")
    stats = sensor.stats()
    assert (stats["readings"], stats["windows"], stats["up"]) == (3, 1, True)


def test_slow_consumer_gets_the_newest_window_and_the_rest_count_as_dropped(
    sensors: list[SensorSource], mosquitto: Broker
) -> None:
    sensor = subscribe(sensors, mosquitto, "vib1", "line1/vib1", fields=["v"])
    publish(mosquitto, "line1/vib1", *[str(i) for i in range(20)])
    wait_for(lambda: sensor.stats()["readings"] == 20, 10, "all readings")
    window = sensor.latest(5.0)
    assert window is not None
    assert window.values.tolist() == [[19.0]]
    assert window.seq == 19
    assert sensor.stats()["dropped"] == 19
    assert sensor.latest(0.1) is None


def test_sensor_reads_again_after_the_broker_restarts(
    sensors: list[SensorSource], own_mosquitto: Broker
) -> None:
    sensor = subscribe(sensors, own_mosquitto, "flow1", "line2/flow", fields=["v"])
    publish(own_mosquitto, "line2/flow", "1.5")
    first = sensor.latest(10.0)
    assert first is not None
    assert first.values.tolist() == [[1.5]]

    own_mosquitto.stop()
    wait_for(lambda: not sensor.up, 10, "the sensor to notice the broker is gone")
    assert "disconnected from broker" in str(sensor.stats()["last_error"])
    own_mosquitto.start()
    wait_for(lambda: sensor.up, 20, "the sensor to reconnect and subscribe again")

    publish(own_mosquitto, "line2/flow", "2.5")
    again: SensorWindow | None = sensor.latest(10.0)
    assert again is not None
    assert again.values.tolist() == [[2.5]]
    assert again.seq == first.seq + 1
    assert int(sensor.stats()["errors"]) >= 1


def test_sensor_started_before_its_broker_connects_when_the_broker_comes(
    sensors: list[SensorSource], tmp_path: Path
) -> None:
    workdir = tmp_path / "late-broker"
    workdir.mkdir()
    broker = Broker("127.0.0.1", free_port(), workdir)
    config = SensorConfig(name="late1", kind="mqtt", topic="line3/late", fields=["v"])
    sensor = make_sensor(config, LocalMqttConfig(host=broker.host, port=broker.port))
    sensor.start()  # no broker yet: must not raise
    sensors.append(sensor)
    try:
        wait_for(lambda: int(sensor.stats()["errors"]) >= 1, 10, "a failed connect")
        assert not sensor.up
        assert "can't connect to broker" in str(sensor.stats()["last_error"])
        broker.start()
        wait_for(lambda: sensor.up, 20, "the sensor to connect")
        publish(broker, "line3/late", "3")
        window = sensor.latest(10.0)
        assert window is not None
        assert window.values.tolist() == [[3.0]]
    finally:
        broker.stop()


def test_stop_is_bounded_and_wakes_a_waiting_consumer(
    sensors: list[SensorSource], mosquitto: Broker
) -> None:
    sensor = subscribe(sensors, mosquitto, "idle1", "line1/idle", fields=["v"])
    start = time.monotonic()
    sensor.stop(timeout_s=3.0)
    assert time.monotonic() - start < 3.5
    assert sensor.latest(1.0) is None
    assert not sensor.up
