"""A fleet server made by ``fleet-server setup`` and run by ``fleet-server serve`` with
``CREDENTIALS_DIRECTORY`` at the credentials directory setup wrote, as the unit runs it
(``LoadCredential=``). Used by the server's setup tests and the agent's (enrollment)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.fleet_server.fleet_api_support import http
from tests.support.broker import free_port

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
ADMIN = "alice"
ADMIN_PASSWORD = "setup test password 1"  # noqa: S105 - test only


@dataclass(frozen=True)
class SetUpServer:
    """The files setup wrote and the ports it was told."""

    root: Path
    api: int
    mqtt: int

    @property
    def config(self) -> Path:
        return self.root / "fleet.toml"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def creds(self) -> Path:
        return self.root / "creds"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api}"

    def token(self) -> str:
        return (self.creds / "EDGEFLEET_API_TOKEN").read_text().strip()


def setup_args(server: SetUpServer, *extra: str) -> list[str]:
    """``fleet-server setup`` for ``server``'s directory, loopback only."""
    return [
        str(BIN / "fleet-server"),
        "setup",
        "--config",
        str(server.config),
        "--state-dir",
        str(server.state),
        "--credentials-dir",
        str(server.creds),
        "--listen",
        "127.0.0.1",
        "--api-port",
        str(server.api),
        "--mqtt-port",
        str(server.mqtt),
        *extra,
    ]


def run_setup(
    server: SetUpServer, *extra: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        setup_args(server, *extra),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=_env_without_secrets(),
    )


def _env_without_secrets() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("CREDENTIALS_DIRECTORY", "EDGEFLEET_KEY_PASSPHRASE", "EDGEFLEET_API_TOKEN"):
        env.pop(name, None)
    return env


def new_server(root: Path) -> SetUpServer:
    root.mkdir(parents=True, exist_ok=True)
    return SetUpServer(root, free_port(), free_port())


def set_up(root: Path) -> SetUpServer:
    """``fleet-server setup --admin alice --password-stdin`` in ``root``."""
    server = new_server(root)
    done = run_setup(server, "--admin", ADMIN, "--password-stdin", stdin=ADMIN_PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    return server


@contextmanager
def serving(server: SetUpServer) -> Iterator[subprocess.Popen[bytes]]:
    """``fleet-server serve`` on ``server``'s config, secrets only from its credentials
    directory; yields once /healthz answers ok."""
    env = _env_without_secrets()
    env["CREDENTIALS_DIRECTORY"] = str(server.creds)
    log = server.root / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "fleet-server"), "serve", "--config", str(server.config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        _wait_healthy(server.url, proc, log)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"fleet-server exited {proc.returncode}: {log.read_text()}"
        try:
            answer = http("GET", url + "/healthz")
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
            continue
        if answer.status == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"fleet-server not healthy within {START_TIMEOUT_S} s: {log.read_text()}")
