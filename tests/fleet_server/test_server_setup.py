"""``fleet-server setup``: a first start made in one command, then ``fleet-server serve``
with only the credentials directory for its secrets (as the unit's LoadCredential= gives
them): the API token works, the admin signs in, devices can be given enrollment tokens.
An existing config is refused; ``--force`` keeps what exists; bad input changes nothing."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from fleet_server.auth import get_user
from fleet_server.config import load_config
from fleet_server.db import open_database
from tests.fleet_server.auth_client import Browser
from tests.fleet_server.fleet_api_support import http
from tests.fleet_server.server_setup_support import (
    ADMIN,
    new_server,
    run_setup,
    serving,
    set_up,
)

TOKEN_NAME = "EDGEFLEET_API_TOKEN"  # noqa: S105 - a credential's name
PASSPHRASE_NAME = "EDGEFLEET_KEY_PASSPHRASE"  # noqa: S105 - a credential's name
SECRETS = (TOKEN_NAME, PASSPHRASE_NAME)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith("fleet.db")
    }


def test_setup_then_serve_takes_its_secrets_from_the_credentials_dir_and_the_admin_signs_in(
    tmp_path: Path,
) -> None:
    server = new_server(tmp_path / "srv")
    done = run_setup(server, "--admin", ADMIN, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    password = report["admin_password"]
    assert isinstance(password, str)
    assert len(password) >= 12

    assert _mode(server.creds) == 0o700
    text = server.config.read_text()
    for name in SECRETS:
        secret = server.creds / name
        assert _mode(secret) == 0o600
        value = secret.read_text().strip()
        assert len(value) >= 32
        assert value not in text, f"{name} must not be in the config"
        assert value not in done.stdout
    assert _mode(server.config) == 0o640
    cfg = load_config(server.config)
    assert cfg.http.operator_token_env == TOKEN_NAME
    assert cfg.server.passphrase_name == PASSPHRASE_NAME

    with serving(server):
        token = server.token()
        assert http("GET", server.url + "/api/v1/devices", token=token).status == 200
        assert http("GET", server.url + "/api/v1/devices", token="not-the-token").status  # noqa: S106 == 401
        issued = http(
            "POST",
            f"{server.url}/api/v1/devices/gw-1/tokens",
            {"labels": {}, "profile": "x86-gateway"},
            token=token,
        )
        assert issued.status in (200, 201), issued.body
        browser = Browser(server.url)
        assert browser.login(ADMIN, "wrong password here").status == 401
        assert browser.login(ADMIN, password).status == 200


def test_an_existing_config_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    server = set_up(tmp_path / "srv")
    before = _snapshot(server.root)
    again = run_setup(server, "--admin", "bob")
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1, again.stderr
    assert "exists" in again.stderr
    assert "--force" in again.stderr
    assert _snapshot(server.root) == before


def test_force_writes_the_config_again_and_keeps_keys_secrets_and_users(tmp_path: Path) -> None:
    server = set_up(tmp_path / "srv")
    before = _snapshot(server.root)
    engine = open_database(load_config(server.config).database_url)
    try:
        hashed = get_user(engine, ADMIN)
    finally:
        engine.dispose()
    assert hashed is not None

    again = run_setup(server, "--admin", ADMIN, "--force")
    assert again.returncode == 0, again.stderr
    assert f"kept the user {ADMIN}" in again.stdout
    assert "password of" not in again.stdout, "a kept user's password is not made again"
    after = _snapshot(server.root)
    changed = {k for k in before if before[k] != after.get(k)}
    # Only the config (its date line) and the CRL (written fresh, proving the passphrase).
    assert changed <= {"fleet.toml", "state/ca/crl.pem", "state/ca/ca.json"}, changed
    engine = open_database(load_config(server.config).database_url)
    try:
        assert get_user(engine, ADMIN) == hashed
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("args", "stdin", "named"),
    [
        (["--admin", "Not A Name"], "", "--admin"),
        (["--admin", ADMIN, "--password-stdin"], "short\n", "--password-stdin"),
        (["--api-port", "70000"], "", "--api-port"),
        (["--database", "postgresql+psycopg://fleet:hunter2@db/fleet"], "", "--database"),
        (["--database", "mysql://db/fleet"], "", "--database"),
        (["--mqtt-port", "0"], "", "--mqtt-port"),
        (["--owner", "no-such-user-here"], "", "--owner"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, args: list[str], stdin: str, named: str
) -> None:
    server = new_server(tmp_path / "srv")
    done = run_setup(server, *args, stdin=stdin)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert named in done.stderr
    assert list(server.root.iterdir()) == []
