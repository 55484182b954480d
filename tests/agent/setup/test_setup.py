"""``edge-agent setup`` as a field engineer runs it: the command in a subprocess, its
files on disk, the config it wrote checked by ``edge-agent check-config`` and run by
``edge-agent run`` until it decides, its drop-in read by the real ``systemd-analyze``, and
enrollment against a real ``fleet-server`` made by ``fleet-server setup``. Bad input is
one line, exit code 2, and nothing written."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.config import load_config
from agent.setup import dropin
from runtime.profiles import load_profile
from tests.agent.installer.installer_helpers import make_bundle
from tests.fleet_server.fleet_api_support import http
from tests.fleet_server.server_setup_support import serving, set_up
from tests.support.broker import free_port

BIN = Path(sys.executable).parent
PROFILE = "x86-gateway"


def _setup(root: Path, *extra: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``edge-agent setup`` with every path under ``root``."""
    env = dict(os.environ)
    env.pop("EDGEFLEET_PROFILE", None)
    return subprocess.run(
        [
            str(BIN / "edge-agent"),
            "setup",
            "--config",
            str(root / "etc" / "agent.toml"),
            "--state-dir",
            str(root / "state"),
            "--credentials-dir",
            str(root / "creds"),
            "--systemd-dropin-dir",
            str(root / "dropin"),
            "--sysfs-root",
            str(root / "no-sysfs"),
            *extra,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=env,
    )


def _decisions(db: Path) -> int:
    """Decisions in the log; 0 while the agent has not made the file or its table yet."""
    if not db.exists():
        return 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        made = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'decisions'").fetchone()
        if made is None:
            return 0
        return int(conn.execute("SELECT count(*) FROM decisions").fetchone()[0])


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("bundle"), name="cls", version="1.0.0").path


def test_a_test_camera_and_a_bundle_make_a_device_that_decides(
    tmp_path: Path, bundle: Path
) -> None:
    done = _setup(
        tmp_path,
        "--camera", "test", "--bundle", str(bundle), "--profile", PROFILE,
        "--device-id", "line1-gw", "--http-port", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "check-config:" in done.stdout
    assert "next: systemctl restart edgefleet-agent" in done.stdout
    config = tmp_path / "etc" / "agent.toml"
    assert _mode(config) == 0o640
    assert _mode(tmp_path / "creds") == 0o700
    cfg = load_config(config)
    assert cfg.agent.device_id == "line1-gw"
    assert cfg.agent.profile == PROFILE
    assert [(c.name, c.kind) for c in cfg.cameras] == [("cam0", "synthetic")]
    copy = tmp_path / "state" / "local-bundles" / "cls-1.0.0"
    assert [(p.source, p.installed, p.bundle) for p in cfg.pipelines] == [("cam0", "cls", copy)]
    assert (copy / "manifest.json").read_bytes() == (bundle / "manifest.json").read_bytes()
    assert not cfg.uplink.enabled

    profile = load_profile(PROFILE)
    conf = (tmp_path / "dropin" / "50-profile.conf").read_text()
    assert f"MemoryMax={profile.memory_budget_mb + profile.memory_budget_mb // 4}M" in conf
    assert "CPUWeight=100" in conf

    checked = subprocess.run(
        [str(BIN / "edge-agent"), "check-config", "--config", str(config)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr

    run = subprocess.Popen(
        [str(BIN / "edge-agent"), "run", "--config", str(config), "--single-process"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    db = tmp_path / "state" / "decisions.db"
    try:
        deadline = time.monotonic() + 90
        while _decisions(db) == 0 and time.monotonic() < deadline:
            assert run.poll() is None, run.stderr.read().decode() if run.stderr else ""
            time.sleep(0.5)
        assert _decisions(db) > 0, "the agent set up with a test camera and a bundle decides"
    finally:
        run.terminate()
        run.wait(30)


def test_systemd_reads_the_dropin_and_finds_nothing_wrong(tmp_path: Path) -> None:
    unit = tmp_path / dropin.UNIT
    unit.write_text("[Unit]\nDescription=edgefleet agent\n[Service]\nExecStart=/bin/true\n")
    for name in ("x86-gateway", "jetson-orin", "arm64-gateway"):
        path = dropin.write_dropin(load_profile(name), tmp_path / f"{dropin.UNIT}.d")
        verify = subprocess.run(
            ["systemd-analyze", "verify", str(unit)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert verify.returncode == 0, verify.stderr
        assert path.name not in verify.stdout + verify.stderr, verify.stderr
    # The same check sees a drop-in it can't parse (so it reads this one).
    path.write_text(path.read_text().replace("MemoryMax=", "MemoryMax=lots"))
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "Invalid memory limit" in verify.stderr


@pytest.mark.parametrize(("nice", "weight"), [(0, 100), (-5, 305), (5, 33), (-20, 8674)])
def test_cpu_weight_follows_the_kernels_nice_table(nice: int, weight: int) -> None:
    assert dropin.cpu_weight(nice) == weight


def test_an_existing_config_is_refused_and_force_writes_the_same_again(
    tmp_path: Path, bundle: Path
) -> None:
    args = ("--camera", "test", "--bundle", str(bundle), "--profile", PROFILE)
    assert _setup(tmp_path, *args).returncode == 0
    config = tmp_path / "etc" / "agent.toml"
    before = config.read_bytes()
    again = _setup(tmp_path, *args)
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1, again.stderr
    assert "exists" in again.stderr
    assert "--force" in again.stderr
    assert config.read_bytes() == before

    forced = _setup(tmp_path, *args, "--force")
    assert forced.returncode == 0, forced.stderr
    assert "kept bundle cls 1.0.0" in forced.stdout
    # The same file but for its first line (the date it was written).
    assert config.read_text().splitlines()[1:] == before.decode().splitlines()[1:]


def _nothing_written(root: Path) -> None:
    left = sorted(p.name for p in root.iterdir() if p.name not in ("input",))
    assert left == [], left


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--profile", "no-such-profile", "--camera", "test"], "--profile no-such-profile"),
        (["--camera", "/nonexistent/video7"], "--camera /nonexistent/video7"),
        (["--camera", "/dev/null"], "not a V4L2 device"),
        (["--camera", "ftp://cam/stream"], "--camera ftp://cam/stream"),
        (["--camera", "test", "--device-id", "a/b"], "--device-id"),
        (["--camera", "test", "--owner", "no-such-user-here"], "--owner"),
        (["--bundle", "BUNDLE"], "no camera"),
        (["--camera", "test", "--bundle", "EMPTY"], "--bundle"),
        (["--camera", "test", "--fleet", "http://127.0.0.1:PORT", "--token", "-"], "--fleet"),
        (["--camera", "test", "--fleet", "http://127.0.0.1:PORT"], "--token"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, bundle: Path, args: list[str], named: str
) -> None:
    empty = tmp_path / "input" / "empty"
    empty.mkdir(parents=True)
    port = str(free_port())  # nothing listens there
    real = [
        a.replace("BUNDLE", str(bundle)).replace("EMPTY", str(empty)).replace("PORT", port)
        for a in args
    ]
    done = _setup(tmp_path, *real, stdin="a-token\n")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert named in done.stderr
    _nothing_written(tmp_path)


def test_enrolls_with_a_fleet_server_set_up_by_fleet_server_setup(
    tmp_path: Path, bundle: Path
) -> None:
    server = set_up(tmp_path / "fleet")
    device = tmp_path / "device"
    device.mkdir()
    with serving(server):
        token = http(
            "POST",
            f"{server.url}/api/v1/devices/gw-1/tokens",
            {"labels": {"line": "1"}, "profile": PROFILE},
            token=server.token(),
        ).body["token"]
        wrong_id = _setup(
            device, "--camera", "test", "--fleet", server.url, "--token", "-",
            "--device-id", "gw-2", stdin=token + "\n",
        )  # fmt: skip
        assert wrong_id.returncode == 2
        assert "not device 'gw-1'" in wrong_id.stderr
        _nothing_written(device)

        token = http(
            "POST",
            f"{server.url}/api/v1/devices/gw-1/tokens",
            {"labels": {"line": "1"}, "profile": PROFILE},
            token=server.token(),
        ).body["token"]
        args = ("--camera", "test", "--bundle", str(bundle), "--fleet", server.url,
                "--token", "-", "--device-id", "gw-1", "--http-port", "0")  # fmt: skip
        done = _setup(device, *args, stdin=token + "\n")
        assert done.returncode == 0, done.stderr
        assert "enrolled gw-1" in done.stdout
        assert (device / "state" / "identity" / "fleet.json").is_file()
        assert (device / "state" / "trust" / "root.json").is_file()
        cfg = load_config(device / "etc" / "agent.toml")
        assert cfg.uplink.enabled
        assert cfg.bundles.enabled

        # Again with --force: the enrollment is kept, no token is read.
        again = _setup(device, *args, "--force", stdin="")
        assert again.returncode == 0, again.stderr
        assert "kept the enrollment" in again.stdout

        run = subprocess.Popen(
            [str(BIN / "edge-agent"), "run", "--config", str(device / "etc" / "agent.toml")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 90
            online = False
            while not online and time.monotonic() < deadline:
                assert run.poll() is None, "edge-agent run exited"
                body = http("GET", f"{server.url}/api/v1/devices/gw-1", token=server.token())
                online = body.status == 200 and bool(body.body.get("online"))
                time.sleep(0.5)
            assert online, "the device set up and enrolled shows online at the fleet"
        finally:
            run.terminate()
            run.wait(30)
