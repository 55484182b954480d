"""Secrets come from $CREDENTIALS_DIRECTORY first, then the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.kernel.secrets import read_secret
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
