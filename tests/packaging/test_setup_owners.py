"""Who owns what ``edge-agent setup`` and ``fleet-server setup`` make: the state belongs to
the service's user, the config to root (group: the service's), the credentials to root.
Giving files to another user needs root, so these run with the package tests (make
package-test, as root) rather than in make test; the rest of both commands' tests are in
tests/agent/setup/ and tests/fleet_server/test_server_setup.py."""

from __future__ import annotations

import pwd
from pathlib import Path

from tests.agent.setup.test_setup import _mode, _setup
from tests.agent.setup.test_setup import bundle as bundle  # noqa: PLC0414 - the fixture
from tests.fleet_server.server_setup_support import ADMIN, ADMIN_PASSWORD, new_server, run_setup


def test_state_belongs_to_the_owner_and_the_config_to_root(tmp_path: Path, bundle: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    state = tmp_path / "var" / "lib" / "edgefleet" / "agent"
    done = _setup(
        tmp_path, "--camera", "test", "--bundle", str(bundle), "--owner", "nobody",
        "--state-dir", str(state),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    made = [state, *(state / "local-bundles").rglob("*"), state / "local-bundles"]
    assert {(p.stat().st_uid, p.stat().st_gid) for p in made} == {(nobody.pw_uid, nobody.pw_gid)}
    assert _mode(state) == 0o750
    assert _mode(state.parent) == 0o755, "the service user must pass through to its state"
    config = tmp_path / "etc" / "agent.toml"
    assert (config.stat().st_uid, config.stat().st_gid) == (0, nobody.pw_gid)
    assert _mode(config) == 0o640


def test_what_setup_makes_belongs_to_the_owner_and_the_config_to_root(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    server = new_server(tmp_path / "srv")
    done = run_setup(server, "--owner", "nobody", "--admin", ADMIN, "--password-stdin",
                     stdin=ADMIN_PASSWORD + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    made = [server.state, *server.state.rglob("*")]
    assert {(p.stat().st_uid, p.stat().st_gid) for p in made} == {(nobody.pw_uid, nobody.pw_gid)}
    assert (server.config.stat().st_uid, server.config.stat().st_gid) == (0, nobody.pw_gid)
    for p in (server.creds, *server.creds.iterdir()):
        assert p.stat().st_uid == 0
