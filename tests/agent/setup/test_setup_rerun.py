"""``edge-agent setup --force`` over an existing config, as a field engineer re-runs it to
change one thing: what no option changes is kept (the enrollment's ``[uplink]`` and
``[bundles]`` first), ``--fleet`` alone keeps the enrollment without a new token, and a
re-run that would lose something refuses, names it, and writes nothing."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from agent.config import load_config
from agent.kernel.toml import parse_toml
from agent.setup import tomlout
from tests.agent.installer.installer_helpers import make_bundle
from tests.agent.setup.test_setup import BIN, PROFILE, _setup
from tests.fleet_server.fleet_api_support import http
from tests.fleet_server.server_setup_support import serving, set_up

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    return {
        "cls": make_bundle(root, name="cls", version="1.0.0").path,
        "det": make_bundle(root, name="det", version="2.0.0").path,
    }


def _images(root: Path) -> Path:
    """A directory of one image: another camera to change to."""
    d = root / "input" / "images"
    d.mkdir(parents=True)
    cv2.imwrite(str(d / "part.png"), np.full((48, 64, 3), 128, np.uint8))
    return d


def _toml(path: Path) -> dict[str, Any]:
    return parse_toml(path.read_text(), str(path))


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def test_a_rerun_keeps_every_section_no_option_changes(
    tmp_path: Path, bundles: dict[str, Path]
) -> None:
    config = tmp_path / "etc" / "agent.toml"
    first = _setup(
        tmp_path,
        "--camera", "test", "--bundle", str(bundles["cls"]), "--profile", PROFILE,
        "--device-id", "gw-keep", "--http-port", "9611",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    # What a field engineer added by hand since: a section and a key setup never writes.
    _append(config, '\n[decision_log]\nthumbnails = "none"\n\n[runtime]\nworkers = 1\n')
    before = _toml(config)

    images = _images(tmp_path)
    changed = _setup(tmp_path, "--force", "--camera", str(images))
    assert changed.returncode == 0, changed.stderr
    assert "replaced the previous cameras (cam0)" in changed.stdout
    assert "kept from the previous config: [decision_log], [runtime]" in changed.stdout
    after = _toml(config)
    assert after["decision_log"] == before["decision_log"]
    assert after["runtime"] == before["runtime"]
    assert after["agent"] == before["agent"]  # device id, state dir, profile: not given
    assert after["http"] == {"port": 9611}
    cfg = load_config(config)
    assert [(c.name, c.kind, c.uri) for c in cfg.cameras] == [("cam0", "images", str(images))]
    copy = tmp_path / "state" / "local-bundles" / "cls-1.0.0"
    assert [(p.source, p.installed, p.bundle) for p in cfg.pipelines] == [("cam0", "cls", copy)]

    # A new bundle alone: the cameras stay as they were, the pipelines are replaced.
    rebundled = _setup(tmp_path, "--force", "--bundle", str(bundles["det"]))
    assert rebundled.returncode == 0, rebundled.stderr
    assert "replaced the previous pipelines (main)" in rebundled.stdout
    again = _toml(config)
    assert again["cameras"] == after["cameras"]
    assert again["decision_log"] == before["decision_log"]
    assert [p["installed"] for p in again["pipelines"]] == ["det"]


def test_a_rerun_that_would_lose_a_pipeline_refuses_and_writes_nothing(
    tmp_path: Path, bundles: dict[str, Path]
) -> None:
    config = tmp_path / "etc" / "agent.toml"
    args = ("--camera", "test", "--camera", "test", "--bundle", str(bundles["cls"]))
    assert _setup(tmp_path, *args, "--profile", PROFILE).returncode == 0
    data = _toml(config)
    for p in data["pipelines"]:
        p["deadline_ms"] = 500.0  # tuned by hand: no longer setup's own pipelines
    text = [*tomlout.section("agent", data["agent"]), *tomlout.section("http", data["http"])]
    for name in ("cameras", "pipelines"):
        text += tomlout.section(name, data[name])
    config.write_text("\n".join(text) + "\n")
    before = config.read_bytes()

    done = _setup(tmp_path, "--force", "--camera", "test")
    assert done.returncode == 2, done.stdout
    assert done.stderr.count("\n") == 1, done.stderr
    assert "cam1 (reads cam1)" in done.stderr
    assert "nothing changed" in done.stderr
    assert config.read_bytes() == before


@pytest.mark.parametrize(
    ("content", "named"),
    [(b"[agent\n", "not valid TOML"), (b"\xff\xfe", "not UTF-8")],
)
def test_a_config_setup_cannot_read_is_not_written_over(
    tmp_path: Path, content: bytes, named: str
) -> None:
    config = tmp_path / "etc" / "agent.toml"
    config.parent.mkdir(parents=True)
    config.write_bytes(content)
    done = _setup(tmp_path, "--force", "--camera", "test", "--profile", PROFILE)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert str(config) in done.stderr
    assert named in done.stderr
    assert config.read_bytes() == content


def test_token_without_fleet_is_refused(tmp_path: Path) -> None:
    done = _setup(tmp_path, "--camera", "test", "--token", "-", stdin="t\n")
    assert done.returncode == 2
    assert "--token needs --fleet" in done.stderr
    assert not (tmp_path / "etc").exists()


def test_changing_the_camera_of_an_enrolled_device_keeps_it_on_the_fleet(
    tmp_path: Path, bundles: dict[str, Path]
) -> None:
    server = set_up(tmp_path / "fleet")
    device = tmp_path / "device"
    device.mkdir()
    config = device / "etc" / "agent.toml"
    with serving(server):
        token = http(
            "POST",
            f"{server.url}/api/v1/devices/gw-1/tokens",
            {"labels": {"line": "1"}, "profile": PROFILE},
            token=server.token(),
        ).body["token"]
        enrolled = _setup(
            device, "--camera", "test", "--bundle", str(bundles["cls"]), "--profile", PROFILE,
            "--fleet", server.url, "--token", "-", "--device-id", "gw-1", "--http-port", "0",
            stdin=token + "\n",
        )  # fmt: skip
        assert enrolled.returncode == 0, enrolled.stderr
        data = _toml(config)
        data["bundles"]["fetch_timeout_s"] = 45.0  # a key of [bundles] set by hand since
        lines: list[str] = []
        for name, value in data.items():
            lines += tomlout.section(name, value)
        config.write_text("\n".join(lines) + "\n")
        identity = (device / "state" / "identity" / "fleet.json").read_bytes()

        # The camera changes, no --fleet: the enrollment and its sections stay.
        images = _images(device)
        changed = _setup(device, "--force", "--camera", str(images), stdin="")
        assert changed.returncode == 0, changed.stderr
        assert f"kept the enrollment with {server.url}" in changed.stdout
        cfg = load_config(config)
        assert cfg.uplink.enabled
        assert cfg.bundles.enabled
        assert cfg.bundles.fetch_timeout_s == 45.0
        assert [c.kind for c in cfg.cameras] == ["images"]
        assert (device / "state" / "identity" / "fleet.json").read_bytes() == identity

        # --fleet alone (the token was used): the enrolled identity is kept.
        fleet_only = _setup(device, "--force", "--fleet", server.url, stdin="")
        assert fleet_only.returncode == 0, fleet_only.stderr
        assert f"kept the enrollment with {server.url}" in fleet_only.stdout
        assert (device / "state" / "identity" / "fleet.json").read_bytes() == identity
        assert load_config(config).bundles.fetch_timeout_s == 45.0
        before = config.read_bytes()

        # Another fleet needs a token; another device id would not connect: refused.
        other = _setup(device, "--force", "--fleet", "http://127.0.0.1:9", stdin="")
        assert other.returncode == 2
        assert "--token: needed to enroll with http://127.0.0.1:9" in other.stderr
        renamed = _setup(device, "--force", "--device-id", "gw-2", stdin="")
        assert renamed.returncode == 2
        assert "enrolled as gw-1" in renamed.stderr
        assert config.read_bytes() == before

        run = subprocess.Popen(
            [str(BIN / "edge-agent"), "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            online = False
            while not online and time.monotonic() < deadline:
                assert run.poll() is None, "edge-agent run exited"
                body = http("GET", f"{server.url}/api/v1/devices/gw-1", token=server.token())
                online = body.status == 200 and bool(body.body.get("online"))
                time.sleep(0.5)
            assert online, "the device whose camera changed is still on the fleet"
        finally:
            run.terminate()
            run.wait(30)
