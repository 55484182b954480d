"""Secrets come from $CREDENTIALS_DIRECTORY first, then the environment; one given in
the environment is moved out of it and handed to children through a pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import parse_config
from agent.kernel.secrets import read_secret, secret_names
from agent.mqtt_config import LocalMqttConfig


def test_credentials_directory_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BROKER_PW", "from-env")
    assert read_secret("BROKER_PW") == "from-env"
    (tmp_path / "BROKER_PW").write_text("from-credentials\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert read_secret("BROKER_PW") == "from-credentials"
    cfg = LocalMqttConfig(password_env="BROKER_PW")  # noqa: S106 - the name, not a secret
    assert cfg.password() == "from-credentials"


def test_a_missing_or_empty_secret_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.delenv("NOPE", raising=False)
    assert read_secret("NOPE") is None
    (tmp_path / "EMPTY").write_text("\n")
    assert read_secret("EMPTY") is None
    assert LocalMqttConfig().password() is None


def test_every_secret_a_config_names_is_found(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    cfg = parse_config(
        {
            "agent": {"device_id": "d", "state_dir": str(tmp_path / "s")},
            "mqtt": {"password_env": "LOCAL_PW"},
            "cameras": [
                {"name": "c", "kind": "rtsp", "uri": "rtsp://127.0.0.1/x", "username": "u",
                 "password_env": "CAM_PW"},
            ],
            "pipelines": [{"name": "p", "source": "c", "bundle": str(bundle)}],
            "actions": {"actions": [{"name": "w", "kind": "webhook",
                                     "url": "http://127.0.0.1:9/x", "token_env": "HOOK_TOKEN"}]},
        }
    )  # fmt: skip
    assert secret_names(cfg) == {"LOCAL_PW", "CAM_PW", "HOOK_TOKEN"}


def test_a_secret_held_out_of_the_environment_reaches_a_child_through_a_pipe_only() -> None:
    """A child process: the secret is moved out of its environment, still read by name,
    handed to a grandchild through a pipe and read there, and in neither environment."""
    code = (
        "import json, os, subprocess, sys\n"
        "from agent.kernel import secrets\n"
        "assert secrets.hold_from_environment(['T_PW', 'T_NONE']) == ['T_PW']\n"
        "assert 'T_PW' not in os.environ and secrets.read_secret('T_PW') == 's3cret'\n"
        "fds = []\n"
        "env = {**os.environ, **secrets.handoff(fds)}\n"
        "kid = ('from agent.kernel import secrets; import os; n = secrets.receive_handoff(); '\n"
        '       \'print(n, secrets.read_secret("T_PW"), "T_PW" in os.environ, \'\n'
        '       \'open("/proc/self/environ", "rb").read().count(b"s3cret"))\')\n'
        "out = subprocess.run([sys.executable, '-c', kid], env=env, pass_fds=fds,\n"
        "                     capture_output=True, text=True, check=True).stdout\n"
        "secrets.close_handoff(fds)\n"
        "print(out.strip())\n"
    )
    env = {**os.environ, "T_PW": "s3cret"}
    env.pop("CREDENTIALS_DIRECTORY", None)
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "s3cret", "False", "0"]
