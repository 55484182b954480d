"""``edge-agent setup`` offers the ONVIF cameras WS-Discovery finds and writes the one
chosen with ``--camera onvif:...``: a camera on a real veth link between two network
namespaces (tests/agent/discovery/onvif_camera.py), setup run in the gateway's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.agent.discovery.onvif_camera import (
    CAM4,
    ENDPOINT,
    PASSWORD,
    REPO,
    USER,
    agent,
    onvif_camera,
)

CREDS = {"CAM_PASSWORD": PASSWORD}


def _setup(gw: str, root: Path, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return agent(
        gw, "setup", "--config", str(root / "agent.toml"), "--state-dir", str(root / "state"),
        "--credentials-dir", str(root / "creds"), "--systemd-dropin-dir", "",
        "--sysfs-root", str(root / "no-sysfs"), "--profile", "x86-gateway",
        "--device-id", "gw-1", "--discover-timeout", "1", *args, env=env,
    )  # fmt: skip


def test_list_cameras_shows_the_onvif_camera_its_streams_and_how_to_choose_it(
    tmp_path: Path,
) -> None:
    with onvif_camera(families="4") as cam:
        run = _setup(
            cam.gw, tmp_path, "--list-cameras", "--camera-user", USER,
            "--camera-password-env", "CAM_PASSWORD", env=CREDS,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "Dock door DS-2" in run.stdout
    assert f"MainStream [H264 2560x1440]: rtsp://{CAM4}:554/main_tok" in run.stdout
    assert f"SubStream [H264 640x360]: rtsp://{CAM4}:554/sub_tok" in run.stdout
    assert f"choose: --camera onvif:{ENDPOINT}" in run.stdout
    assert not tmp_path.joinpath("agent.toml").exists()


def test_camera_onvif_writes_main_and_sub_stream_and_names_the_secret_not_the_password(
    tmp_path: Path,
) -> None:
    with onvif_camera(families="4") as cam:
        run = _setup(
            cam.gw, tmp_path, "--camera", f"onvif:{CAM4}", "--camera-user", USER,
            "--camera-password-env", "CAM_PASSWORD", env=CREDS,
        )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    text = tmp_path.joinpath("agent.toml").read_text()
    assert 'kind = "rtsp"' in text
    assert f'uri = "rtsp://{CAM4}:554/main_tok"' in text  # highest resolution, not first
    assert f'detect_uri = "rtsp://{CAM4}:554/sub_tok"' in text  # lowest resolution
    assert f'username = "{USER}"' in text
    assert 'password_env = "CAM_PASSWORD"' in text
    assert PASSWORD not in text
    config = tmp_path / "agent.toml"
    check = subprocess.run(
        [sys.executable, "-m", "agent.cli", "check-config", "--config", str(config)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "ok (1 camera(s)" in check.stdout


def test_an_unknown_or_unreadable_camera_fails_naming_it_and_writes_nothing(
    tmp_path: Path,
) -> None:
    with onvif_camera(families="4") as cam:
        unknown = _setup(
            cam.gw, tmp_path, "--camera", "onvif:192.0.2.99", "--camera-user", USER,
            "--camera-password-env", "CAM_PASSWORD", env=CREDS,
        )  # fmt: skip
        wrong = _setup(
            cam.gw, tmp_path, "--camera", f"onvif:{ENDPOINT}", "--camera-user", USER,
            "--camera-password-env", "CAM_PASSWORD", env={"CAM_PASSWORD": "wrong"},
        )  # fmt: skip
    assert unknown.returncode == 2
    assert "--camera onvif:192.0.2.99: not found by WS-Discovery in 1 s" in unknown.stderr
    assert ENDPOINT in unknown.stderr  # what did answer
    assert wrong.returncode == 2
    assert f"--camera onvif:{ENDPOINT}" in wrong.stderr
    assert "profiles not read (unauthorized)" in wrong.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_camera_found_over_ipv6_is_chosen_by_its_link_local_address(tmp_path: Path) -> None:
    with onvif_camera(families="6") as cam:
        run = _setup(
            cam.gw, tmp_path, "--camera", f"onvif:{cam.cam6}", "--camera-user", USER,
            "--camera-password-env", "CAM_PASSWORD", "--discover-ip", "6", env=CREDS,
        )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    text = tmp_path.joinpath("agent.toml").read_text()
    assert f'uri = "rtsp://[{cam.cam6}%25ea]:554/main_tok"' in text
