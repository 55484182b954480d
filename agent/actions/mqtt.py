"""MQTT actions: one MQTT session (:mod:`agent.kernel.mqtt`) on the local broker, shared
by a dispatcher's MQTT actions.

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
import time
import uuid

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode

from agent.actions.config import MqttAction
from agent.actions.errors import ActionFailed, ActionTimeout
from agent.actions.event import ActionEvent
from agent.kernel.mqtt import MqttSession, SessionOptions
from agent.mqtt_config import LocalMqttConfig

log = logging.getLogger(__name__)

RECONNECT_MIN_S = 1
RECONNECT_MAX_S = 5  # the broker is local: come back quickly once it is


class MqttPublisher:
    """An MQTT session (MQTT 5, clean start) on the local broker that reconnects by itself
    and reports, per publish, whether the broker took it.
    """

    def __init__(self, config: LocalMqttConfig, *, max_in_flight: int = 1000) -> None:
        self.config = config
        self.client_id = f"{config.client_id_prefix}-actions-{uuid.uuid4().hex[:8]}"
        self.session = MqttSession(
            "mqtt actions",
            SessionOptions(
                host=config.host,
                port=config.port,
                client_id=self.client_id,
                keepalive_s=config.keepalive_s,
                clean_start=True,
                username=config.username,
                password=config.password(),
                reconnect_min_s=RECONNECT_MIN_S,
                reconnect_max_s=RECONNECT_MAX_S,
                max_queued_messages=max_in_flight,
            ),
        )
        self.guard = self.session.guard
        self.session.add_listener(on_up=self._on_up, on_down=self._on_down)

    @property
    def where(self) -> str:
        return f"{self.config.host}:{self.config.port}"

    @property
    def connected(self) -> bool:
        """Whether the broker accepted the connection and it is still up."""
        return self.session.connected

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the connection; whether it is up."""
        return self.session.wait_connected(timeout_s)

    def start(self) -> None:
        """Connect in the background (never blocks on the network) and keep reconnecting."""
        self.session.start()

    def stop(self) -> None:
        """Disconnect and stop paho's network thread."""
        self.session.stop()

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
        if not self.session.wait_connected(timeout_s):
            raise ActionFailed(action, f"not connected to the local broker {self.where}")
        try:
            delivery = self.session.publish(topic, payload, qos=qos, retain=retain)
        except ValueError as exc:
            raise ActionFailed(action, f"can't publish on {topic!r}: {exc}") from exc
        if delivery.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            # NO_CONN: the connection dropped just now; QUEUE_SIZE: paho's store is full.
            raise ActionFailed(action, f"publish refused by paho: {mqtt.error_string(delivery.rc)}")
        if not delivery.wait(max(deadline - time.monotonic(), 0.001)):
            raise ActionTimeout(
                action, f"publish on {topic!r} not acknowledged within {timeout_s:g} s"
            )
        if delivery.refused:
            raise ActionFailed(
                action, f"broker refused the publish on {topic!r}: {delivery.reason}"
            )

    def _on_up(self) -> None:
        log.info("actions connected to the local broker %s", self.where)

    def _on_down(self, reason: str) -> None:
        if "refused" in reason:
            log.error("local broker %s refused the actions client: %s", self.where, reason)


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
