"""What an :class:`agent.kernel.mqtt.MqttSession` connects to and how: broker, identity,
session kind, last will, backoff."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Literal

import paho.mqtt.client as mqtt

from agent.kernel.mqttguard import CHECK_S


@dataclass(frozen=True)
class Will:
    """The message the broker publishes when the connection dies (or on a stop that
    asks for it)."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True


@dataclass(frozen=True)
class SessionOptions:
    """How to reach the broker and what kind of session to hold."""

    host: str
    port: int
    client_id: str
    mqtt5: bool = True
    """MQTT 5 (default) or 3.1.1."""
    keepalive_s: int = 30
    clean_start: bool | Literal[3] = mqtt.MQTT_CLEAN_START_FIRST_ONLY
    """MQTT 5: True, False or paho's "first connect only"; 3.1.1: clean session."""
    session_expiry_s: int | None = None
    """MQTT 5: keep the session this long after a disconnect (a persistent session)."""
    receive_maximum: int | None = None
    """MQTT 5: most unacknowledged messages the broker may send at once."""
    manual_ack: bool = False
    """The owner acknowledges received QoS > 0 messages itself (:meth:`MqttSession.ack`)."""
    tls: ssl.SSLContext | None = None
    username: str | None = None
    password: str | None = None
    will: Will | None = None
    reconnect_min_s: int = 1
    reconnect_max_s: int = 10
    max_queued_messages: int = 0
    """Messages paho holds in memory (unacknowledged or offline); 0: no bound."""
    check_s: float = CHECK_S
    """How often the guard looks at the network thread."""


__all__ = ["SessionOptions", "Will"]
