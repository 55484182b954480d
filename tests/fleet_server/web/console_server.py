"""A real fleet-server for the console tests: ``fleet-server serve`` as a process with its
managed Mosquitto, a signed repository (detector 1.3.2, 1.4.0 and 1.5.0, ocr 2.0.0),
users of each role added with ``fleetctl users add``, seeded fleet data, and light
agents that answer the rollout's directives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agent.wire.messages import BundleRef
from fleet_server.db import open_database, sqlite_url
from fleet_server.repository import KeyStore, Passphrases, Repository
from fleet_server.repository.bundledir import manifest_target
from tests.agent.installer.installer_helpers import make_bundle
from tests.fleet_server.fleet_api_support import OPERATOR_TOKEN, PASSPHRASE, TOKEN_ENV, http
from tests.fleet_server.web.console_seed import ACTIVE_RELEASE, BUNDLE, Seeded, seed_fleet
from tests.fleet_server.web.light_agents import LightAgent, LightFleet, enroll
from tests.support.broker import free_port

BIN = Path(sys.executable).parent
PASSWORD = "console test password 1"  # noqa: S105 (test only)
USERS = {"olga": "operator", "lena": "line-manager", "vic": "viewer"}
ROLLOUT_LABELS = {"site": "plant-a", "line": "4"}
ROLLOUT_DEVICES = ("a4-01", "a4-02", "a4-03", "a4-04")
START_TIMEOUT_S = 40.0
BUDGET_MS = 40.0


@dataclass
class RunningConsole:
    """The served fleet-server and what the tests need to know about it."""

    url: str
    db_url: str
    seeded: Seeded
    agents: LightFleet
    log: Path

    def api(self, method: str, path: str, body: object = None) -> object:
        answer = http(method, self.url + path, body, token=OPERATOR_TOKEN)
        assert answer.status < 300, (path, answer.status, answer.body)
        return answer.body


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    return env | {"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE, TOKEN_ENV: OPERATOR_TOKEN}


def make_repository(root: Path) -> tuple[Path, Path]:
    """The signed repository; returns (repository, keystore)."""
    pp = Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE})
    keys = KeyStore.create(root / "keystore", root_keys=1, root_threshold=1, passphrases=pp)
    repo = Repository(root / "repository")
    repo.init(keys)
    for version, release in (("1.3.2", 1), ("1.4.0", 2), ("1.5.0", 3)):
        bundle = make_bundle(
            root, name=BUNDLE, version=version, release=release, budget_ms=BUDGET_MS
        )
        repo.publish(bundle.path, keys)
    repo.publish(
        make_bundle(root, name="ocr", version="2.0.0", release=1, budget_ms=80.0).path, keys
    )
    return repo.path, keys.path


def _add_users(config: Path) -> None:
    for name, role in USERS.items():
        done = subprocess.run(
            [str(BIN / "fleetctl"), "users", "add", name, "--role", role, "--config", str(config),
             "--password-stdin"],
            input=PASSWORD + "\n", capture_output=True, text=True, timeout=60, check=False,
            env=_env(),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if http("GET", url + "/healthz").status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"fleet-server not healthy in {START_TIMEOUT_S} s: {log.read_text()}")


def _light_fleet(url: str, repo: Path, work: Path, broker: tuple[str, int]) -> LightFleet:
    targets = {
        manifest_target(b.name, b.release): (b.name, b.version, b.release)
        for b in Repository(repo).bundles(BUNDLE)
    }
    work.mkdir()
    active = BundleRef(name=BUNDLE, version="1.4.0", release=ACTIVE_RELEASE)
    agents = []
    for device_id in ROLLOUT_DEVICES:
        identity = enroll(url, OPERATOR_TOKEN, device_id, ROLLOUT_LABELS, work)
        agents.append(LightAgent(device_id, ROLLOUT_LABELS, active, targets, identity, broker))
    return LightFleet(agents)


@contextmanager
def running_console(root: Path) -> Iterator[RunningConsole]:
    """Everything the module docstring lists, stopped in reverse on the way out."""
    repo, keys = make_repository(root)
    api_port, mqtt_port = free_port(), free_port()
    state = root / "state"
    config = root / "fleet.toml"
    config.write_text(
        f'[server]\nstate_dir = "{state}"\nlog_level = "warning"\n'
        f'[http]\nport = {api_port}\noperator_token_env = "{TOKEN_ENV}"\n'
        f"[broker.mosquitto]\nport = {mqtt_port}\npersistence = false\n"
        f'[repository]\npath = "{repo}"\nkeystore = "{keys}"\n[rollouts]\ntick_s = 0.5\n'
    )
    state.mkdir()
    db_url = sqlite_url(state / "fleet.db")
    _add_users(config)
    engine = open_database(db_url)
    try:
        seeded = seed_fleet(engine, time.time())
    finally:
        engine.dispose()
    log = root / "fleet-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet_server.cli.server", "serve", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, env=_env(),
        )  # fmt: skip
    url = f"http://127.0.0.1:{api_port}"
    agents: LightFleet | None = None
    try:
        _wait_healthy(proc, url, log)
        agents = _light_fleet(url, repo, root / "agents", ("127.0.0.1", mqtt_port))
        agents.start()
        yield RunningConsole(url, db_url, seeded, agents, log)
    finally:
        if agents is not None:
            agents.stop()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
