"""MQTT actions: one paho client on the local broker, shared by a dispatcher's MQTT actions.

Delivery rule: a publish counts as sent once the broker acknowledged it (QoS 1/2, with a
success reason code) or paho wrote it (QoS 0), within the action's ``ack_timeout_s``; that
budget includes waiting for the connection. While the broker is away nothing is handed to
paho, so nothing piles up there: the event is counted failed once the budget is spent. A
publish that timed out stays in paho's (bounded) in-flight store and may still reach the
broker after a reconnect; the payload carries ``decision_time`` so a consumer can discard
a late one. Keeping decisions is the decision log's job, not the action's.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from agent.actions.config import MqttAction
from agent.actions.errors import ActionFailed, ActionTimeout
from agent.actions.event import ActionEvent
from agent.kernel.mqttguard import MqttGuard
from agent.mqtt_config import LocalMqttConfig

log = logging.getLogger(__name__)

RECONNECT_MIN_S = 1
RECONNECT_MAX_S = 5  # the broker is local: come back quickly once it is
_MAX_TRACKED = 65536  # MQTT message ids are 16 bit


class MqttPublisher:
    """A paho client (MQTT 5, clean start) that reconnects by itself and reports, per
    publish, whether the broker took it.
    """

    def __init__(self, config: LocalMqttConfig, *, max_in_flight: int = 1000) -> None:
        self.config = config
        self.client_id = f"{config.client_id_prefix}-actions-{uuid.uuid4().hex[:8]}"
        self._connected = threading.Event()
        self._lock = threading.Lock()
        # mid -> reason code of its PUBACK/PUBCOMP. An entry left by a publish that timed
        # out is overwritten by the next acknowledgement of the same mid, which comes before
        # that publish reads it; mids are 16 bit, so the map stays small.
        self._acks: OrderedDict[int, ReasonCode] = OrderedDict()
        self._started = False
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5
        )
        if config.username:
            client.username_pw_set(config.username, config.password())
        client.reconnect_delay_set(RECONNECT_MIN_S, RECONNECT_MAX_S)
        client.max_queued_messages_set(max_in_flight)
        self.guard = MqttGuard("mqtt actions")
        client.on_connect = self.guard.wrap("on_connect", self._on_connect)
        client.on_disconnect = self.guard.wrap("on_disconnect", self._on_disconnect)
        client.on_publish = self.guard.wrap("on_publish", self._on_publish)
        self._client = client

    @property
    def where(self) -> str:
        return f"{self.config.host}:{self.config.port}"

    @property
    def connected(self) -> bool:
        """Whether the broker accepted the connection and it is still up."""
        return self._connected.is_set()

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the connection; whether it is up."""
        return self._connected.wait(timeout_s)

    def start(self) -> None:
        """Connect in the background (never blocks on the network) and keep reconnecting."""
        if self._started:
            return
        self._started = True
        self.guard.start(
            self._client,
            lambda: self._client.connect_async(
                self.config.host, self.config.port, self.config.keepalive_s, clean_start=True
            ),
            on_restart=self._connected.clear,
        )

    def stop(self) -> None:
        """Disconnect and stop paho's network thread (it notices within about a second)."""
        if not self._started:
            return
        self._started = False
        self.guard.stop()
        self._client.disconnect()
        self._client.loop_stop()
        self._connected.clear()

    def publish(
        self, action: str, topic: str, payload: bytes, qos: int, retain: bool, timeout_s: float
    ) -> None:
        """Publish and wait for the broker's acknowledgement.

        Raises:
            ActionFailed: not connected within ``timeout_s``, the topic is invalid, paho
                refused the message, or the broker answered with a failure reason code.
            ActionTimeout: connected, but not acknowledged within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        if not self._connected.wait(timeout_s):
            raise ActionFailed(action, f"not connected to the local broker {self.where}")
        try:
            info = self._client.publish(topic, payload, qos=qos, retain=retain)
        except ValueError as exc:
            raise ActionFailed(action, f"can't publish on {topic!r}: {exc}") from exc
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            # NO_CONN: the connection dropped just now; QUEUE_SIZE: paho's store is full.
            raise ActionFailed(action, f"publish refused by paho: {mqtt.error_string(info.rc)}")
        try:
            info.wait_for_publish(max(deadline - time.monotonic(), 0.001))
        except (RuntimeError, ValueError) as exc:
            raise ActionFailed(action, f"publish on {topic!r} failed: {exc}") from exc
        if not info.is_published():
            raise ActionTimeout(
                action, f"publish on {topic!r} not acknowledged within {timeout_s:g} s"
            )
        with self._lock:
            code = self._acks.pop(info.mid, None)
        if code is not None and code.is_failure:
            raise ActionFailed(action, f"broker refused the publish on {topic!r}: {code}")

    def _on_publish(
        self, _client: mqtt.Client, _userdata: Any, mid: int, reason: ReasonCode, _props: Any
    ) -> None:
        with self._lock:
            self._acks[mid] = reason
            self._acks.move_to_end(mid)
            while len(self._acks) > _MAX_TRACKED:
                self._acks.popitem(last=False)

    def _on_connect(
        self, _client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        if reason.is_failure:
            self._connected.clear()
            log.error("local broker %s refused the actions client: %s", self.where, reason)
            return
        log.info("actions connected to the local broker %s", self.where)
        self._connected.set()

    def _on_disconnect(
        self, _client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        was_up = self._connected.is_set()
        self._connected.clear()
        if was_up and self._started:
            log.warning("actions lost the local broker %s: %s", self.where, reason)


def render_topic(action: MqttAction, event: ActionEvent) -> str:
    """The action's topic for ``event``.

    Raises:
        ActionFailed: a placeholder's value would make an invalid topic (it contains
            ``/``, ``+``, ``#`` or NUL).
    """
    values = {"line": event.line, "source": event.source, "outcome": event.outcome}
    for key, value in values.items():
        if any(c in value for c in "/+#\0"):
            raise ActionFailed(action.name, f"{key} {value!r} can't go into a topic")
    return action.topic.format(**values)


class MqttSender:
    """Delivers events for one MQTT action through a shared :class:`MqttPublisher`."""

    def __init__(self, action: MqttAction, publisher: MqttPublisher) -> None:
        self.action = action
        self.name = action.name
        self._publisher = publisher

    def send(self, event: ActionEvent) -> None:
        """Publish ``event``; raises :class:`ActionFailed` or :class:`ActionTimeout`."""
        a = self.action
        self._publisher.publish(
            a.name, render_topic(a, event), event.payload(), a.qos, a.retain, a.ack_timeout_s
        )
