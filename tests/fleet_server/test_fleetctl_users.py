"""``fleetctl users`` as an operator runs it: the installed console script as a
subprocess, the password on standard input or in a variable (never an argument), its
exit code and output checked, and what it stored checked in the database (SQLite and
PostgreSQL) by signing in with the library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_server.auth import AuthSection, AuthService, LoginRefused, get_user
from fleet_server.auth.sessions import find_session
from fleet_server.db import make_engine, open_database, sqlite_url

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db_url (SQLite and PostgreSQL), pg_cluster

FLEETCTL = Path(sys.executable).parent / "fleetctl"
FIRST = "first password, long enough"
SECOND = "second password, long enough"
PASSWORD_ENV = "EDGEFLEET_TEST_NEW_PASSWORD"  # noqa: S105 (a variable name)


def fleetctl(
    *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    assert FLEETCTL.exists(), f"{FLEETCTL} missing: run .venv/bin/pip install -e ."
    environ = {k: v for k, v in os.environ.items() if k != PASSWORD_ENV}
    environ.update(env or {})
    return subprocess.run(
        [str(FLEETCTL), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        check=False,
    )


def signs_in(url: str, username: str, password: str) -> bool:
    engine = make_engine(url)
    try:
        AuthService(engine, AuthSection()).login(username, password, "test")
    except LoginRefused:
        return False
    finally:
        engine.dispose()
    return True


def test_add_passwd_and_list_on_the_fleet_database(db_url: str) -> None:
    added = fleetctl(
        "users", "add", "alice", "--role", "operator", "--db-url", db_url, "--password-stdin",
        stdin=FIRST + "\n",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == "added user alice (operator)"
    assert signs_in(db_url, "alice", FIRST)
    engine = open_database(db_url)
    try:
        user = get_user(engine, "alice")
        assert user is not None
        assert user.password_hash.startswith("$argon2id$")
        assert FIRST not in user.password_hash
        service = AuthService(engine, AuthSection())
        session_id = service.login("alice", FIRST, "test").session_id
        changed = fleetctl(
            "users", "passwd", "alice", "--db-url", db_url, "--password-stdin",
            stdin=SECOND + "\n",
        )  # fmt: skip
        assert changed.returncode == 0, changed.stderr
        assert "sessions ended" in changed.stdout
        assert find_session(engine, session_id, idle_s=60) is None
    finally:
        engine.dispose()
    assert not signs_in(db_url, "alice", FIRST)
    assert signs_in(db_url, "alice", SECOND)
    env = {PASSWORD_ENV: FIRST}
    viewer = fleetctl(
        "users", "add", "vic", "--role", "viewer", "--db-url", db_url, "--password-env",
        PASSWORD_ENV, env=env,
    )  # fmt: skip
    assert viewer.returncode == 0, viewer.stderr
    listed = fleetctl("users", "list", "--db-url", db_url, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["username"], r["role"], r["disabled"]) for r in rows] == [
        ("alice", "operator", False),
        ("vic", "viewer", False),
    ]
    assert rows[0]["sessions"] == 1  # the sign-in signs_in() just made
    assert "$argon2" not in listed.stdout


def test_a_config_file_names_the_database_and_list_prints_a_table(tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text('[server]\nstate_dir = "state"\n[database]\nurl = "sqlite:///fleet.db"\n')
    added = fleetctl(
        "users", "add", "lena", "--role", "line-manager", "--config", str(config),
        "--password-stdin", stdin=FIRST,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert signs_in(sqlite_url(tmp_path / "fleet.db"), "lena", FIRST)
    listed = fleetctl("users", "list", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["USER", "ROLE", "STATE", "PASSWORD", "SET", "SESSIONS"]
    assert lines[1].split()[:3] == ["lena", "line-manager", "active"]
    assert lines[-1] == "1 user(s)"


def test_role_disable_and_enable(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "fleet.db")
    assert fleetctl(
        "users", "add", "bob", "--role", "viewer", "--db-url", url, "--password-stdin",
        stdin=FIRST,
    ).returncode == 0  # fmt: skip
    promoted = fleetctl("users", "role", "bob", "line-manager", "--db-url", url)
    assert (promoted.returncode, promoted.stdout.strip()) == (0, "bob is line-manager")
    assert fleetctl("users", "disable", "bob", "--db-url", url).returncode == 0
    assert not signs_in(url, "bob", FIRST)
    rows = json.loads(fleetctl("users", "list", "--db-url", url, "--json").stdout)
    assert (rows[0]["role"], rows[0]["disabled"]) == ("line-manager", True)
    assert fleetctl("users", "enable", "bob", "--db-url", url).returncode == 0
    assert signs_in(url, "bob", FIRST)


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["add", "amy", "--role", "viewer", "--password-stdin"], "short\n", "at least 12"),
        (["add", "Amy", "--role", "viewer", "--password-stdin"], FIRST, "user name 'Amy'"),
        (["add", "amy", "--role", "viewer"], "", "not on a terminal"),
        (["add", "amy", "--role", "viewer", "--password-env", "NOPE_UNSET"], "", "$NOPE_UNSET"),
        (["passwd", "ghost", "--password-stdin"], FIRST, "user 'ghost': no such user"),
        (["disable", "ghost"], "", "no such user"),
    ],
)
def test_errors_are_one_line_and_store_nothing(
    tmp_path: Path, args: list[str], stdin: str, message: str
) -> None:
    url = sqlite_url(tmp_path / "fleet.db")
    result = fleetctl("users", *args, "--db-url", url, stdin=stdin)
    assert result.returncode == 2
    assert result.stderr.startswith("fleetctl: error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    rows = json.loads(fleetctl("users", "list", "--db-url", url, "--json").stdout)
    assert rows == []


def test_an_existing_user_is_not_replaced(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "fleet.db")
    add = ["users", "add", "amy", "--role", "viewer", "--db-url", url, "--password-stdin"]
    assert fleetctl(*add, stdin=FIRST).returncode == 0
    again = fleetctl(*add[:4], "operator", *add[5:], stdin=SECOND)
    assert again.returncode == 2
    assert "exists already" in again.stderr
    assert signs_in(url, "amy", FIRST)


def test_a_password_is_never_an_argument_and_help_has_examples(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "fleet.db")
    for option in ("--password", "--pass"):
        refused = fleetctl(
            "users", "add", "amy", "--role", "viewer", "--db-url", url, option, FIRST
        )
        assert refused.returncode == 2
        assert f"{option}" in refused.stderr
        assert not (tmp_path / "fleet.db").exists()
    helped = fleetctl("users", "add", "--help")
    assert "--password-stdin" in helped.stdout
    for action in ("add", "passwd", "list", "role", "disable", "enable"):
        helped = fleetctl("users", action, "--help")
        assert helped.returncode == 0
        assert f"example:\n  fleetctl users {action} " in helped.stdout
