"""A rollback from the bundle a device was set up with finishes, end to end: fleet-server
with its managed Mosquitto and one real agent set up with cls 1.0.0 (run from its
configured directory, in no slot). The fleet knows that bundle from the agent's first
report (release and digest); a rollout of 1.1.0 completes; the operator's rollback sends a
signed ``revert`` directive, and the agent fetches 1.0.0 and installs it although it is
below the committed release: the rollback ends ``rolled_back``, and a second rollout on
the device is refused while the first still holds it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.kernel.bundle import load_bundle
from fleet_server.repository import KeyStore, Passphrases, Repository
from tests.agent.installer.installer_helpers import make_bundle
from tests.fleet_server.fleet_api_support import OPERATOR_TOKEN, PASSPHRASE, TOKEN_ENV, http
from tests.fleet_server.test_fleet_e2e import POLICY, _agent, _device, _rollout, _wait
from tests.support.broker import free_port

pytestmark = pytest.mark.timeout(300)
DEVICE = "gw-1"


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A served fleet-server whose repository publishes cls 1.0.0 (what the device is set
    up with: a revert fetches it) and 1.1.0; yields its URL and the 1.0.0 directory."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    pp = Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE})
    keys = KeyStore.create(tmp_path / "keystore", root_keys=1, root_threshold=1, passphrases=pp)
    repo = Repository(tmp_path / "repository")
    repo.init(keys)
    set_up = make_bundle(tmp_path, name="cls", version="1.0.0", release=1)
    repo.publish(set_up.path, keys)
    repo.publish(make_bundle(tmp_path, name="cls", version="1.1.0", release=2).path, keys)
    api, mqtt = free_port(), free_port()
    config = tmp_path / "fleet.toml"
    config.write_text(
        f'[server]\nstate_dir = "state"\n[http]\nport = {api}\noperator_token_env = "{TOKEN_ENV}"\n'
        f"[broker.mosquitto]\nport = {mqtt}\npersistence = false\n"
        f'[repository]\npath = "{repo.path}"\nkeystore = "{keys.path}"\n[rollouts]\ntick_s = 0.5\n'
    )
    log = tmp_path / "fleet.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet_server.cli.server", "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{api}"
    try:

        def healthy() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return http("GET", url + "/healthz").status == 200
            except OSError:
                return False

        _wait(healthy, 60, "fleet-server")
        yield url, set_up.path
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def agent(tmp_path: Path, fleet: tuple[str, Path]) -> Iterator[subprocess.Popen[bytes]]:
    """The agent, set up with cls 1.0.0 (its configured directory; no slot holds it)."""
    url, set_up = fleet
    proc = _agent(tmp_path, url, DEVICE, set_up)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_a_rollback_to_the_set_up_bundle_fetches_it_and_finishes(
    fleet: tuple[str, Path], agent: subprocess.Popen[bytes]
) -> None:
    url, fallback = fleet
    digest = load_bundle(fallback).digest
    _wait(lambda: _device(url, DEVICE).get("online"), 120, "the agent online")
    # the fleet knows the set-up bundle from the agent's first report
    _wait(lambda: _device(url, DEVICE).get("active_release") == 1, 60, "release 1 reported")
    row = _device(url, DEVICE)
    assert (row["active_bundle"], row["active_version"], row["active_digest"]) == (
        "cls", "1.0.0", digest,
    )  # fmt: skip

    spec = {"bundle": "cls@1.1.0", "selector": "line=3", "waves": "100%", "soak_s": "1h",
            "policy": POLICY}  # fmt: skip
    created = http("POST", f"{url}/api/v1/rollouts", spec, token=OPERATOR_TOKEN)
    assert created.status == 201, created.body
    rid = created.body["rollout_id"]
    _wait(lambda: _rollout(url, rid)["phase"] == "soaking", 150, "1.1.0 installed")
    assert _device(url, DEVICE)["active_release"] == 2

    # while it runs, the rollout holds the device: another one on it is refused, named
    again = http("POST", f"{url}/api/v1/rollouts", spec, token=OPERATOR_TOKEN)
    assert again.status == 409, again.body
    assert f"held by rollout {rid} (soaking): {DEVICE}" in again.body["detail"]

    back = http(
        "POST", f"{url}/api/v1/rollouts/{rid}/rollback", {"reason": "e2e"}, token=OPERATOR_TOKEN
    )
    assert back.status == 200, back.body
    (entry,) = back.body["devices"]
    assert (entry["status"], entry["revert_to"]) == ("reverting", {"name": "cls", "release": 1})
    _wait(lambda: _rollout(url, rid)["phase"] == "rolled_back", 150, "the rollback to finish")
    view = _rollout(url, rid)
    assert view["reason"].endswith("every reverted device runs its previous bundle"), view
    assert view["stuck"] == []
    row = _device(url, DEVICE)
    # it runs 1.0.0 again, now installed in a slot, with the digest it was set up with
    assert (row["active_release"], row["active_digest"], row["previous_release"]) == (
        1, digest, 2,
    )  # fmt: skip
