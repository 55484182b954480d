"""Sensor readings: config validation, payload parsing, windowing into tensors."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from agent.errors import SensorError
from agent.mqtt_config import LocalMqttConfig
from agent.sensors import BadReading, SensorConfig, Windower, make_sensor, parse_payload
from agent.sensors.parse import parse_csv_row


def _fields(exc: ValidationError) -> list[str]:
    return [".".join(str(p) for p in e["loc"]) for e in exc.errors()]


# --- config ------------------------------------------------------------------------------


def test_sensor_config_defaults_and_every_field_is_documented() -> None:
    c = SensorConfig(name="t", kind="mqtt", topic="line1/temp", fields=["value"])
    assert (c.window, c.stride, c.rate_hz, c.loop) == (1, 1, 10.0, True)
    for name, field in SensorConfig.model_fields.items():
        assert field.description, f"{name} has no description"


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"kind": "mqtt", "fields": ["v"]}, "topic", "topic is required"),
        ({"kind": "mqtt", "topic": "line1/#", "fields": ["v"]}, "topic", "wildcard"),
        ({"kind": "replay", "fields": ["v"]}, "path", "path is required"),
        ({"kind": "replay", "path": "r.txt", "fields": ["v"]}, "path", "must end with"),
        ({"kind": "replay", "path": "r.csv", "fields": []}, "fields", "at least 1"),
        ({"kind": "replay", "path": "r.csv", "fields": ["a", "a"]}, "fields", "repeat"),
        ({"kind": "replay", "path": "r.csv", "fields": ["a"], "window": 0}, "window", ""),
        ({"kind": "replay", "path": "r.csv", "fields": ["a"], "stride": 0}, "stride", ""),
        ({"kind": "replay", "path": "r.csv", "fields": ["a"], "rate_hz": 0}, "rate_hz", ""),
        ({"kind": "replay", "path": "r.csv", "fields": ["a"], "rate": 5}, "rate", ""),
        ({"kind": "modbus", "fields": ["a"]}, "kind", ""),
    ],
)
def test_bad_sensor_config_is_refused_naming_the_field(
    data: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(ValidationError) as info:
        SensorConfig.model_validate({"name": "s1", **data})
    assert field in _fields(info.value)
    assert message in str(info.value)


def test_mqtt_sensor_without_broker_settings_is_a_sensor_error() -> None:
    config = SensorConfig(name="s1", kind="mqtt", topic="a/b", fields=["v"])
    with pytest.raises(SensorError, match="needs the local MQTT broker"):
        make_sensor(config, None)
    assert make_sensor(config, LocalMqttConfig()).name == "s1"


# --- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"21.5", [21.5]),
        (b"  -3 \n", [-3.0]),
        (b"1e3", [1000.0]),
        (b".5", [0.5]),  # a bare number JSON would not take
        (b'{"v": 7, "other": "ignored"}', [7.0]),
        ("42", [42.0]),
    ],
)
def test_one_field_readings_from_bare_numbers_json_numbers_and_objects(
    payload: bytes | str, expected: list[float]
) -> None:
    assert parse_payload(payload, ["v"], "s").tolist() == expected


def test_json_object_gives_the_fields_in_configured_order() -> None:
    values = parse_payload(b'{"b": 2.5, "a": 1, "c": -1}', ["c", "a", "b"], "s")
    assert values.tolist() == [-1.0, 1.0, 2.5]


@pytest.mark.parametrize(
    ("payload", "fields", "reason"),
    [
        (b"", ["v"], "empty payload"),
        (b"hot", ["v"], "not a number or JSON"),
        (b"NaN", ["v"], "expected a number"),
        (b"nan", ["v"], "not a number or JSON"),
        (b"1e999", ["v"], "expected a number"),
        (b"true", ["v"], "expected a number"),
        (b'"21.5"', ["v"], "expected a number"),
        (b"[1, 2]", ["a", "b"], "expected a number or a JSON object"),
        (b"5", ["a", "b"], "a bare number, but 2 fields"),
        (b'{"a": 1}', ["a", "b"], "field 'b' is missing"),
        (b'{"a": 1, "b": "x"}', ["a", "b"], "field 'b' is not a finite number"),
        (b'{"a": NaN, "b": 1}', ["a", "b"], "NaN is not a JSON number"),
        (b'{"a": null, "b": 1}', ["a", "b"], "field 'a' is not a finite number"),
        (b"\xff\xfe", ["v"], "not UTF-8"),
    ],
)
def test_garbage_payloads_are_bad_readings_that_say_why(
    payload: bytes, fields: list[str], reason: str
) -> None:
    with pytest.raises(BadReading) as info:
        parse_payload(payload, fields, "s9")
    assert reason in info.value.reason
    assert info.value.source == "s9"


def test_csv_row_picks_the_configured_columns_and_refuses_bad_rows() -> None:
    assert parse_csv_row(["1", "x", " 2.5 "], [2, 0], 3, ["p", "t"], "s").tolist() == [2.5, 1.0]
    with pytest.raises(BadReading, match="2 columns, the header has 3"):
        parse_csv_row(["1", "2"], [0], 3, ["t"], "s")
    with pytest.raises(BadReading, match="field 't' is not a finite number: 'inf'"):
        parse_csv_row(["inf", "1", "2"], [0], 3, ["t"], "s")
    with pytest.raises(BadReading, match="field 't' is not a finite number: ''"):
        parse_csv_row(["", "1", "2"], [0], 3, ["t"], "s")


# --- windowing -----------------------------------------------------------------------------


def test_window_of_one_gives_one_row_per_reading() -> None:
    w = Windower(n_fields=3, window=1, stride=1)
    out = w.push(np.array([1.0, 2.0, 3.0]))
    assert out is not None
    assert out.shape == (1, 3)
    assert out.dtype == np.float32
    assert out.tolist() == [[1.0, 2.0, 3.0]]
    assert not out.flags.writeable


def test_window_emits_when_full_then_every_stride_readings() -> None:
    w = Windower(n_fields=2, window=3, stride=2)
    emitted = []
    for i in range(9):
        out = w.push(np.array([i, 10 * i], np.float64))
        if out is not None:
            emitted.append((i, out))
    assert [i for i, _ in emitted] == [2, 4, 6, 8]
    for i, out in emitted:
        assert out.shape == (1, 3, 2)
        assert out.dtype == np.float32
        assert out[0, :, 0].tolist() == [i - 2, i - 1, i]  # oldest first
        assert out[0, :, 1].tolist() == [10 * (i - 2), 10 * (i - 1), 10 * i]


def test_stride_longer_than_window_skips_readings_between_windows() -> None:
    w = Windower(n_fields=1, window=2, stride=5)
    got = [out[0, :, 0].tolist() for i in range(12) if (out := w.push(np.array([i]))) is not None]
    assert got == [[0, 1], [5, 6], [10, 11]]


def test_reset_starts_a_new_window_from_scratch() -> None:
    w = Windower(n_fields=1, window=3, stride=1)
    for i in range(3):
        w.push(np.array([i]))
    w.reset()
    assert w.push(np.array([7])) is None
    assert w.push(np.array([8])) is None
    out = w.push(np.array([9]))
    assert out is not None
    assert out[0, :, 0].tolist() == [7, 8, 9]


def test_windower_refuses_a_reading_of_the_wrong_width() -> None:
    w = Windower(n_fields=2, window=1, stride=1)
    with pytest.raises(ValueError, match="reshape"):
        w.push(np.array([1.0, 2.0, 3.0]))
