"""Secrets from a credentials directory as systemd 252 lays it out for
``LoadCredential=edgefleet:DIR`` (each file as ``edgefleet_<NAME>``) and as one file per
credential (``<NAME>``), for the agent's reader and the fleet's passphrases."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.kernel.secrets import CREDENTIAL_DIR_ID, credential_file, read_secret
from fleet_server.repository.keys import Passphrases


@pytest.mark.parametrize("file_name", ["EDGEFLEET_API_TOKEN", "edgefleet_EDGEFLEET_API_TOKEN"])
def test_a_secret_is_read_under_its_name_or_the_directory_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_name: str
) -> None:
    (tmp_path / file_name).write_text("tok\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.delenv("EDGEFLEET_API_TOKEN", raising=False)
    assert read_secret("EDGEFLEET_API_TOKEN") == "tok"
    assert read_secret("EDGEFLEET_OTHER") is None


def test_the_plain_name_wins_and_other_prefixes_are_not_read(tmp_path: Path) -> None:
    (tmp_path / "agent_NAME").write_text("x")
    assert credential_file(tmp_path, "NAME") is None
    (tmp_path / f"{CREDENTIAL_DIR_ID}_NAME").write_text("dir")
    (tmp_path / "NAME").write_text("file")
    assert credential_file(tmp_path, "NAME") == tmp_path / "NAME"
    assert credential_file(None, "NAME") is None


def test_the_fleets_passphrase_is_found_under_the_directory_id(tmp_path: Path) -> None:
    (tmp_path / "edgefleet_EDGEFLEET_KEY_PASSPHRASE").write_text("pp")
    found = Passphrases(environ={"CREDENTIALS_DIRECTORY": str(tmp_path)}).get("ca", "ks")
    assert found == b"pp"
