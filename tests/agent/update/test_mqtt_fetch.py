"""Bundles over MQTT against a real Mosquitto: the fleet's file server answers chunk
requests, the device's fetcher resumes after the broker goes away mid-file, and a file
server that sends more than the signed length is cut off at it."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from tuf.api.exceptions import DownloadError, DownloadHTTPError, SlowRetrievalError

from agent.kernel.bundle import load_bundle
from agent.kernel.mqtt import MqttSession, SessionOptions
from agent.update import FetchFailed, MqttFetcher
from agent.wire import topics
from agent.wire.fetch import MAX_CHUNK, decode_response
from fleet_server.distribution import FileServerError, MqttFileServer
from tests.agent.update.tuf_repo import TufRepo, make_device
from tests.support.broker import Broker, free_port

DEVICE = "cam-01"


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class SlowFileServer(MqttFileServer):
    """Takes a while per chunk, so that a test can cut the network mid-file."""

    delay_s = 0.05

    def read_chunk(self, path: str, offset: int, max_len: int) -> tuple[bytes, int]:
        time.sleep(self.delay_s)
        return super().read_chunk(path, offset, max_len)


class EndlessFileServer(MqttFileServer):
    """A hostile server: every target is endless zeros (and says it is 1 TiB long)."""

    def read_chunk(self, path: str, offset: int, max_len: int) -> tuple[bytes, int]:
        if path.startswith("targets/bundles/det/1/") and "model" in path:
            return b"\0" * max_len, 1 << 40
        return super().read_chunk(path, offset, max_len)


@pytest.fixture
def servers() -> Iterator[list[MqttFileServer]]:
    started: list[MqttFileServer] = []
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def fetchers() -> Iterator[list[MqttFetcher]]:
    made: list[MqttFetcher] = []
    yield made
    for fetcher in made:
        fetcher.close()


def serve(
    servers: list[MqttFileServer],
    repo: TufRepo,
    broker: Broker,
    cls: type[MqttFileServer] = MqttFileServer,
) -> MqttFileServer:
    server = cls(repo.dir, broker.host, broker.port)
    server.start(timeout_s=10)
    servers.append(server)
    return server


def fetcher_on(fetchers: list[MqttFetcher], broker: Broker, **options: float) -> MqttFetcher:
    options.setdefault("timeout_s", 3.0)
    fetcher = MqttFetcher(broker.host, broker.port, device_id=DEVICE, **options)  # type: ignore[arg-type]
    fetcher.start()
    fetchers.append(fetcher)
    return fetcher


def test_bundle_downloads_through_the_mqtt_file_server_in_chunks_of_256_kib(
    tmp_path: Path,
    mosquitto: Broker,
    servers: list[MqttFileServer],
    fetchers: list[MqttFetcher],
) -> None:
    repo = TufRepo(tmp_path / "repo")
    model = os.urandom(700_000)
    published = repo.publish_bundle("det", 1, model=model)
    server = serve(servers, repo, mosquitto)
    fetcher = fetcher_on(fetchers, mosquitto)
    device = make_device(tmp_path, repo, fetcher=fetcher, device_id=DEVICE)

    device.client.refresh()
    assignment = device.client.check_directive(repo.directive(published, counter=1))
    bundle = load_bundle(device.client.download_bundle(assignment, tmp_path / "slot-b"))

    assert bundle.model_file("onnx").read_bytes() == model
    assert 0 < server.stats.max_chunk <= MAX_CHUNK
    model_chunks = [s for s in server.stats.recent if s.path.endswith("model.onnx")]
    assert [s.offset for s in model_chunks] == [0, MAX_CHUNK, 2 * MAX_CHUNK]
    assert all(s.device_id == DEVICE for s in server.stats.recent)
    # the ngclient asked for root v2, got "not found", and kept root v1
    assert any(
        s.path == "metadata/2.root.json" and s.status == "not-found" for s in server.stats.recent
    )


def test_a_fetcher_on_a_shared_session_downloads_and_leaves_the_session_to_its_owner(
    tmp_path: Path,
    mosquitto: Broker,
    servers: list[MqttFileServer],
) -> None:
    """The agent's one fleet session: the fetcher registers its response subscription on
    a session it does not own and takes it out after; the session stays up."""
    repo = TufRepo(tmp_path / "repo")
    model = os.urandom(300_000)
    published = repo.publish_bundle("det", 1, model=model)
    serve(servers, repo, mosquitto)
    session = MqttSession(
        "fleet", SessionOptions(host=mosquitto.host, port=mosquitto.port, client_id="shared-1")
    )
    directive = session.subscribe(topics.directive(DEVICE), lambda _m: None)
    session.start()
    try:
        assert directive.granted.wait(10)
        fetcher = MqttFetcher.on_session(session, device_id=DEVICE, timeout_s=3.0)
        with fetcher:
            device = make_device(tmp_path, repo, fetcher=fetcher, device_id=DEVICE)
            device.client.refresh()
            assignment = device.client.check_directive(repo.directive(published, counter=1))
            slot = device.client.download_bundle(assignment, tmp_path / "slot-b")
        assert load_bundle(slot).model_file("onnx").read_bytes() == model
        assert session.connected
        assert session.snapshot()["subscriptions"] == {topics.directive(DEVICE): True}
        assert session.snapshot()["connects"] == 1
    finally:
        session.stop()


def test_attack_17_download_resumes_after_the_broker_goes_away_mid_file(
    tmp_path: Path,
    own_mosquitto: Broker,
    servers: list[MqttFileServer],
    fetchers: list[MqttFetcher],
) -> None:
    repo = TufRepo(tmp_path / "repo")
    model = os.urandom(3 * 1024 * 1024)
    published = repo.publish_bundle("det", 1, model=model)
    server = serve(servers, repo, own_mosquitto, SlowFileServer)
    fetcher = fetcher_on(fetchers, own_mosquitto, timeout_s=2.0)
    device = make_device(tmp_path, repo, fetcher=fetcher, device_id=DEVICE)
    device.client.refresh()
    assignment = device.client.check_directive(repo.directive(published, counter=1))
    result: dict[str, object] = {}

    def download() -> None:
        try:
            result["dir"] = device.client.download_bundle(assignment, tmp_path / "slot-b")
        except Exception as exc:
            result["error"] = exc

    def model_offsets() -> list[int]:
        return [s.offset for s in server.stats.recent if s.path.endswith("model.onnx")]

    worker = threading.Thread(target=download, daemon=True)
    worker.start()
    wait_for(lambda: max(model_offsets(), default=0) >= 2 * MAX_CHUNK, 30, "a third of the model")
    own_mosquitto.stop()
    cut_at = len(model_offsets())
    time.sleep(0.5)
    own_mosquitto.start()
    worker.join(60)

    assert not worker.is_alive()
    assert "error" not in result, result.get("error")
    assert load_bundle(result["dir"]).model_file("onnx").read_bytes() == model  # type: ignore[arg-type]
    offsets = model_offsets()
    assert len(offsets) > cut_at  # more was served after the cut
    assert offsets[cut_at] >= 2 * MAX_CHUNK  # resumed, not started again from 0
    assert offsets == sorted(offsets)
    # The fetcher saw the broker go; whether a request was in flight at that moment
    # (counted as a resume) or the cut fell between two requests depends on timing.
    assert fetcher.stats.disconnects >= 1


def test_attack_09_a_file_server_sending_endless_data_is_cut_at_the_signed_length(
    tmp_path: Path,
    mosquitto: Broker,
    servers: list[MqttFileServer],
    fetchers: list[MqttFetcher],
) -> None:
    repo = TufRepo(tmp_path / "repo")
    published = repo.publish_bundle("det", 1, model=b"m" * 300_000)
    server = serve(servers, repo, mosquitto, EndlessFileServer)
    fetcher = fetcher_on(fetchers, mosquitto)
    device = make_device(tmp_path, repo, fetcher=fetcher, device_id=DEVICE)
    assignment = device.client.check_directive(repo.directive(published, counter=1))

    with pytest.raises(FetchFailed, match="maximum allowed length of 300000"):
        device.client.download_bundle(assignment, tmp_path / "slot-b")

    served = [s for s in server.stats.recent if s.path.endswith("model.onnx")]
    assert len(served) == 2  # 512 KiB > 300000: the ngclient stopped asking
    assert not (tmp_path / "slot-b").exists()


def test_endless_file_stops_at_the_fetchers_deadline_without_a_length_limit(
    tmp_path: Path,
    mosquitto: Broker,
    servers: list[MqttFileServer],
    fetchers: list[MqttFetcher],
) -> None:
    repo = TufRepo(tmp_path / "repo")
    repo.publish_bundle("det", 1)
    target = repo.targets.signed.targets["bundles/det/1/model.onnx"]
    url = "edgefleet:/" + str(repo.target_file(target).relative_to(repo.dir))
    serve(servers, repo, mosquitto, EndlessFileServer)
    fetcher = fetcher_on(fetchers, mosquitto, deadline_s=0.5)

    with pytest.raises(SlowRetrievalError, match=r"after 0\.5 s"):
        for _ in fetcher.fetch(url):  # no max length: only the deadline ends it
            pass


def test_missing_file_is_not_found(
    tmp_path: Path,
    mosquitto: Broker,
    servers: list[MqttFileServer],
    fetchers: list[MqttFetcher],
) -> None:
    repo = TufRepo(tmp_path / "repo")
    serve(servers, repo, mosquitto)
    fetcher = fetcher_on(fetchers, mosquitto)

    with pytest.raises(DownloadHTTPError) as info:
        b"".join(fetcher.fetch("edgefleet:/metadata/7.root.json"))

    assert info.value.status_code == 404


def test_fetch_gives_up_after_bounded_retries_when_nobody_answers(
    mosquitto: Broker, fetchers: list[MqttFetcher]
) -> None:
    fetcher = fetcher_on(fetchers, mosquitto, timeout_s=0.3, max_retries=2)

    with pytest.raises(DownloadError, match="gave up at offset 0 after 3 tries"):
        b"".join(fetcher.fetch("edgefleet:/metadata/timestamp.json"))

    assert fetcher.stats.retries == 3


def test_fetch_from_an_unreachable_broker_fails_within_its_budget(
    fetchers: list[MqttFetcher],
) -> None:
    fetcher = MqttFetcher("127.0.0.1", free_port(), device_id=DEVICE, timeout_s=0.2, max_retries=1)
    fetchers.append(fetcher)

    with pytest.raises(DownloadError, match="not connected"):
        b"".join(fetcher.fetch("edgefleet:/metadata/timestamp.json"))


def _raw_request(broker: Broker, payload: bytes) -> tuple[dict[str, str], bytes]:
    """Send one raw request as device cam-01 and return the response's properties."""
    got: list[mqtt.MQTTMessage] = []
    ready = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_message = lambda _c, _u, msg: got.append(msg)
    client.on_subscribe = lambda *_args: ready.set()
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        client.subscribe(topics.fetch_response(DEVICE), qos=1)
        assert ready.wait(5)
        client.publish(topics.fetch_request(DEVICE), payload, qos=1)
        wait_for(lambda: bool(got), 5, "a response")
    finally:
        client.disconnect()
        client.loop_stop()
    msg = got[0]
    props = dict(msg.properties.UserProperty)  # type: ignore[union-attr]
    decode_response(bytes(msg.payload), msg.properties)
    return props, bytes(msg.payload)


@pytest.mark.parametrize(
    "path",
    ["../secret", "metadata/../../secret", "/etc/passwd", "keys/root.key", "targets/link.bin"],
)
def test_file_server_refuses_paths_outside_metadata_and_targets(
    tmp_path: Path, mosquitto: Broker, servers: list[MqttFileServer], path: str
) -> None:
    repo = TufRepo(tmp_path / "repo")
    (tmp_path / "secret").write_text("secret")
    (repo.dir / "keys").mkdir()
    (repo.dir / "keys" / "root.key").write_text("secret")
    (repo.targets_dir / "link.bin").symlink_to(tmp_path / "secret")
    server = serve(servers, repo, mosquitto)
    request = {"id": "r1", "path": path, "offset": 0, "max": 1024}

    props, payload = _raw_request(mosquitto, json.dumps(request).encode())

    assert props["status"] == "error"
    assert payload == b""
    assert server.stats.refused >= 1


def test_file_server_refuses_chunks_over_256_kib(
    tmp_path: Path, mosquitto: Broker, servers: list[MqttFileServer]
) -> None:
    repo = TufRepo(tmp_path / "repo")
    serve(servers, repo, mosquitto)
    request = {"id": "r2", "path": "metadata/root.json", "offset": 0, "max": MAX_CHUNK + 1}

    props, _ = _raw_request(mosquitto, json.dumps(request).encode())

    assert props["status"] == "error"
    assert "max" in props["reason"]


def test_file_server_without_a_repository_does_not_start(tmp_path: Path, mosquitto: Broker) -> None:
    with pytest.raises(FileServerError, match="no metadata"):
        MqttFileServer(tmp_path, mosquitto.host, mosquitto.port).start(timeout_s=1)
