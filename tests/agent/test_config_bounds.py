"""Bad local configuration is refused at load, naming the file and the field: ids that
can't be a topic level, numbers out of any sane range, a state_dir that is a file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import MAX_CONFIG_BYTES, load_config
from agent.kernel.configbase import MAX_MB
from agent.kernel.errors import ConfigError


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "agent.toml"
    text = f'[agent]\nstate_dir = "state"\n{body}' if "[agent]" not in body else body
    path.write_text(text, encoding="utf-8")
    return path


def test_a_plain_config_loads(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, 'device_id = "cam-01.line_2"\n'))
    assert cfg.agent.device_id == "cam-01.line_2"
    assert cfg.agent.state_dir == tmp_path / "state"


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ('device_id = "a/b"\n', "agent.device_id", "is not a device id"),
        ('device_id = "line#1"\n', "agent.device_id", "is not a device id"),
        ('device_id = "+"\n', "agent.device_id", "is not a device id"),
        ('device_id = ""\n', "agent.device_id", "is not a device id"),
        (f'device_id = "{"x" * 10_000}"\n', "agent.device_id", "10000 characters"),
        ("disk_budget_mb = 1e30\n", "agent.disk_budget_mb", f"less than or equal to {MAX_MB}"),
        ("disk_budget_mb = nan\n", "agent.disk_budget_mb", "finite number"),
        ("disk_budget_mb = inf\n", "agent.disk_budget_mb", "finite number"),
        ("[runtime]\nworkers = 100000\n", "runtime.workers", "less than or equal to 256"),
        ("[runtime]\nworkers = 0\n", "runtime.workers", "greater than or equal to 1"),
        ("[runtime]\nheartbeat_timeout_s = -1\n", "runtime.heartbeat_timeout_s", "greater"),
        ("[runtime]\nheartbeat_timeout_s = inf\n", "runtime.heartbeat_timeout_s", "finite"),
        ("[decision_log]\nbudget_mb = 1e30\n", "decision_log.budget_mb", "less than"),
        ("[decision_log]\nmax_age_days = 1e300\n", "decision_log.max_age_days", "less than"),
        ("[decision_log]\nflush_interval_s = nan\n", "decision_log.flush_interval_s", "finite"),
        ("[decision_log]\nqueue_bound = 10000000000\n", "decision_log.queue_bound", "less"),
        ("[mqtt]\nport = 70000\n", "mqtt.port", "less than or equal to 65535"),
        ("[mqtt]\nport = 0\n", "mqtt.port", "greater than or equal to 1"),
        ("[uplink]\nbroker_port = -1\n", "uplink.broker_port", "greater than or equal to 1"),
        ("[uplink]\nheartbeat_interval_s = -inf\n", "uplink.heartbeat_interval_s", "finite"),
        ("[uplink]\noutbox_max_mb = 1e30\n", "uplink.outbox_max_mb", "less than"),
        ("[bundles]\nfetch_timeout_s = 1e300\n", "bundles.fetch_timeout_s", "less than"),
        (
            "[bundles.installer]\nhealth_window_s = nan\n",
            "bundles.installer.health_window_s",
            "finite",
        ),
        ("[bundles.installer]\nrun_timeout_s = 1e9\n", "bundles.installer.run_timeout_s", "less"),
    ],
)
def test_out_of_range_values_are_refused_naming_file_and_field(
    tmp_path: Path, body: str, field: str, words: str
) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.path == str(path)
    assert info.value.field == field
    assert words in info.value.reason
    assert len(str(info.value)) < 400


def test_a_state_dir_that_is_a_file_is_refused_at_load(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a directory")
    path = _write(tmp_path, "")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert (info.value.path, info.value.field) == (str(path), "agent.state_dir")
    assert "exists and is not a directory" in info.value.reason


def test_a_state_dir_under_a_file_is_refused_and_one_that_can_be_made_is_taken(
    tmp_path: Path,
) -> None:
    (tmp_path / "blocker").write_text("x")
    path = _write(tmp_path, '[agent]\nstate_dir = "blocker/state"\n')
    with pytest.raises(ConfigError, match=r"can't be created: .*blocker is not a directory"):
        load_config(path)
    path = _write(tmp_path, '[agent]\nstate_dir = "new/deeper/state"\n')
    assert load_config(path).agent.state_dir == tmp_path / "new/deeper/state"
    assert not (tmp_path / "new").exists()  # checking makes nothing


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\xff\xfe[agent]\n", "not UTF-8"),
        (b"a = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "not valid TOML"),
        (b"a = " + b"9" * 5000 + b"\n", "not valid TOML"),
        (b"# " + b"x" * MAX_CONFIG_BYTES + b"\n", "over the limit"),
    ],
)
def test_files_that_are_not_small_utf8_toml_are_one_config_error(
    tmp_path: Path, content: bytes, words: str
) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.path == str(path)
    assert words in info.value.reason


def test_check_config_reports_a_bad_field_in_one_line_and_fails(tmp_path: Path) -> None:
    path = _write(tmp_path, '[agent]\ndevice_id = "a/b"\nstate_dir = "s"\n[runtime]\n')
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert str(path) in lines[0]
    assert "agent.device_id" in lines[0]


def test_the_deprecated_fleet_section_is_read_as_bundles_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path, '[fleet]\nenabled = true\ninitial_root = "root.json"\n')
    with caplog.at_level("WARNING", logger="agent.config"):
        cfg = load_config(path)
    assert cfg.bundles.enabled
    assert cfg.bundles.initial_root == tmp_path / "root.json"  # still taken from the file's dir
    assert "[fleet] is deprecated" in caplog.text
    assert "rename it [bundles]" in caplog.text


def test_fleet_and_bundles_together_are_refused_naming_the_field(tmp_path: Path) -> None:
    path = _write(tmp_path, "[fleet]\nenabled = true\n[bundles]\nenabled = false\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert (info.value.path, info.value.field) == (str(path), "fleet")
    assert "give only [bundles]" in info.value.reason


def test_a_bad_field_under_the_deprecated_name_is_reported_as_written(tmp_path: Path) -> None:
    path = _write(tmp_path, "[fleet]\nfetch_timeout_s = -1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field == "fleet.fetch_timeout_s"


_CAM = '[[cameras]]\nname = "c"\nkind = "{kind}"\nuri = "{uri}"\n'


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ('[agent]\nstate_dir = "st\\u0000ate"\n', "agent.state_dir", "NUL character"),
        ('[agent]\nstate_dir = "/\\u0000"\n', "agent.state_dir", "NUL character"),
        (f'[agent]\nstate_dir = "{"n" * 256}"\n', "agent.state_dir", "over 255 bytes"),
        (f'[agent]\nstate_dir = "{"d/" * 2100}"\n', "agent.state_dir", "over 4095"),
        (_CAM.format(kind="rtsp", uri="rtsp://10.0.0.9:70000/s"), "cameras[0].uri", "1-65535"),
        (_CAM.format(kind="rtsp", uri="rtsp://10.0.0.9:0/s"), "cameras[0].uri", "1-65535"),
        (_CAM.format(kind="rtsp", uri="rtsp://10.0.0.9:5x4/s"), "cameras[0].uri", "1-65535"),
        (_CAM.format(kind="rtsp", uri="rtsp://[fe80::1]:65536/s"), "cameras[0].uri", "1-65535"),
        (_CAM.format(kind="http", uri="http://10.0.0.9:99999/m"), "cameras[0].uri", "1-65535"),
        (
            _CAM.format(kind="rtsp", uri="rtsp://10.0.0.9/s")
            + 'detect_uri = "rtsp://10.0.0.9:123456/sub"\n',
            "cameras[0]",
            "detect_uri 'rtsp://10.0.0.9:123456/sub' names a port",
        ),
        (
            '[[pipelines]]\nname = "p"\nsource = "c"\nbundle = "b\\u0000"\n',
            "pipelines[0].bundle",
            "NUL character",
        ),
    ],
)
def test_paths_and_ports_no_run_could_use_are_refused_at_load(
    tmp_path: Path, body: str, field: str, words: str
) -> None:
    """``check-config`` passed these, and ``edge-agent run`` then failed with a traceback
    (a NUL in a path) or dialled a port that can't exist."""
    text = body if body.startswith("[agent]") else f'[agent]\nstate_dir = "state"\n{body}'
    path = tmp_path / "agent.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.path == str(path)
    assert info.value.field == field
    assert words in info.value.reason
    assert "\0" not in str(info.value)
    assert len(str(info.value)) < 400


def test_check_config_refuses_a_nul_in_state_dir_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nstate_dir = "st\\u0000ate"\n', encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"edge-agent: {path}: agent.state_dir: '{tmp_path}/st\\x00ate' holds a NUL character, "
        "which no path can"
    ]
