"""Replay sensors on real files: CSV and JSON lines with garbage in them, paced, looped."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.errors import SensorError
from agent.sensors import SensorConfig, SensorSource, SensorWindow, make_sensor


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture
def sensors() -> Iterator[list[SensorSource]]:
    started: list[SensorSource] = []
    yield started
    for sensor in started:
        sensor.stop(timeout_s=5.0)


def replay(sensors: list[SensorSource], path: Path, **options: object) -> SensorSource:
    config = SensorConfig.model_validate(
        {"name": "r1", "kind": "replay", "path": str(path), **options}
    )
    sensor = make_sensor(config, None)
    sensor.start()
    sensors.append(sensor)
    return sensor


CSV = """\
time,temp,pressure
0,20.5,101.0
1,abc,101.1
2,21.0,101.2

3,21.5
4,nan,101.4
5,22.0,101.5
6,,101.6
7,22.5,101.7,extra
8,23.0,101.8
"""
# good rows: lines 2, 4, 8, 12; garbage: lines 3, 6, 7, 9, 10 (line 5 is blank)
CSV_GOOD = [[20.5, 101.0], [21.0, 101.2], [22.0, 101.5], [23.0, 101.8]]
CSV_BAD_LINES = [3, 6, 7, 9, 10]


def test_csv_replay_skips_and_counts_garbage_rows_and_delivers_the_rest_in_order(
    sensors: list[SensorSource], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "line1.csv"
    path.write_text(CSV)
    caplog.set_level(logging.WARNING, logger="agent.sensors")
    # one window holding every good reading shows them all, in order, values right
    sensor = replay(sensors, path, fields=["temp", "pressure"], window=4, rate_hz=200, loop=False)
    window = sensor.latest(10.0)
    assert window is not None
    assert window.sensor == "r1"
    assert window.seq == 0
    assert window.values.shape == (1, 4, 2)
    assert window.values.dtype == np.float32
    np.testing.assert_allclose(window.values[0], CSV_GOOD, rtol=1e-6)
    wait_for(lambda: not sensor.up, 10, "the end of the file")
    stats = sensor.stats()
    assert stats["readings"] == 4
    assert stats["bad_readings"] == len(CSV_BAD_LINES)
    assert stats["windows"] == 1
    logged = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(logged) == len(CSV_BAD_LINES)
    for lineno, message in zip(CSV_BAD_LINES, logged, strict=True):
        assert f"{path} line {lineno}:" in message


JSONL = """\
{"temp": 20.0, "rpm": 1500}
not json at all
{"temp": 20.5}
{"temp": "warm", "rpm": 1500}
{"temp": NaN, "rpm": 1500}
{"temp": 21.0, "rpm": 1510, "note": "extra keys are fine"}
42

[1, 2]
{"rpm": 1520, "temp": 21.5}
"""
JSONL_GOOD = [[20.0, 1500.0], [21.0, 1510.0], [21.5, 1520.0]]
JSONL_BAD_LINES = [2, 3, 4, 5, 7, 9]


def test_jsonl_replay_skips_and_counts_garbage_lines_and_delivers_the_rest(
    sensors: list[SensorSource], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "motor.jsonl"
    path.write_text(JSONL)
    caplog.set_level(logging.WARNING, logger="agent.sensors")
    sensor = replay(sensors, path, fields=["temp", "rpm"], window=3, rate_hz=200, loop=False)
    window = sensor.latest(10.0)
    assert window is not None
    assert window.values.shape == (1, 3, 2)
    np.testing.assert_allclose(window.values[0], JSONL_GOOD)
    wait_for(lambda: not sensor.up, 10, "the end of the file")
    stats = sensor.stats()
    assert (stats["readings"], stats["bad_readings"]) == (3, len(JSONL_BAD_LINES))
    text = caplog.text
    for lineno in JSONL_BAD_LINES:
        assert f"{path} line {lineno}:" in text
    assert "field 'rpm' is missing" in text
    assert "a bare number, but 2 fields" in text


def test_replay_windows_have_the_configured_shape_and_stride(
    sensors: list[SensorSource], tmp_path: Path
) -> None:
    path = tmp_path / "ramp.jsonl"
    path.write_text("".join(f"{i}\n" for i in range(10)))
    sensor = replay(sensors, path, fields=["v"], window=4, stride=3, rate_hz=50, loop=False)
    windows: list[SensorWindow] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(windows) + int(sensor.stats()["dropped"]) < 3:
        window = sensor.latest(0.5)
        if window is not None:
            windows.append(window)
    wait_for(lambda: not sensor.up, 10, "the end of the file")
    assert sensor.stats()["windows"] == 3  # at readings 3, 6, 9 (0-based)
    assert windows
    for window in windows:
        assert window.values.shape == (1, 4, 1)
        end = 3 + 3 * window.seq
        assert window.values[0, :, 0].tolist() == [end - 3, end - 2, end - 1, end]
    assert [w.seq for w in windows] == sorted({w.seq for w in windows})


def test_window_of_one_reading_is_a_row_per_reading(
    sensors: list[SensorSource], tmp_path: Path
) -> None:
    path = tmp_path / "table.csv"
    path.write_text("a,b,c\n1,2,3\n")
    sensor = replay(sensors, path, fields=["c", "a"], rate_hz=100, loop=False)
    window = sensor.latest(10.0)
    assert window is not None
    assert window.values.shape == (1, 2)
    assert window.values.tolist() == [[3.0, 1.0]]
    assert window.t_capture_ns <= time.perf_counter_ns()


def test_looped_replay_starts_over_and_keeps_counting(
    sensors: list[SensorSource], tmp_path: Path
) -> None:
    path = tmp_path / "short.csv"
    path.write_text("v\n1\n2\noops\n3\n")
    sensor = replay(sensors, path, fields=["v"], rate_hz=400, loop=True)
    wait_for(lambda: int(sensor.stats()["readings"]) >= 9, 10, "three passes")
    assert sensor.up
    stats = sensor.stats()
    readings, bad = int(stats["readings"]), int(stats["bad_readings"])
    # one bad line per pass of three good ones: counted on every pass, never lost
    assert readings // 3 - 1 <= bad <= readings // 3 + 1
    window = sensor.latest(5.0)
    assert window is not None
    assert window.values[0, 0] in (1.0, 2.0, 3.0)


def test_replay_is_paced_at_rate_hz(sensors: list[SensorSource], tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    path.write_text("".join(f"{i}\n" for i in range(1000)))
    sensor = replay(sensors, path, fields=["v"], rate_hz=20, loop=False)
    wait_for(lambda: int(sensor.stats()["readings"]) > 0, 10, "the first reading")
    start_count, start = int(sensor.stats()["readings"]), time.monotonic()
    time.sleep(1.0)
    count = int(sensor.stats()["readings"]) - start_count
    assert count <= 20 * (time.monotonic() - start) + 2
    assert count >= 3


def test_missing_replay_file_is_a_sensor_error_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.csv"
    sensor = make_sensor(
        SensorConfig(name="gone", kind="replay", path=str(missing), fields=["v"]), None
    )
    with pytest.raises(SensorError) as info:
        sensor.start()
    assert str(missing) in str(info.value)
    assert "does not exist" in str(info.value)
    assert info.value.source == "gone"


def test_csv_header_without_a_configured_field_is_a_sensor_error(tmp_path: Path) -> None:
    path = tmp_path / "cols.csv"
    path.write_text("temp,pressure\n1,2\n")
    sensor = make_sensor(
        SensorConfig(name="cols", kind="replay", path=str(path), fields=["temp", "rpm"]), None
    )
    with pytest.raises(SensorError, match="no column 'rpm' in the header"):
        sensor.start()


def test_file_of_only_garbage_is_reported_down_and_retried_not_spun_on(
    sensors: list[SensorSource], tmp_path: Path
) -> None:
    path = tmp_path / "junk.jsonl"
    path.write_text("x\ny\n")
    sensor = replay(sensors, path, fields=["v"], rate_hz=1000, loop=True)
    wait_for(lambda: int(sensor.stats()["errors"]) >= 1, 10, "the empty pass")
    time.sleep(0.3)
    stats = sensor.stats()
    assert not stats["up"]
    assert "no valid reading" in str(stats["last_error"])
    assert int(stats["bad_readings"]) <= 4  # backing off (1 s), not looping flat out
    path.write_text("5\n")  # fixed: the next pass delivers
    wait_for(lambda: sensor.up, 10, "the sensor up again")
    window = sensor.latest(5.0)
    assert window is not None
    assert window.values.tolist() == [[5.0]]
