"""Actions against real peers: the session Mosquitto (and one a test may stop), and
webhook targets served by a real http.server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import pwd
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from agent.actions import (
    ActionDispatcher,
    ActionEvent,
    ActionsConfig,
    MqttAction,
    WebhookAction,
)
from agent.errors import AgentError
from agent.kernel.errors import ConfigError
from agent.metrics import AgentMetrics
from agent.mqtt_config import LocalMqttConfig
from tests.support.broker import Broker, free_port, mosquitto_binary

WAIT_S = 10.0  # the bound of every wait for something that happens on its own
HOOK_VAR = "EDGEFLEET_TEST_HOOK_TOKEN"  # the name of a variable, not a secret
HOOK_FILE = "hook-token"


def event(
    n: int = 0, outcome: str = "reject", source: str = "cam1", line: str = "L1"
) -> ActionEvent:
    return ActionEvent(
        decision_id=f"d{n}",
        outcome=outcome,
        source=source,
        line=line,
        capture_time=1_700_000_000.0 + n,
        decision_time=1_700_000_000.01 + n,
        model="cls",
        model_version="1.2.0",
        score=0.93,
        label="scratch",
        summary={"n": n},
    )


def wait_for(check: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def local(broker: Broker) -> LocalMqttConfig:
    return LocalMqttConfig(host=broker.host, port=broker.port)


class Subscriber:
    """A real paho subscriber; messages land in a queue."""

    def __init__(self, broker: Broker, topic: str) -> None:
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue(maxsize=10_000)
        subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_message = lambda _c, _u, msg: self.messages.put_nowait(msg)
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos=2)
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        assert subscribed.wait(WAIT_S), "subscription not acknowledged"

    def get(self, timeout_s: float = WAIT_S) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout_s)

    def get_many(self, n: int, timeout_s: float = WAIT_S) -> list[mqtt.MQTTMessage]:
        deadline = time.monotonic() + timeout_s
        return [self.messages.get(timeout=max(deadline - time.monotonic(), 0.01)) for _ in range(n)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def subscribe(mosquitto: Broker) -> Iterator[Callable[[str], Subscriber]]:
    subs: list[Subscriber] = []

    def make(topic: str) -> Subscriber:
        subs.append(Subscriber(mosquitto, topic))
        return subs[-1]

    yield make
    for s in subs:
        s.close()


@pytest.fixture
def dispatchers() -> Iterator[Callable[..., ActionDispatcher]]:
    """Build dispatchers that are stopped at the end of the test, whatever happens."""
    made: list[ActionDispatcher] = []

    def make(*args: Any, **kwargs: Any) -> ActionDispatcher:
        made.append(ActionDispatcher(*args, **kwargs))
        return made[-1]

    yield make
    for d in made:
        d.stop(timeout_s=0.5)


class Target:
    """A webhook target: records each POST; answers ``status``, or hangs until released."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.hang = threading.Event()  # set: hold each answer until `release` is set
        self.release = threading.Event()
        self.arrived = threading.Semaphore(0)
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        target = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                target.bodies.append(json.loads(body))
                target.headers.append(dict(self.headers))
                target.arrived.release()
                if target.hang.is_set():
                    target.release.wait(WAIT_S)
                try:
                    self.send_response(target.status)
                    if 300 <= target.status < 400:
                        self.send_header("Location", "/elsewhere")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the client gave up (timeout): nothing to answer

            def do_GET(self) -> None:  # where a followed redirect would land: 200
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def target() -> Iterator[Callable[..., Target]]:
    made: list[Target] = []

    def make(status: int = 200) -> Target:
        made.append(Target(status))
        return made[-1]

    yield make
    for t in made:
        t.close()


# -- configuration ---------------------------------------------------------------------


def test_topic_with_an_unknown_placeholder_is_rejected_naming_it() -> None:
    with pytest.raises(ValidationError, match=r"\{station\}"):
        MqttAction(name="a", topic="f/{station}/x")


@pytest.mark.parametrize(
    "topic", ["f/+/x", "f/#", "", "$SYS/x", "f/{line!r}", "f/{line:>5}", "f/{}"]
)
def test_invalid_topic_templates_are_rejected(topic: str) -> None:
    with pytest.raises(ValidationError, match="topic"):
        MqttAction(name="a", topic=topic)


def test_actions_config_parses_both_kinds_and_rejects_unknown_keys() -> None:
    cfg = ActionsConfig.model_validate(
        {
            "queue_bound": 5,
            "actions": [
                {"kind": "mqtt", "name": "plc", "topic": "f/{line}/{outcome}", "qos": 2},
                {"kind": "webhook", "name": "mes", "url": "https://mes.local/hook"},
            ],
        }
    )
    assert [type(a) for a in cfg.actions] == [MqttAction, WebhookAction]
    with pytest.raises(ValidationError, match="colour"):
        ActionsConfig.model_validate(
            {"actions": [{"kind": "mqtt", "name": "a", "topic": "t", "colour": 1}]}
        )
    with pytest.raises(ValidationError, match="used twice"):
        ActionsConfig.model_validate(
            {
                "actions": [
                    {"kind": "mqtt", "name": "a", "topic": "t"},
                    {"kind": "mqtt", "name": "a", "topic": "u"},
                ]
            }
        )


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"url": "ftp://host/x"}, "http"),
        ({"url": "http://user:pw@host/x"}, "credentials"),
        ({"url": "http://h/x", "headers": {"Authorization": "Bearer abc"}}, "Authorization"),
        ({"url": "http://h/x", "headers": {"X-A": "b\r\nX-B: c"}}, "invalid"),
    ],
)
def test_webhook_config_refuses_bad_urls_and_secrets_in_headers(
    fields: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValidationError, match=match):
        WebhookAction(name="w", **fields)


def test_mqtt_action_without_a_local_broker_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no local broker"):
        ActionDispatcher([MqttAction(name="plc", topic="t")], None)


def test_webhook_with_a_token_env_that_is_not_set_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(HOOK_VAR, raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    action = WebhookAction(name="w", url="http://127.0.0.1:1/x", token_env=HOOK_VAR)
    with pytest.raises(ConfigError, match="EDGEFLEET_TEST_HOOK_TOKEN") as err:
        ActionDispatcher([action], None)
    assert err.value.field == "actions.w.token_env"


def test_event_payload_is_compact_json_with_every_field() -> None:
    e = event(3)
    body = e.payload()
    assert b" " not in body
    assert json.loads(body) == {
        "decision_id": "d3",
        "outcome": "reject",
        "source": "cam1",
        "line": "L1",
        "capture_time": 1_700_000_003.0,
        "decision_time": 1_700_000_003.01,
        "model": "cls",
        "model_version": "1.2.0",
        "score": 0.93,
        "label": "scratch",
        "summary": {"n": 3},
    }


# -- MQTT --------------------------------------------------------------------------------


def test_mqtt_action_publishes_payload_with_qos_1_on_the_rendered_topic(
    mosquitto: Broker,
    subscribe: Callable[[str], Subscriber],
    dispatchers: Callable[..., ActionDispatcher],
) -> None:
    sub = subscribe("qos1/#")
    d = dispatchers(
        [MqttAction(name="plc", topic="qos1/{line}/{source}/{outcome}", qos=1)], local(mosquitto)
    )
    d.start()
    d.dispatch(event(1, outcome="reject", source="cam7", line="L3"))
    msg = sub.get()
    assert msg.topic == "qos1/L3/cam7/reject"
    assert msg.qos == 1
    assert not msg.retain
    assert json.loads(msg.payload)["decision_id"] == "d1"
    assert wait_for(lambda: d.stats()["plc"]["sent"] == 1)
    assert d.stats()["plc"] == {"sent": 1, "failed": 0, "dropped": 0, "timeouts": 0, "queued": 0}


def test_retained_publish_reaches_a_late_subscriber(
    mosquitto: Broker, dispatchers: Callable[..., ActionDispatcher]
) -> None:
    d = dispatchers(
        [
            MqttAction(name="kept", topic="retain/{source}/kept", retain=True),
            MqttAction(name="gone", topic="retain/{source}/gone", retain=False),
        ],
        local(mosquitto),
    )
    d.start()
    d.dispatch(event(5, source="camR"))
    assert wait_for(lambda: d.stats()["kept"]["sent"] == 1 and d.stats()["gone"]["sent"] == 1)
    # A subscriber that arrives afterwards: only the retained one is there for it.
    out = subprocess.run(
        ["mosquitto_sub", "-h", mosquitto.host, "-p", str(mosquitto.port), "-t", "retain/camR/#",
         "-F", "%t %r %p", "-W", "1"],
        capture_output=True, text=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out
    topic, retained, payload = lines[0].split(" ", 2)
    assert (topic, retained) == ("retain/camR/kept", "1")
    assert json.loads(payload)["decision_id"] == "d5"


def test_actions_fire_only_on_their_outcomes(
    mosquitto: Broker,
    subscribe: Callable[[str], Subscriber],
    dispatchers: Callable[..., ActionDispatcher],
) -> None:
    sub = subscribe("filter/#")
    d = dispatchers(
        [
            MqttAction(
                name="rejects", topic="filter/rejects/{outcome}", outcomes=["reject", "review"]
            ),
            MqttAction(name="all", topic="filter/all/{outcome}"),
        ],
        local(mosquitto),
    )
    d.start()
    for n, outcome in enumerate(["pass", "reject", "review", "pass"]):
        d.dispatch(event(n, outcome=outcome))
    got = sorted(m.topic for m in sub.get_many(6))
    assert got == sorted(
        [
            "filter/rejects/reject",
            "filter/rejects/review",
            "filter/all/pass",
            "filter/all/reject",
            "filter/all/review",
            "filter/all/pass",
        ]
    )
    assert wait_for(lambda: d.stats()["all"]["sent"] == 4)
    assert d.stats()["rejects"]["sent"] == 2
    with pytest.raises(queue.Empty):
        sub.get(timeout_s=0.2)


def test_value_that_would_break_the_topic_is_counted_failed(
    mosquitto: Broker, dispatchers: Callable[..., ActionDispatcher]
) -> None:
    d = dispatchers([MqttAction(name="plc", topic="bad/{source}")], local(mosquitto))
    d.start()
    d.dispatch(event(1, source="cam/+"))
    d.dispatch(event(2, source="cam2"))
    assert wait_for(lambda: d.stats()["plc"]["sent"] == 1 and d.stats()["plc"]["failed"] == 1)


def test_broker_down_counts_failures_without_raising_and_publishing_resumes_after_restart(
    own_mosquitto: Broker, dispatchers: Callable[..., ActionDispatcher]
) -> None:
    d = dispatchers(
        [MqttAction(name="plc", topic="down/x", ack_timeout_s=0.3)], local(own_mosquitto)
    )
    d.start()
    d.dispatch(event(0))
    assert wait_for(lambda: d.stats()["plc"]["sent"] == 1)

    own_mosquitto.stop()
    assert wait_for(lambda: d.mqtt_connected is False)
    for n in range(1, 4):
        d.dispatch(event(n))  # must not raise
    assert wait_for(lambda: d.stats()["plc"]["failed"] + d.stats()["plc"]["timeouts"] == 3)
    assert d.stats()["plc"]["sent"] == 1

    own_mosquitto.start()
    assert wait_for(lambda: d.mqtt_connected is True, timeout_s=15)
    d.dispatch(event(10))
    assert wait_for(lambda: d.stats()["plc"]["sent"] == 2)


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[Broker]:
    """A Mosquitto whose ACL lets anonymous clients write only under ``allowed/``."""
    port = free_port()
    (tmp_path / "acl").write_text("topic write allowed/#\n")
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        # As root Mosquitto would switch to the user "mosquitto", who can't read tmp_path.
        f"user {pwd.getpwuid(os.getuid()).pw_name}\nacl_file {tmp_path / 'acl'}\n"
    )
    log = (tmp_path / "mosquitto.log").open("wb")
    proc = subprocess.Popen([mosquitto_binary(), "-c", str(conf)], stdout=log, stderr=log)
    broker = Broker("127.0.0.1", port, tmp_path)
    try:
        assert wait_for(lambda: _listening(port)), "mosquitto with ACL did not start"
        yield broker
    finally:
        proc.terminate()
        proc.wait(5)
        log.close()


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def test_publish_the_broker_refuses_is_counted_failed(
    acl_broker: Broker, dispatchers: Callable[..., ActionDispatcher]
) -> None:
    d = dispatchers(
        [
            MqttAction(name="ok", topic="allowed/{source}"),
            MqttAction(name="denied", topic="denied/{source}"),
        ],
        local(acl_broker),
    )
    d.start()
    d.dispatch(event(1))
    d.dispatch(event(2))
    assert wait_for(lambda: d.stats()["ok"]["sent"] == 2 and d.stats()["denied"]["failed"] == 2)
    assert d.stats()["denied"]["sent"] == 0


def test_events_dispatched_past_the_queue_bound_are_dropped_with_exact_counts(
    mosquitto: Broker, dispatchers: Callable[..., ActionDispatcher]
) -> None:
    metrics = AgentMetrics()
    d = dispatchers(
        [MqttAction(name="plc", topic="bound/x")], local(mosquitto), queue_bound=10, metrics=metrics
    )
    for n in range(15):  # not started yet: nothing takes events off the queue
        d.dispatch(event(n))
    assert d.stats()["plc"] == {"sent": 0, "failed": 0, "dropped": 5, "timeouts": 0, "queued": 10}
    d.start()
    assert wait_for(lambda: d.stats()["plc"]["sent"] == 10)
    assert d.stats()["plc"]["dropped"] == 5
    samples = {
        (s.labels.get("result"), s.name): s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        if f.name == "edgefleet_actions"
        for s in f.samples
    }
    assert samples[("sent", "edgefleet_actions_total")] == 10
    assert samples[("dropped", "edgefleet_actions_total")] == 5


def test_events_older_than_max_age_are_dropped_not_sent(
    mosquitto: Broker, dispatchers: Callable[..., ActionDispatcher]
) -> None:
    d = dispatchers([MqttAction(name="plc", topic="stale/x", max_age_s=0.05)], local(mosquitto))
    for n in range(3):
        d.dispatch(event(n))
    time.sleep(0.2)  # they wait in the queue longer than max_age_s
    d.start()
    assert wait_for(lambda: d.stats()["plc"]["dropped"] == 3)
    d.dispatch(event(9))
    assert wait_for(lambda: d.stats()["plc"]["sent"] == 1)


def test_stop_counts_what_is_left_as_dropped_and_later_dispatches_too(
    target: Callable[..., Target], dispatchers: Callable[..., ActionDispatcher]
) -> None:
    t = target()
    t.hang.set()
    d = dispatchers([WebhookAction(name="mes", url=t.url, timeout_s=5)], None, queue_bound=100)
    d.start()
    for n in range(20):
        d.dispatch(event(n))
    assert t.arrived.acquire(timeout=WAIT_S)
    d.stop(timeout_s=0.2)
    s = d.stats()["mes"]
    assert s["dropped"] == 19  # the one in flight is still being delivered
    assert s["queued"] == 0
    d.dispatch(event(99))
    assert d.stats()["mes"]["dropped"] == 20
    t.release.set()
    assert wait_for(lambda: d.stats()["mes"]["sent"] == 1)
    with pytest.raises(AgentError, match="start"):
        d.start()


# -- webhook -----------------------------------------------------------------------------


def test_webhook_2xx_is_counted_sent_with_json_and_bearer_token(
    target: Callable[..., Target],
    dispatchers: Callable[..., ActionDispatcher],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(HOOK_VAR, "s3cret")
    t = target(204)
    action = WebhookAction(name="mes", url=t.url, headers={"X-Line": "L1"}, token_env=HOOK_VAR)
    d = dispatchers([action], None)
    d.start()
    d.dispatch(event(4))
    assert wait_for(lambda: d.stats()["mes"]["sent"] == 1)
    assert t.bodies == [json.loads(event(4).payload())]
    assert t.headers[0]["Authorization"] == "Bearer s3cret"
    assert t.headers[0]["Content-Type"] == "application/json"
    assert t.headers[0]["X-Line"] == "L1"


def test_webhook_token_is_read_from_the_credentials_directory(
    target: Callable[..., Target], dispatchers: Callable[..., ActionDispatcher],
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
) -> None:  # fmt: skip
    (tmp_path / HOOK_FILE).write_text("from-file\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    t = target()
    d = dispatchers([WebhookAction(name="mes", url=t.url, token_env=HOOK_FILE)], None)
    d.start()
    d.dispatch(event(1))
    assert wait_for(lambda: d.stats()["mes"]["sent"] == 1)
    assert t.headers[0]["Authorization"] == "Bearer from-file"


@pytest.mark.parametrize("status", [500, 404, 302])
def test_webhook_non_2xx_is_counted_failed(
    status: int, target: Callable[..., Target], dispatchers: Callable[..., ActionDispatcher]
) -> None:
    t = target(status)
    d = dispatchers([WebhookAction(name="mes", url=t.url)], None)
    d.start()
    d.dispatch(event(1))
    d.dispatch(event(2))
    assert wait_for(lambda: d.stats()["mes"]["failed"] == 2)
    assert d.stats()["mes"]["sent"] == 0


def test_webhook_connection_refused_is_counted_failed(
    dispatchers: Callable[..., ActionDispatcher],
) -> None:
    d = dispatchers([WebhookAction(name="mes", url=f"http://127.0.0.1:{free_port()}/x")], None)
    d.start()
    d.dispatch(event(1))
    assert wait_for(lambda: d.stats()["mes"]["failed"] == 1)


def test_webhook_slower_than_its_timeout_is_counted_timeout(
    target: Callable[..., Target], dispatchers: Callable[..., ActionDispatcher]
) -> None:
    t = target()
    t.hang.set()
    d = dispatchers([WebhookAction(name="mes", url=t.url, timeout_s=0.2)], None)
    d.start()
    d.dispatch(event(1))
    assert wait_for(lambda: d.stats()["mes"]["timeouts"] == 1)
    assert d.stats()["mes"]["sent"] == d.stats()["mes"]["failed"] == 0


def test_slow_webhook_neither_blocks_dispatch_nor_delays_mqtt(
    mosquitto: Broker,
    subscribe: Callable[[str], Subscriber],
    target: Callable[..., Target],
    dispatchers: Callable[..., ActionDispatcher],
) -> None:
    webhook_timeout_s = 2.0
    n = 1000
    sub = subscribe("flow/#")
    t = target()
    t.hang.set()
    d = dispatchers(
        [
            WebhookAction(name="slow", url=t.url, timeout_s=webhook_timeout_s),
            MqttAction(name="plc", topic="flow/{source}"),
        ],
        local(mosquitto),
        queue_bound=n,
    )
    d.start()
    d.dispatch(event(0))
    assert t.arrived.acquire(timeout=WAIT_S)  # the webhook's thread is now stuck

    t0 = time.monotonic()
    for i in range(1, n):
        d.dispatch(event(i))
    elapsed = time.monotonic() - t0
    # Structural, not a benchmark: putting on a queue is orders of magnitude below the
    # webhook's timeout; a dispatch that waited for the webhook would take 2 s each.
    assert elapsed < webhook_timeout_s / 4

    got = sub.get_many(n, timeout_s=30)
    assert sorted(json.loads(m.payload)["summary"]["n"] for m in got) == list(range(n))
    assert wait_for(lambda: d.stats()["plc"]["sent"] == n)
    slow = d.stats()["slow"]
    assert slow["sent"] == slow["failed"] == slow["dropped"] == 0
    assert slow["timeouts"] + slow["queued"] >= n - 1  # the rest is the one in flight
    t.release.set()
