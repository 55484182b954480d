"""The pure parts of users and sessions, without sockets: the roles table, user-name
and password rules, the failed sign-in limiter, the origin and form-token checks, and
the documented ``[auth]`` configuration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from agent.kernel.errors import ConfigError
from fleet_server.auth import (
    PERMISSIONS,
    BadUsername,
    WeakPassword,
    allows,
    check_new_password,
    check_username,
)
from fleet_server.auth.csrf import form_token, origin_of, origin_refusal
from fleet_server.auth.limiter import MAX_LOCKOUT_S, LoginLimiter
from fleet_server.config import parse_config


def test_roles_table_gives_the_line_manager_no_write_on_the_fleet() -> None:
    assert all(allows("operator", p) for p in PERMISSIONS)
    writes = ("rollouts:write", "devices:write", "bundles:write", "users:admin")
    assert not any(allows("line-manager", p) for p in writes)
    assert allows("line-manager", "decisions:review")
    assert allows("line-manager", "decisions:export")
    assert [p for p in PERMISSIONS if allows("viewer", p)] == ["fleet:read"]


def test_user_names_and_new_passwords_follow_the_rules() -> None:
    assert check_username("line-3.manager_a") == "line-3.manager_a"
    for bad in ("", "Alice", "a b", "x" * 65, "..", "ali@ce"):
        with pytest.raises(BadUsername):
            check_username(bad)
    with pytest.raises(WeakPassword, match="at least 12 characters, got 11"):
        check_new_password("alice", "x" * 11)
    with pytest.raises(WeakPassword, match="control characters"):
        check_new_password("alice", "twelve chars\n ok")
    with pytest.raises(WeakPassword, match="the user name"):
        check_new_password("alice.admin1", "ALICE.admin1")
    assert check_new_password("alice", "x" * 12) == "x" * 12


def test_limiter_locks_after_the_limit_doubles_and_forgets_on_success() -> None:
    limiter = LoginLimiter(3, 10.0, max_entries=2)
    assert [limiter.failed("a", "ip", t) for t in (0.0, 1.0)] == [0.0, 0.0]
    assert limiter.failed("a", "ip", 2.0) == 10.0
    assert limiter.locked_for("a", "ip", 5.0) == 7.0
    assert limiter.locked_for("a", "other-ip", 5.0) == 0.0
    assert [limiter.failed("a", "ip", t) for t in (13.0, 14.0, 15.0)] == [0.0, 0.0, 20.0]
    limiter.succeeded("a", "ip")
    assert limiter.locked_for("a", "ip", 16.0) == 0.0
    for i in range(5):
        limiter.failed(f"u{i}", "ip", 20.0)
    assert len(limiter) == 2  # bounded: the least recently failed went first
    long = LoginLimiter(1, 600.0)
    assert [long.failed("a", "ip", float(t)) for t in range(3)] == [
        600.0,
        MAX_LOCKOUT_S,
        MAX_LOCKOUT_S,
    ]


def test_origin_checks_compare_scheme_host_and_port() -> None:
    own = "http://10.0.0.5:8080"
    assert origin_of("HTTP://Fleet.Example/x") == "http://fleet.example:80"
    assert origin_of("https://[::1]/") == "https://[::1]:443"
    assert origin_of("null") is None
    assert origin_refusal(None, None, own) is None
    assert origin_refusal("http://10.0.0.5:8080", None, own) is None
    assert origin_refusal(None, "http://10.0.0.5:8080/devices", own) is None
    assert origin_refusal("http://10.0.0.5:8081", None, own) is not None
    assert origin_refusal("https://10.0.0.5:8080", None, own) is not None
    assert origin_refusal("null", None, own) is not None
    trusted = ["https://fleet.plant.example"]
    assert origin_refusal("https://fleet.plant.example:443", None, own, trusted) is None
    assert form_token("application/x-www-form-urlencoded", b"a=1&csrf_token=t0k") == "t0k"
    assert form_token("application/json", b'{"csrf_token": "t0k"}') is None


def test_the_documented_auth_section_is_a_valid_config() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "users-and-roles.md").read_text()
    (block,) = re.findall(r"```toml\n(.*?)```", text, flags=re.DOTALL)
    cfg = parse_config(tomllib.loads(block), "docs/users-and-roles.md")
    assert cfg.auth.trusted_origins == ["https://fleet.plant.example"]
    assert cfg.auth.trusted_proxies == ["127.0.0.1/32"]
    assert (cfg.http.max_small_body_bytes, cfg.http.max_body_bytes) == (65536, 1048576)
    with pytest.raises(ConfigError, match=r"auth\.session_idle_s"):
        parse_config({"auth": {"session_idle_s": 5}}, "x.toml")
