"""A sensor whose readings arrive on a topic of the device's local MQTT broker.

paho-mqtt with version-2 callbacks, ``connect_async`` + ``loop_start``; paho reconnects
after a lost connection and the sensor subscribes again on every connect. Every reason
code is checked: a refused connect or subscription leaves the sensor down, with the reason.
Every callback is wrapped and paho's thread supervised (:class:`agent.kernel.mqttguard.MqttGuard`):
no payload stops the sensor from reading. A sensor with no reading for longer than
``max_silence_s`` is reported silent (:meth:`MqttSensor.silent_s`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.errors import SensorError
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
        self._client: mqtt.Client | None = None
        self._stopping = threading.Event()
        self._messages = 0
        self._since = time.monotonic()
        """When the last reading came (or the sensor started)."""
        self.guard = MqttGuard(f"sensor {config.name}")

    def start(self) -> None:
        """Connect in the background; the sensor is up once the subscription is granted.

        Raises:
            SensorError: the sensor is already running.
        """
        if self._client is not None:
            raise SensorError(self.name, "already started")
        self._stopping.clear()
        self._slot.reopen()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
        )
        if self.broker.username:
            client.username_pw_set(self.broker.username, self.broker.password())
        guard = self.guard = MqttGuard(f"sensor {self.name}", check_s=self.guard.check_s)
        client.on_connect = guard.wrap("on_connect", self._on_connect)
        client.on_connect_fail = guard.wrap("on_connect_fail", self._on_connect_fail)
        client.on_disconnect = guard.wrap("on_disconnect", self._on_disconnect)
        client.on_subscribe = guard.wrap("on_subscribe", self._on_subscribe)
        client.on_message = guard.wrap("on_message", self._on_message)
        client.reconnect_delay_set(_RECONNECT_MIN_S, _RECONNECT_MAX_S)
        self._client = client
        self._since = time.monotonic()
        guard.start(
            client,
            lambda: client.connect_async(
                self.broker.host, self.broker.port, self.broker.keepalive_s
            ),
            on_restart=lambda: self._set_up(False, "MQTT thread died; reconnecting"),
        )

    def stop(self, timeout_s: float = 2.0) -> None:
        """Disconnect and end paho's thread, waiting up to ``timeout_s``."""
        self._stopping.set()
        self._slot.close()
        client, self._client = self._client, None
        self.guard.stop()
        if client is not None:
            client.disconnect()
            # loop_stop joins paho's thread without a timeout: bound it from here
            stopper = threading.Thread(target=client.loop_stop, daemon=True)
            stopper.start()
            stopper.join(max(0.0, timeout_s))
            if stopper.is_alive():
                logger.warning("sensor %s: MQTT thread did not end in %.1f s", self.name, timeout_s)
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

    # --- paho callbacks (paho's thread) ---------------------------------------------------

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            reason = f"broker {self.broker.host}:{self.broker.port} refused: {reason_code}"
            self._count_error(reason)
            self._set_up(False, reason)
            return
        result, _ = client.subscribe(self.config.topic, qos=_QOS)
        if result != mqtt.MQTT_ERR_SUCCESS:
            reason = f"subscribe to {self.config.topic} failed: {mqtt.error_string(result)}"
            self._count_error(reason)
            self._set_up(False, reason)

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        reason = f"can't connect to broker {self.broker.host}:{self.broker.port}"
        self._count_error(reason)
        self._set_up(False, reason)

    def _on_subscribe(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        refused = [rc for rc in reason_codes if rc.is_failure]
        if refused:
            reason = f"subscription to {self.config.topic} refused: {refused[0]}"
            self._count_error(reason)
            self._set_up(False, reason)
            return
        self._set_up(True, f"subscribed to {self.config.topic}")

    def _on_disconnect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self._reset_window()  # readings across a gap are no time series
        if self._stopping.is_set():
            return
        reason = f"disconnected from broker {self.broker.host}:{self.broker.port}: {reason_code}"
        self._count_error(reason)
        self._set_up(False, reason)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
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
