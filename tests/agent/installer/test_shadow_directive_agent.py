"""A shadow directive delivered to a running agent over a real Mosquitto: the bundle is
fetched over MQTT, checked, put into slot-shadow, and the agent's pipelines pick the
candidate up (the directives service's reload after every directive); the live model
keeps deciding. A later switch directive empties the slot and the shadow goes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from agent.app import Agent
from agent.config import parse_config
from agent.directives.report import reported_state
from agent.installer.shadow import shadow_bundle
from agent.pipeline.runner import Decision
from agent.wire import topics
from fleet_server.distribution.file_server import MqttFileServer
from fleet_server.repository import KeyStore, Repository
from fleet_server.repository.director import issue_directive
from tests.agent.installer.installer_helpers import PROFILE, make_bundle
from tests.support.broker import Broker

DEVICE = "gw-shadow-1"


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
    keys = KeyStore.create(tmp_path / "keys", root_keys=1, root_threshold=1)
    repo = Repository(tmp_path / "repo")
    repo.init(keys)
    for release in (1, 2, 3):
        b = make_bundle(tmp_path, name="cls", version=f"1.{release}.0", release=release)
        repo.publish(b.path, keys)
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


def test_a_shadow_directive_reaches_the_running_pipelines_and_a_switch_ends_it(
    tmp_path: Path,
    fleet: tuple[KeyStore, Repository],
    mosquitto: Broker,
    file_server: None,
) -> None:
    keys, repo = fleet
    state = tmp_path / "state"
    cfg = parse_config(
        {
            "agent": {"device_id": DEVICE, "state_dir": str(state), "profile": PROFILE},
            "runtime": {"workers": 1, "pin": False},
            "decision_log": {"thumbnails": "none"},
            "cameras": [{"name": "c1", "kind": "synthetic", "fps": 30, "pattern": "bars"}],
            "pipelines": [{"name": "p", "source": "c1", "installed": "cls"}],
            "shadow": {"enabled": True, "sample": 1.0, "max_fps": 30},
            "bundles": {
                "enabled": True,
                "mqtt": {"host": mosquitto.host, "port": mosquitto.port},
                "initial_root": str(repo.path / "metadata" / "1.root.json"),
                "installer": {"health_window_s": 1.0, "health_poll_s": 0.2, "benchmark_runs": 5},
            },
        }
    )
    versions: list[str] = []
    lock = threading.Lock()

    def on_decision(d: Decision, _id: str) -> None:
        with lock:
            versions.append(d.record.model_version)

    topic = topics.directive(DEVICE)
    agent = Agent(cfg, http=False, on_decision=on_decision)
    agent.start()
    try:
        updates = agent.updates
        assert updates is not None

        def report(n: int) -> dict[str, object]:
            assert _wait(lambda: len(updates.reports) >= n, 60), f"no report {n}"
            return updates.reports[n - 1]

        _publish_retained(mosquitto, topic, issue_directive(repo, keys, DEVICE, PROFILE, "cls", 1))
        assert report(1)["outcome"] == "committed"
        assert _wait(lambda: "1.1.0" in versions, 20), "the agent does not decide with 1.1.0"

        shadow = issue_directive(repo, keys, DEVICE, PROFILE, "cls", 2, mode="shadow")
        _publish_retained(mosquitto, topic, shadow)
        second = report(2)
        assert (second["outcome"], second["mode"], second["slot"]) == (
            "committed",
            "shadow",
            "shadow",
        ), second
        assert shadow_bundle(state, "cls") is not None
        assert _wait(lambda: "p" in agent.pipelines.shadows, 20), "the shadow never started"
        fields = reported_state(PROFILE, agent.installer, {})
        assert fields["shadow"]["release"] == 2
        assert fields["active"]["release"] == 1
        with lock:
            n = len(versions)
        assert _wait(lambda: len(versions) > n + 5, 20), "the live pipeline stopped deciding"
        with lock:
            assert set(versions[n:]) == {"1.1.0"}, "the shadow acted"

        def compared() -> int:
            return sum(s.n for k, s in agent.pipelines.shadow_stats.items() if k.release == 2)

        assert _wait(lambda: compared() > 0, 20), "the candidate never saw a frame"

        _publish_retained(mosquitto, topic, issue_directive(repo, keys, DEVICE, PROFILE, "cls", 2))
        third = report(3)
        assert (third["outcome"], third["mode"], third["shadow_cleared"]) == (
            "committed",
            "active",
            2,
        ), third
        assert shadow_bundle(state, "cls") is None
        assert _wait(lambda: "p" not in agent.pipelines.shadows, 20), "the shadow kept running"
        with lock:
            n = len(versions)
        assert _wait(lambda: versions[n:].count("1.2.0") >= 3, 20), "not deciding with 1.2.0"

        # a candidate again; then the fleet clears the directive (the revert of a device
        # that ran no signed bundle before): no candidate runs without a directive
        shadow = issue_directive(repo, keys, DEVICE, PROFILE, "cls", 3, mode="shadow")
        _publish_retained(mosquitto, topic, shadow)
        assert report(4)["mode"] == "shadow"
        assert _wait(lambda: "p" in agent.pipelines.shadows, 20), "the shadow never started"
        _publish_retained(mosquitto, topic, b"")
        fifth = report(5)
        assert (fifth["outcome"], fifth["release"]) == ("removed", 3), fifth
        assert shadow_bundle(state, "cls") is None
        assert _wait(lambda: "p" not in agent.pipelines.shadows, 20), "the shadow kept running"
        with lock:
            n = len(versions)
        assert _wait(lambda: len(versions) > n + 5, 20), "the live pipeline stopped deciding"
        with lock:
            assert set(versions[n:]) == {"1.2.0"}
    finally:
        agent.stop()
