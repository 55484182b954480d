"""The one MQTT session helper: every paho client of the agent and the fleet is one.

:class:`MqttSession` owns one paho client (version-2 callbacks, MQTT 5 or 3.1.1) and does
for its owners what each used to do by hand:

* connects with ``connect_async`` + ``loop_start`` and reconnects with backoff
  (``reconnect_min_s`` doubling up to ``reconnect_max_s``); TLS context or user name and
  password, last will, persistent session (``clean_start``, ``session_expiry_s``),
  Receive Maximum, manual acknowledgement;
* checks every reason code: a refused CONNACK, a refused subscription (SUBACK) and a
  refused publish (PUBACK/PUBCOMP: NOT_AUTHORIZED ...) are failures, counted, kept in
  :attr:`MqttSession.last_error` and told to whoever waits for them;
* wraps every callback through :class:`agent.kernel.mqttguard.MqttGuard` (a handler
  that raises is caught and counted, the network thread goes on; a dead thread is
  restarted by the watcher);
* keeps a registry of subscriptions, each topic filter with its own handler, subscribed
  again on every (re)connect; a message goes to every handler whose filter matches
  (``topic_matches_sub``; ``$share/<group>/`` is taken off first);
* publishes (:meth:`MqttSession.publish`) and says which answer each publish got
  (:class:`agent.kernel.mqttpublish.Delivery`);
* stops cleanly within a timeout, with or without the last will.

Several owners can share one session (one connection, one client id): each registers
its subscriptions and listeners (:meth:`MqttSession.add_listener`, told of every
connect and loss) and removes them when done; whoever made the session starts and stops
it. Its state (:meth:`MqttSession.snapshot`) is what health probes show.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.kernel.mqttguard import MqttGuard
from agent.kernel.mqttoptions import SessionOptions, Will
from agent.kernel.mqttpublish import Deliveries, Delivery

log = logging.getLogger(__name__)

Handler = Callable[[mqtt.MQTTMessage], None]
SubackCallback = Callable[[bool, str], None]
STOP_TIMEOUT_S = 5.0


@dataclass
class Subscription:
    """One topic filter in the registry; ``granted`` is set while the broker grants it."""

    topic_filter: str
    qos: int
    handler: Handler
    on_suback: SubackCallback | None = None
    granted: threading.Event = field(default_factory=threading.Event)
    error: str = ""

    @property
    def match_filter(self) -> str:
        """The filter messages are matched against (``$share/<group>/`` taken off)."""
        if self.topic_filter.startswith("$share/"):
            return self.topic_filter.split("/", 2)[2]
        return self.topic_filter


@dataclass
class _Listener:
    on_up: Callable[[], None] | None
    on_down: Callable[[str], None] | None


class MqttSession:
    """One paho client, supervised (see the module docstring).

    Args:
        name: names the session in logs and health ("uplink", "file-server").
        options: broker, identity and session kind.
    """

    def __init__(self, name: str, options: SessionOptions) -> None:
        self.name = name
        self.options = o = options
        protocol = mqtt.MQTTv5 if o.mqtt5 else mqtt.MQTTv311
        extra: dict[str, Any] = {} if o.mqtt5 else {"clean_session": bool(o.clean_start)}
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=o.client_id,
            protocol=protocol,
            manual_ack=o.manual_ack,
            **extra,
        )
        if o.tls is not None:
            client.tls_set_context(o.tls)
        if o.username:
            client.username_pw_set(o.username, o.password)
        if o.will is not None:
            w = o.will
            client.will_set(w.topic, w.payload, qos=w.qos, retain=w.retain)
        client.reconnect_delay_set(o.reconnect_min_s, o.reconnect_max_s)
        client.max_queued_messages_set(o.max_queued_messages)
        self.guard = guard = MqttGuard(name, check_s=o.check_s)
        client.on_connect = guard.wrap("on_connect", self._on_connect)
        client.on_connect_fail = guard.wrap("on_connect_fail", self._on_connect_fail)
        client.on_disconnect = guard.wrap("on_disconnect", self._on_disconnect)
        client.on_subscribe = guard.wrap("on_subscribe", self._on_subscribe)
        client.on_unsubscribe = guard.wrap("on_unsubscribe", self._on_unsubscribe)
        client.on_publish = guard.wrap("on_publish", self._on_publish)
        client.on_message = guard.wrap("on_message", self._on_message)
        self.client = client
        self.deliveries = Deliveries()
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._subs: dict[str, Subscription] = {}
        self._handlers: dict[str, Handler] = {}
        self._suback: dict[int, list[Subscription]] = {}
        self._unsuback: dict[int, threading.Event] = {}
        self._unsuback_early: set[int] = set()
        self._suback_early: dict[int, list[ReasonCode]] = {}
        self._listeners: list[_Listener] = []
        self._started = False
        self._stopping = False
        self.generation = 0
        """Counts connects and losses: a value read before waiting tells whether the
        connection changed meanwhile."""
        self.counts = {"connects": 0, "disconnects": 0, "connect_refused": 0}
        self.counts |= {"connect_failed": 0, "subscribe_refused": 0, "unrouted": 0}
        self.last_error = ""
        self.down_since: float | None = time.monotonic()

    @property
    def where(self) -> str:
        return f"{self.options.host}:{self.options.port}"

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background and keep reconnecting; idempotent."""
        if self._started:
            return
        self._started, self._stopping = True, False
        self.down_since = time.monotonic()
        self.guard.start(self.client, self._connect_async, on_restart=self._lost_thread)

    def _connect_async(self) -> None:
        o = self.options
        if not o.mqtt5:
            self.client.connect_async(o.host, o.port, o.keepalive_s)
            return
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        if o.session_expiry_s is not None:
            props.SessionExpiryInterval = o.session_expiry_s
        if o.receive_maximum is not None:
            props.ReceiveMaximum = o.receive_maximum
        self.client.connect_async(
            o.host, o.port, o.keepalive_s, clean_start=o.clean_start, properties=props
        )

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, *, publish_will: bool = False) -> None:
        """Disconnect (asking the broker to publish the last will when ``publish_will``)
        and end paho's thread, waiting at most ``timeout_s``; idempotent."""
        if not self._started:
            return
        self._started, self._stopping = False, True
        self.guard.stop()
        if publish_will and self.options.mqtt5:
            reason = ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message")
            self.client.disconnect(reasoncode=reason)
        else:
            self.client.disconnect()
        stopper = threading.Thread(target=self.client.loop_stop, daemon=True)
        stopper.start()  # loop_stop joins paho's thread with no timeout: bound it here
        stopper.join(max(timeout_s, 0.0))
        if stopper.is_alive():
            log.warning("%s: MQTT thread did not end in %.1f s", self.name, timeout_s)
        self._went_down("stopped")

    # -- state -------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the broker accepted the connection and it is up."""
        return self._connected.is_set()

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for an accepted connection; whether it is up."""
        return self._connected.wait(max(timeout_s, 0.0))

    @property
    def thread_alive(self) -> bool:
        """Whether paho's network thread runs."""
        return self.guard.thread_alive

    def add_listener(
        self,
        on_up: Callable[[], None] | None = None,
        on_down: Callable[[str], None] | None = None,
    ) -> _Listener:
        """Call ``on_up()`` after each accepted connect (subscriptions sent), and
        ``on_down(reason)`` on each loss, refused connect or failed attempt (network
        thread; an exception is the guard's). Returns the handle to remove it with."""
        listener = _Listener(on_up, on_down)
        with self._lock:
            self._listeners.append(listener)
        return listener

    def remove_listener(self, listener: _Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def snapshot(self) -> dict[str, Any]:
        """Figures for health and metrics."""
        with self._lock:
            subs = {s.topic_filter: s.granted.is_set() for s in self._subs.values()}
            counts = dict(self.counts)
        return {
            "connected": self.connected,
            "client_id": self.options.client_id,
            "subscriptions": subs,
            "publish_refused": self.deliveries.refused,
            "last_error": self.last_error,
            **counts,
            **self.guard.snapshot(),
        }

    # -- subscriptions -----------------------------------------------------------------

    def subscribe(
        self,
        topic_filter: str,
        handler: Handler,
        *,
        qos: int = 1,
        on_suback: SubackCallback | None = None,
        answer: Handler | None = None,
    ) -> Subscription:
        """Register ``handler`` for messages matching ``topic_filter``, subscribed now
        (when connected) and on every reconnect. ``on_suback(granted, reason)`` is told
        of each SUBACK; ``answer(message)`` is called after the handler raised (to
        answer the peer with an error).

        Raises:
            ValueError: the filter is registered already.
        """
        sub = Subscription(topic_filter, qos, handler, on_suback)
        wrapped = self.guard.wrap(f"on_message {topic_filter}", handler, answer=answer)
        with self._lock:
            if topic_filter in self._subs:
                raise ValueError(f"{self.name}: {topic_filter} is subscribed already")
            self._subs[topic_filter] = sub
            self._handlers[topic_filter] = wrapped
            now = self._connected.is_set()
        if now:
            self._send_subscribe([sub])
        return sub

    def unsubscribe(self, filters: Iterable[str], timeout_s: float = 0.0) -> bool:
        """Take ``filters`` out of the registry and unsubscribe; with ``timeout_s``,
        wait for the UNSUBACK. Whether the broker confirmed it (or was not connected)."""
        names = list(filters)
        with self._lock:
            for name in names:
                self._subs.pop(name, None)
                self._handlers.pop(name, None)
        if not names or not self.connected:
            return not self.connected
        done = threading.Event()
        result, mid = self.client.unsubscribe(names)
        if result != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            return False
        with self._lock:
            if mid in self._unsuback_early:  # the UNSUBACK came before we looked
                self._unsuback_early.discard(mid)
                done.set()
            else:
                self._unsuback[mid] = done
        return timeout_s <= 0 or done.wait(timeout_s)

    def _send_subscribe(self, subs: list[Subscription]) -> None:
        if not subs:
            return
        result, mid = self.client.subscribe([(s.topic_filter, s.qos) for s in subs])
        if result != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            why = f"subscribe failed: {mqtt.error_string(result)}"
            self._fail_subs(subs, why)
            return
        with self._lock:
            early = self._suback_early.pop(mid, None)
            if early is None:
                self._suback[mid] = subs
        if early is not None:  # the SUBACK came before we looked
            self._granted(subs, early)

    def _fail_subs(self, subs: list[Subscription], why: str) -> None:
        self.last_error = why
        log.error("%s: %s (%s)", self.name, why, ", ".join(s.topic_filter for s in subs))
        for s in subs:
            s.error = why
            s.granted.clear()
            if s.on_suback is not None:
                s.on_suback(False, why)

    # -- publishing --------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        *,
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> Delivery:
        """Publish; the :class:`Delivery` says whether paho took it (``queued``) and,
        later, the broker's answer (``ok``, ``refused``, ``reason``).

        Raises:
            ValueError: the topic or QoS is not valid (paho's check).
        """
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        delivery = Delivery(info.mid, info.rc, qos)
        self.deliveries.track(delivery)
        return delivery

    def ack(self, mid: int, qos: int) -> bool:
        """Acknowledge a received message (``manual_ack`` sessions); whether paho sent it."""
        return self.client.ack(mid, qos) == MQTTErrorCode.MQTT_ERR_SUCCESS

    # -- paho callbacks (network thread) -----------------------------------------------

    def _on_connect(
        self, _c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Properties | None
    ) -> None:
        if reason.is_failure:
            with self._lock:
                self.counts["connect_refused"] += 1
            self._went_down(f"broker {self.where} refused the connection: {reason}", error=True)
            return
        with self._lock:
            self.counts["connects"] += 1
            self.generation += 1
            self._connected.set()
            subs = list(self._subs.values())
            listeners = list(self._listeners)
        self.down_since = None
        self.last_error = ""
        self._send_subscribe(subs)
        for listener in listeners:
            if listener.on_up is not None:
                listener.on_up()

    def _on_connect_fail(self, _c: mqtt.Client, _u: Any) -> None:
        with self._lock:
            self.counts["connect_failed"] += 1
        self._went_down(f"can't connect to broker {self.where}", error=True)

    def _on_disconnect(
        self, _c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Properties | None
    ) -> None:
        if not self._connected.is_set():
            return  # never up (a refused CONNACK says why) or already down
        with self._lock:
            self.counts["disconnects"] += 1
        if not self._stopping:
            log.warning("%s: lost %s: %s", self.name, self.where, reason)
        self._went_down(
            f"disconnected from broker {self.where}: {reason}", error=not self._stopping
        )

    def _lost_thread(self) -> None:
        self._went_down("MQTT thread died; reconnecting", error=True)

    def _went_down(self, why: str, *, error: bool = False) -> None:
        with self._lock:
            if self._connected.is_set():
                self.generation += 1
            self._connected.clear()
            self._suback.clear()  # a SUBACK of the lost connection never comes
            self._suback_early.clear()
            for s in self._subs.values():
                s.granted.clear()
            listeners = list(self._listeners)
        if self.down_since is None:
            self.down_since = time.monotonic()
        if error:
            self.last_error = why
            if "refused" in why:
                log.error("%s: %s", self.name, why)
        for listener in listeners:
            if listener.on_down is not None:
                listener.on_down(why)

    def _on_subscribe(
        self, _c: mqtt.Client, _u: Any, mid: int, codes: list[ReasonCode], _p: Any
    ) -> None:
        with self._lock:
            subs = self._suback.pop(mid, None)
            if subs is None:
                if len(self._suback_early) < 1024:
                    self._suback_early[mid] = list(codes)
                return
        self._granted(subs, codes)

    def _granted(self, subs: list[Subscription], codes: list[ReasonCode]) -> None:
        for sub, code in zip(subs, codes, strict=False):
            if code.is_failure:
                with self._lock:
                    self.counts["subscribe_refused"] += 1
                self._fail_subs([sub], f"subscription to {sub.topic_filter} refused: {code}")
                continue
            sub.error = ""
            sub.granted.set()
            if sub.on_suback is not None:
                sub.on_suback(True, "")

    def _on_unsubscribe(self, _c: mqtt.Client, _u: Any, mid: int, _codes: Any, _p: Any) -> None:
        with self._lock:
            done = self._unsuback.pop(mid, None)
            if done is None and len(self._unsuback_early) < 1024:
                self._unsuback_early.add(mid)
        if done is not None:
            done.set()

    def _on_publish(
        self, _c: mqtt.Client, _u: Any, mid: int, reason: ReasonCode, _p: Properties | None
    ) -> None:
        self.deliveries.on_answer(mid, reason)

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            routes = [
                self._handlers[f]
                for f, s in self._subs.items()
                if mqtt.topic_matches_sub(s.match_filter, msg.topic)
            ]
            if not routes:
                self.counts["unrouted"] += 1
        for handler in routes:
            handler(msg)  # wrapped: an exception is counted, the next handler still runs


__all__ = ["Delivery", "Handler", "MqttSession", "SessionOptions", "Subscription", "Will"]
