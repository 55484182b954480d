"""A sensor whose readings arrive on a topic of the device's local MQTT broker.

One MQTT session (:class:`agent.kernel.mqtt.MqttSession`): it reconnects after a lost
connection and subscribes again on every connect; a refused connect or subscription
leaves the sensor down, with the reason; every callback is wrapped and paho's thread
supervised: no payload stops the sensor from reading. A sensor with no reading for longer than
``max_silence_s`` is reported silent (:meth:`MqttSensor.silent_s`).
"""

from __future__ import annotations

import logging
import threading
import time

import paho.mqtt.client as mqtt

from agent.errors import SensorError
from agent.kernel.mqtt import MqttSession, SessionOptions
from agent.kernel.mqttguard import MqttGuard
from agent.mqtt_config import LocalMqttConfig
from agent.sensors.base import SensorSource, SensorStats
from agent.sensors.config import SensorConfig
from agent.sensors.parse import BadReading, parse_payload

logger = logging.getLogger(__name__)

_RECONNECT_MIN_S = 1
_RECONNECT_MAX_S = 10
_QOS = 0  # the newest reading matters; one lost in a reconnect is not resent


class MqttSensor(SensorSource):
    """Subscribes to ``config.topic`` on the local broker and windows the readings."""

    def __init__(self, config: SensorConfig, broker: LocalMqttConfig) -> None:
        super().__init__(config)
        self.broker = broker
        self.client_id = f"{broker.client_id_prefix}-sensor-{config.name}"
        self.session: MqttSession | None = None
        self._stopping = threading.Event()
        self._messages = 0
        self._since = time.monotonic()
        """When the last reading came (or the sensor started)."""
        self.guard = MqttGuard(f"sensor {config.name}")

    @property
    def _client(self) -> mqtt.Client | None:
        """The paho client of the running session (None when stopped)."""
        return None if self.session is None else self.session.client

    def start(self) -> None:
        """Connect in the background; the sensor is up once the subscription is granted.

        Raises:
            SensorError: the sensor is already running.
        """
        if self.session is not None:
            raise SensorError(self.name, "already started")
        self._stopping.clear()
        self._slot.reopen()
        b = self.broker
        session = MqttSession(
            f"sensor {self.name}",
            SessionOptions(
                host=b.host,
                port=b.port,
                client_id=self.client_id,
                keepalive_s=b.keepalive_s,
                username=b.username,
                password=b.password(),
                reconnect_min_s=_RECONNECT_MIN_S,
                reconnect_max_s=_RECONNECT_MAX_S,
                check_s=self.guard.check_s,
            ),
        )
        self.guard = session.guard
        session.add_listener(on_down=self._on_down)
        session.subscribe(self.config.topic, self._on_message, qos=_QOS, on_suback=self._on_suback)
        self.session = session
        self._since = time.monotonic()
        session.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Disconnect and end paho's thread, waiting up to ``timeout_s``."""
        self._stopping.set()
        self._slot.close()
        session, self.session = self.session, None
        if session is not None:
            session.stop(timeout_s)
        self._set_up(False, "stopped", failure=False)

    def silent_s(self) -> float:
        """Seconds since the last reading (or since the start, before the first)."""
        return time.monotonic() - self._since

    @property
    def silent(self) -> bool:
        """Whether no reading came for longer than ``max_silence_s``."""
        return self.silent_s() > self.config.max_silence_s

    def stats(self) -> SensorStats:
        """The counters of :meth:`SensorSource.stats`, and the MQTT thread's state:
        thread_alive, thread_restarts, callback_errors, silent_s (whole seconds), silent."""
        out = super().stats()
        out["thread_alive"] = self.guard.thread_alive
        out["thread_restarts"] = self.guard.restarts
        out["callback_errors"] = self.guard.error_count
        out["silent_s"] = int(self.silent_s())
        out["silent"] = self.silent
        return out

    # --- session callbacks (paho's thread) -----------------------------------------------

    def _on_suback(self, granted: bool, reason: str) -> None:
        if not granted:
            self._count_error(reason)
            self._set_up(False, reason)
            return
        self._set_up(True, f"subscribed to {self.config.topic}")

    def _on_down(self, reason: str) -> None:
        self._reset_window()  # readings across a gap are no time series
        if self._stopping.is_set():
            return
        self._count_error(reason)
        self._set_up(False, reason)

    def _on_message(self, message: mqtt.MQTTMessage) -> None:
        t_ns = time.perf_counter_ns()
        wall = time.time()
        self._messages += 1
        try:
            values = parse_payload(bytes(message.payload), self.config.fields, self.name)
        except BadReading as e:
            self._reject(f"message {self._messages} on {message.topic}", e.reason)
            return
        self._since = time.monotonic()
        self._deliver(values, t_ns, wall)  # an exception is the guard's: caught, counted
