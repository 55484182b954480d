"""The whole signed delivery against a real Mosquitto: publish -> directive -> fetch
over MQTT -> install -> health window -> commit; then a bundle that fails its health
window, which the agent rolls back by itself; then a side-load from a directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from agent.app import Agent
from agent.config import parse_config
from agent.installer import Installer
from agent.pipeline.runner import Decision
from agent.wire import topics
from fleet_server.distribution.file_server import MqttFileServer
from fleet_server.repository import KeyStore, Repository
from fleet_server.repository.director import issue_directive
from tests.agent.installer.installer_helpers import make_bright_fails_bundle, make_bundle
from tests.support.broker import Broker

DEVICE = "gw-7"
PROFILE = "x86-gateway"


def _wait(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[KeyStore, Repository]:
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", "test passphrase, made at test time")
    keys = KeyStore.create(tmp_path / "keys", root_keys=3, root_threshold=2)
    repo = Repository(tmp_path / "repo")
    repo.init(keys)
    good = make_bundle(tmp_path, name="cls", version="1.0.0", release=1)
    bad = make_bright_fails_bundle(tmp_path, name="cls", version="2.0.0", release=2)
    repo.publish(good.path, keys)
    repo.publish(bad.path, keys)
    return keys, repo


@pytest.fixture
def file_server(fleet: tuple[KeyStore, Repository], mosquitto: Broker) -> Iterator[None]:
    server = MqttFileServer(fleet[1].path, mosquitto.host, mosquitto.port)
    server.start(10)
    yield
    server.stop()


def _publish_retained(broker: Broker, topic: str, payload: bytes) -> None:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"fleet-test-{time.time_ns()}")
    c.connect(broker.host, broker.port)
    c.loop_start()
    try:
        c.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
    finally:
        c.loop_stop()
        c.disconnect()


def _agent_config(tmp_path: Path, repo: Repository, broker: Broker) -> dict[str, object]:
    return {
        "agent": {"device_id": DEVICE, "state_dir": str(tmp_path / "state"), "profile": PROFILE},
        "runtime": {"workers": 1, "pin": False},
        "decision_log": {"thumbnails": "none"},
        "cameras": [{"name": "c1", "kind": "synthetic", "fps": 30, "pattern": "bars"}],
        "pipelines": [{"name": "p", "source": "c1", "installed": "cls"}],
        "bundles": {
            "enabled": True,
            "mqtt": {"host": broker.host, "port": broker.port},
            "initial_root": str(repo.path / "metadata" / "1.root.json"),
            "installer": {"health_window_s": 2.0, "health_poll_s": 0.2, "benchmark_runs": 5},
        },
    }


def test_mqtt_delivery_commits_a_good_bundle_and_rolls_back_a_failing_one(
    tmp_path: Path,
    fleet: tuple[KeyStore, Repository],
    mosquitto: Broker,
    file_server: None,
) -> None:
    keys, repo = fleet
    cfg = parse_config(_agent_config(tmp_path, repo, mosquitto))
    versions: list[str] = []
    lock = threading.Lock()

    def on_decision(d: Decision, _id: str) -> None:
        with lock:
            versions.append(d.record.model_version)

    agent = Agent(cfg, http=False, on_decision=on_decision)
    agent.start()
    try:
        assert agent.updates is not None
        assert not agent.runners, "nothing is installed yet"
        topic = topics.directive(DEVICE)
        _publish_retained(mosquitto, topic, issue_directive(repo, keys, DEVICE, PROFILE, "cls", 1))
        assert _wait(lambda: len(agent.updates.reports) >= 1, 60), "no install report"  # type: ignore[union-attr]
        first = agent.updates.reports[0]
        assert first["outcome"] == "committed", first
        assert (first["bundle"], first["release"]) == ("cls", 1)
        ok, details = agent.health()
        assert ok, details
        assert details["last_install"]["outcome"] == "committed"
        assert details["stale"] is False
        assert _wait(lambda: "1.0.0" in versions, 20), "the agent does not decide with 1.0.0"

        _publish_retained(mosquitto, topic, issue_directive(repo, keys, DEVICE, PROFILE, "cls", 2))
        assert _wait(lambda: len(agent.updates.reports) >= 2, 60), "no second report"  # type: ignore[union-attr]
        second = agent.updates.reports[1]
        assert second["outcome"] == "failed", second
        assert second["step"] == "health"
        with lock:
            n = len(versions)
        assert _wait(lambda: versions[n:].count("1.0.0") >= 5, 20), "not back on 1.0.0"
    finally:
        agent.stop()
    slots = agent.installer.status()  # type: ignore[union-attr]
    active = [s for s in slots if s.active]
    assert len(active) == 1
    assert active[0].bundle is not None
    assert active[0].bundle.release == 1


def test_side_load_from_a_directory_uses_the_same_checks(
    tmp_path: Path, fleet: tuple[KeyStore, Repository], mosquitto: Broker
) -> None:
    from agent.directives.sideload import sideload

    keys, repo = fleet
    medium = tmp_path / "usb"
    shutil.copytree(repo.path / "metadata", medium / "metadata")
    shutil.copytree(repo.path / "targets", medium / "targets")
    (medium / "directives").mkdir()
    directive = issue_directive(repo, keys, DEVICE, PROFILE, "cls", 1)
    (medium / "directives" / f"{DEVICE}.json").write_bytes(directive)
    cfg = parse_config(_agent_config(tmp_path, repo, mosquitto))
    report = sideload(medium, cfg)
    assert report["outcome"] == "committed", report
    assert sideload(medium, cfg)["outcome"] == "noop"
    # A byte of the model swapped on the medium: refused, nothing installed beyond it.
    other = tmp_path / "state2"
    cfg2 = parse_config(
        {
            **_agent_config(tmp_path, repo, mosquitto),
            "agent": {"device_id": DEVICE, "state_dir": str(other), "profile": PROFILE},
        }
    )
    (model,) = [p for p in (medium / "targets").rglob("*.onnx") if "1" in p.parent.name]
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    bad = sideload(medium, cfg2)
    assert bad["outcome"] == "refused", bad
    assert not (other / "bundles" / "cls" / "active.json").exists()
    assert json.dumps(bad)  # the report is plain JSON for the fleet


def _committed(state: Path) -> bool:
    """Whether ``cls`` has a committed slot that is the active one."""
    slots = Installer(state, profile_name=PROFILE).status()
    return any(s.name == "cls" and s.active and s.state == "committed" for s in slots)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_agent_killed_during_the_health_window_comes_back_on_the_old_model_then_finishes(
    tmp_path: Path,
    fleet: tuple[KeyStore, Repository],
    mosquitto: Broker,
    file_server: None,
) -> None:
    keys, repo = fleet
    state = tmp_path / "state"
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f'[agent]\ndevice_id = "{DEVICE}"\nstate_dir = "{state}"\nprofile = "{PROFILE}"\n'
        "[runtime]\nworkers = 1\npin = false\n[http]\nport = 0\n"
        '[[cameras]]\nname = "c1"\nkind = "synthetic"\nfps = 30\npattern = "bars"\n'
        '[[pipelines]]\nname = "p"\nsource = "c1"\ninstalled = "cls"\n'
        f"[bundles]\nenabled = true\n"
        f'mqtt = {{ host = "{mosquitto.host}", port = {mosquitto.port} }}\n'
        f'initial_root = "{repo.path / "metadata" / "1.root.json"}"\n'
        "installer = { health_window_s = 30.0, health_poll_s = 0.2, benchmark_runs = 5 }\n"
    )
    exe = str(Path(sys.executable).parent / "edge-agent")
    journal = state / "bundles" / "cls" / "install-state.json"
    topic = topics.directive(DEVICE)
    _publish_retained(mosquitto, topic, issue_directive(repo, keys, DEVICE, PROFILE, "cls", 1))
    proc = subprocess.Popen(
        [exe, "run", "--config", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        on_trial = _wait(lambda: journal.exists() and '"step": "health"' in journal.read_text(), 60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    # the supervisor is gone; its children (the companion holds the install's lock) too
    assert _wait(lambda: not _group_alive(proc.pid), 10), "the agent's processes outlived it"
    assert on_trial, "the install never reached its health window"
    # Before commit: nothing was committed, so nothing is active.
    assert Installer(state, profile_name=PROFILE).active_bundle("cls") is None
    # Restarted, the agent gets the retained directive again and finishes the install;
    # once the install is committed it is stopped in order (SIGTERM).
    cfg.write_text(cfg.read_text().replace("health_window_s = 30.0", "health_window_s = 1.0"))
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [exe, "run", "--config", str(cfg), "--stats"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait(lambda: proc.poll() is not None or _committed(state), 90)
        assert proc.poll() is None, log.read_text(errors="replace")
        assert _committed(state), "the install did not finish after the restart"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert code == 0, log.read_text(errors="replace")
    active = Installer(state, profile_name=PROFILE).active_bundle("cls")
    assert active is not None
    assert json.loads((active / "manifest.json").read_text())["release"] == 1


def test_a_directive_for_the_previous_release_rolls_back_to_the_other_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mosquitto: Broker
) -> None:
    from agent.directives.sideload import sideload

    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", "test passphrase, made at test time")
    keys = KeyStore.create(tmp_path / "keys", root_keys=3, root_threshold=2)
    repo = Repository(tmp_path / "repo")
    repo.init(keys)
    for release in (1, 2):
        b = make_bundle(tmp_path, name="cls", version=f"1.{release}.0", release=release)
        repo.publish(b.path, keys)
    cfg = parse_config(_agent_config(tmp_path, repo, mosquitto))
    medium = tmp_path / "usb"
    (medium / "directives").mkdir(parents=True)

    def assign(release: int) -> dict[str, object]:
        for part in ("metadata", "targets"):
            shutil.rmtree(medium / part, ignore_errors=True)
            shutil.copytree(repo.path / part, medium / part)
        data = issue_directive(repo, keys, DEVICE, PROFILE, "cls", release)
        (medium / "directives" / f"{DEVICE}.json").write_bytes(data)
        return sideload(medium, cfg)

    assert assign(1)["outcome"] == "committed"
    assert assign(2)["outcome"] == "committed"
    back = assign(1)  # the fleet reverts: release 1 is intact in the other slot
    assert back["outcome"] == "rolled-back", back
    assert back["step"] == "rollback"
    installer = Installer(cfg.agent.state_dir, profile_name=PROFILE)
    active = installer.active_bundle("cls")
    assert active is not None
    assert json.loads((active / "manifest.json").read_text())["release"] == 1
