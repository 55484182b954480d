"""MQTT driver: the agent's local broker (``[mqtt]``) as a line peer, for PLCs and gateways
that speak MQTT.

A point is an MQTT topic name (no wildcards, at most 256 bytes of UTF-8, not a ``$``
topic). An input is the last payload received on its topic: the driver subscribes to a
topic the first time it is read or watched (QoS ``qos``), so a retained message counts;
a topic nothing was ever received on is ``bad_node``. An output is a publish (QoS
``qos``, never retained) whose PUBACK reason code is checked: NOT_AUTHORIZED is
``denied``.

Payloads (:func:`parse_payload`, :func:`encode`): a bool is ``true``/``false`` (also
``1``/``0``, ``on``/``off``); a number is a JSON number (an integer type takes a whole
number only); a string is the payload's text, or the value of a JSON string
(``"P-1"``). Writes use the same forms (a string as its plain text). A payload is
untrusted: over :data:`MAX_PAYLOAD_BYTES` it is not kept, one that is not UTF-8 or not of
the point's type is ``type_mismatch`` when read.

It goes through the project's one MQTT session helper (:class:`agent.kernel.mqtt.
MqttSession`: reason codes, callback wrapping, a supervised network thread). The
session's own reconnect is there, but a lost connection still fails the next call with
``disconnected``: the link closes the driver and opens it again (subscriptions are made
again as points are read or watched).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agent.line.drivers.base import Driver, Point
from agent.line.drivers.configs import MqttLinkConfig
from agent.line.errors import LineError
from agent.line.values import VALUE_TYPES, ValueMismatch, ValueType, coerce
from agent.mqtt_config import LocalMqttConfig

if TYPE_CHECKING:
    import paho.mqtt.client as paho

    from agent.kernel.mqtt import MqttSession
    from agent.kernel.mqttpublish import Delivery

log = logging.getLogger(__name__)

KEY = "mqtt"
MAX_TOPIC_BYTES = 256
MAX_PAYLOAD_BYTES = 4096
"""A payload larger than this is not kept (a value of the line is a few bytes)."""
NOT_AUTHORIZED = 0x87
STOP_TIMEOUT_S = 2.0
FAILED_STOP_S = 0.2
"""How long a refused open waits for paho's thread to end (it may sleep up to 1 s
between attempts; a daemon thread, it ends by itself then)."""
RETAINED_GRACE_S = 0.05
"""After subscribing to a topic, a read waits this long (within its timeout) for the
retained message the broker sends after the SUBACK, before it says ``bad_node``."""
_TRUE = frozenset({"true", "1", "on"})
_FALSE = frozenset({"false", "0", "off"})


def parse_point(address: str, vtype: ValueType) -> Point:
    """``address`` as an MQTT topic name for a value of ``vtype``.

    Raises:
        ValueError: empty, over 256 bytes, with a wildcard (``+``, ``#``), a NUL, a
            ``$`` topic (the broker's own), or not a value type.
    """
    if vtype not in VALUE_TYPES:
        raise ValueError(f"unknown value type {vtype!r} (known: {', '.join(VALUE_TYPES)})")
    if not address:
        raise ValueError("an MQTT topic can't be empty")
    try:
        size = len(address.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"MQTT topic {address!r} is not valid Unicode") from None
    if size > MAX_TOPIC_BYTES:
        raise ValueError(f"an MQTT topic is at most {MAX_TOPIC_BYTES} bytes of UTF-8 ({size})")
    if "+" in address or "#" in address:
        raise ValueError(f"MQTT topic {address!r} has a wildcard (+ or #): name one topic")
    if "\x00" in address:
        raise ValueError(f"MQTT topic {address!r} contains NUL")
    if address.startswith("$"):
        raise ValueError(f"MQTT topic {address!r} is the broker's own ($ topics)")
    return Point(address, vtype, address)


def parse_payload(point: Point, payload: bytes) -> Any:
    """The value of ``point`` in ``payload`` (see the module docstring).

    Raises:
        ValueMismatch: too large, not UTF-8, or not a value of the point's type.
    """
    from agent.wire.untrusted import UntrustedInputError, loads  # noqa: PLC0415 - light

    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueMismatch(f"{point.address}: a payload of {len(payload)} bytes is too large")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueMismatch(f"{point.address}: the payload is not UTF-8 ({exc.reason})") from None
    vtype = point.vtype
    if vtype == "string":
        if text.startswith('"'):
            try:
                value = loads(text, what=f"payload on {point.address}", max_bytes=MAX_PAYLOAD_BYTES)
            except UntrustedInputError as exc:
                raise ValueMismatch(str(exc)) from None
            if isinstance(value, str):
                text = value
        return coerce(text, "string")
    word = text.strip().lower()
    if vtype == "bool":
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise ValueMismatch(f"{point.address}: {_shown(text)} is not a bool (true/false)")
    try:
        number = loads(word, what=f"payload on {point.address}", max_bytes=MAX_PAYLOAD_BYTES)
    except UntrustedInputError:
        number = None
    if isinstance(number, bool) or not isinstance(number, int | float):
        raise ValueMismatch(f"{point.address}: {_shown(text)} is not a number for {vtype}")
    if vtype not in ("float32", "float64") and number != int(number):
        raise ValueMismatch(f"{point.address}: {_shown(text)} is not a whole number for {vtype}")
    try:
        return coerce(number, vtype)
    except ValueMismatch as exc:
        raise ValueMismatch(f"{point.address}: {exc}") from None


def encode(point: Point, value: Any) -> bytes:
    """The payload that writes ``value`` to ``point``.

    Raises:
        ValueMismatch: the value does not fit the point's type.
    """
    fitted = coerce(value, point.vtype)
    if point.vtype == "string":
        return str(fitted).encode("utf-8")
    return json.dumps(fitted).encode("ascii")


def _parse_kept(point: Point, payload: bytes | None) -> Any:
    """:func:`parse_payload` of a payload as kept (None: it was too large to keep)."""
    if payload is None:
        raise ValueMismatch(f"{point.address}: the last payload was over {MAX_PAYLOAD_BYTES} bytes")
    return parse_payload(point, payload)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


class MqttDriver(Driver):
    """The local broker as a PLC (see the module docstring).

    Args:
        config: the connection's settings (``[[plc]]``).
        mqtt: the local broker (``[mqtt]``); default: the defaults of
            :class:`agent.mqtt_config.LocalMqttConfig` (127.0.0.1:1883, anonymous).

    Attributes:
        counts: ``messages`` (received on a subscribed topic), ``too_large`` (not kept),
            ``watch_changes`` (handed to ``on_change``), ``watch_errors`` (a payload
            not of its point's type, or an ``on_change`` that raised).
    """

    KEY = KEY
    LIBRARY = "paho.mqtt"

    def __init__(self, config: MqttLinkConfig, *, mqtt: LocalMqttConfig | None = None) -> None:
        super().__init__(config)
        self.settings = config
        self.broker = mqtt or LocalMqttConfig()
        self.counts = {"messages": 0, "too_large": 0, "watch_changes": 0, "watch_errors": 0}
        self._session: MqttSession | None = None
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._last: dict[str, bytes | None] = {}
        """The last payload of each subscribed topic (None: too large)."""
        self._subscribed: dict[str, threading.Event] = {}
        self._errors: dict[str, str] = {}
        self._watchers: dict[str, list[tuple[int, Point, Callable[[int, Any], None]]]] = {}

    @property
    def where(self) -> str:
        return f"{self.broker.host}:{self.broker.port}"

    @property
    def connected(self) -> bool:
        """Whether the broker accepted the connection and it is up."""
        return self._session is not None and self._session.connected

    # -- life cycle --------------------------------------------------------------------

    def open(self) -> None:
        """Connect to the broker (within the timeout).

        Raises:
            LineError: ``refused`` (nothing listens), ``denied`` (the broker refused the
                user or password; the password's secret is missing), ``timeout``.
        """
        from agent.kernel.mqtt import MqttSession, SessionOptions  # noqa: PLC0415 - with the driver

        self.close()
        b, name = self.broker, self.settings.name
        password = b.password()
        if b.password_env and password is None:
            raise LineError(
                name,
                "denied",
                f"the broker password secret {b.password_env!r} is not set (a file in "
                "$CREDENTIALS_DIRECTORY or the environment)",
            )
        session = MqttSession(
            f"plc {name}",
            SessionOptions(
                host=b.host,
                port=b.port,
                client_id=f"{b.client_id_prefix}-line-{name}-{uuid.uuid4().hex[:8]}",
                keepalive_s=b.keepalive_s,
                clean_start=True,
                username=b.username,
                password=password,
                reconnect_min_s=1,
                reconnect_max_s=max(1, int(self.settings.reconnect_max_s)),
                max_queued_messages=self.settings.queue_bound,
            ),
        )
        answered = threading.Event()  # accepted, refused, or the attempt failed
        session.add_listener(on_up=answered.set, on_down=lambda _why: answered.set())
        session.start()
        answered.wait(self.timeout_s)
        if session.connected:
            self._session = session
            return
        counts, why = dict(session.counts), session.last_error
        session.stop(FAILED_STOP_S)
        if counts["connect_refused"]:
            raise LineError(name, "denied", why or f"broker {self.where} refused the connection")
        if counts["connect_failed"]:
            raise LineError(name, "refused", why or f"can't connect to broker {self.where}")
        raise LineError(
            name, "timeout", f"broker {self.where}: no CONNACK within {self.timeout_s:g} s"
        )

    def close(self) -> None:
        """Disconnect (bounded); what was received is forgotten."""
        session, self._session = self._session, None
        with self._lock:
            self._last.clear()
            self._subscribed.clear()
            self._errors.clear()
            self._watchers.clear()
        if session is not None:
            session.stop(STOP_TIMEOUT_S)

    # -- reading and writing -----------------------------------------------------------

    def read(self, points: Sequence[Point]) -> list[Any]:
        """The last payload of each point's topic, as the point's type (a topic read for
        the first time is subscribed to first).

        Raises:
            LineError: ``bad_node`` (nothing received on the topic yet),
                ``type_mismatch`` (the payload is not of the point's type), ``denied``
                (the broker refused the subscription), ``timeout``, ``disconnected``.
        """
        if not points:
            return []
        session = self._live()
        deadline = time.monotonic() + self.timeout_s
        fresh = self._subscribe(session, [p.address for p in points], deadline)
        if fresh:
            grace = min(deadline, time.monotonic() + RETAINED_GRACE_S) - time.monotonic()
            with self._arrived:
                self._arrived.wait_for(lambda: all(t in self._last for t in fresh), grace)
        values = []
        for p in points:
            with self._lock:
                known = p.address in self._last
                payload = self._last.get(p.address)
            if not known:
                raise LineError(
                    self.settings.name, "bad_node", f"nothing received on {p.address} yet"
                )
            try:
                values.append(_parse_kept(p, payload))
            except ValueMismatch as exc:
                raise LineError(self.settings.name, "type_mismatch", str(exc)) from exc
        return values

    def write(self, writes: Sequence[tuple[Point, Any]]) -> None:
        """Publish each value in the order given (QoS ``qos``, not retained) and wait for
        the broker's answers, all within the timeout.

        Raises:
            LineError: ``denied`` (NOT_AUTHORIZED), ``type_mismatch`` (the value does not
                fit), ``timeout`` (no answer), ``disconnected``, ``protocol`` (another
                failure reason code).
        """
        from paho.mqtt.enums import MQTTErrorCode  # noqa: PLC0415 - loads with the driver

        if not writes:
            return
        name = self.settings.name
        try:
            payloads = [(p, encode(p, v)) for p, v in writes]
        except ValueMismatch as exc:
            raise LineError(name, "type_mismatch", str(exc)) from exc
        session = self._live()
        deadline = time.monotonic() + self.timeout_s
        sent: list[tuple[Point, Delivery]] = []
        for p, payload in payloads:
            try:
                delivery = session.publish(p.address, payload, qos=self.settings.qos)
            except ValueError as exc:
                raise LineError(name, "bad_node", f"publish on {p.address}: {exc}") from exc
            if delivery.rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
                raise LineError(name, "disconnected", f"publish on {p.address}: not connected")
            if delivery.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                raise LineError(
                    name, "protocol", f"publish on {p.address}: paho said {delivery.rc.name}"
                )
            sent.append((p, delivery))
        for p, delivery in sent:
            if not delivery.wait(deadline - time.monotonic()):
                raise LineError(
                    name,
                    "timeout",
                    f"publish on {p.address}: no answer within {self.timeout_s:g} s",
                )
            if delivery.refused:
                reason = delivery.reason
                code = -1 if reason is None else int(reason.value)
                raise LineError(
                    name,
                    "denied" if code == NOT_AUTHORIZED else "protocol",
                    f"the broker refused the publish on {p.address}: {reason}",
                )

    def watch(
        self,
        points: Sequence[Point],
        on_change: Callable[[int, Any], None],
        *,
        period_s: float = 0.01,
    ) -> bool:
        """Call ``on_change(index, value)`` for each message on a point's topic (paho's
        thread; a retained message comes at once); ``period_s`` is not used (the broker
        pushes). A payload not of the point's type, or an ``on_change`` that raises, is
        counted (``watch_errors``) and skipped.

        Raises:
            LineError: ``denied`` (the broker refused the subscription), ``timeout``,
                ``disconnected``.
        """
        session = self._live()
        with self._lock:
            for index, p in enumerate(points):
                self._watchers.setdefault(p.address, []).append((index, p, on_change))
        self._subscribe(session, [p.address for p in points], time.monotonic() + self.timeout_s)
        return True

    # -- helpers -----------------------------------------------------------------------

    def _live(self) -> MqttSession:
        session = self._session
        if session is None:
            raise LineError(self.settings.name, "disconnected", "not connected")
        if not session.connected:
            why = session.last_error or f"lost the broker {self.where}"
            raise LineError(self.settings.name, "disconnected", why)
        return session

    def _subscribe(self, session: MqttSession, topics: list[str], deadline: float) -> list[str]:
        """Subscribe to the topics not subscribed yet and wait (until ``deadline``) for
        the broker to grant each; the topics subscribed now.

        Raises:
            LineError: ``denied`` (refused), ``timeout``.
        """
        waits: list[tuple[str, threading.Event]] = []
        fresh: list[str] = []
        for topic in dict.fromkeys(topics):
            with self._lock:
                granted = self._subscribed.get(topic)
                new = granted is None
                if granted is None:
                    granted = self._subscribed[topic] = threading.Event()
            if new:
                fresh.append(topic)
                session.subscribe(
                    topic,
                    self._on_message,
                    qos=self.settings.qos,
                    on_suback=functools.partial(self._on_suback, topic),
                )
            waits.append((topic, granted))
        for topic, granted in waits:
            if granted.wait(max(deadline - time.monotonic(), 0.0)):
                with self._lock:
                    error = self._errors.get(topic)
                if error:
                    raise LineError(self.settings.name, "denied", error)
                continue
            raise LineError(
                self.settings.name,
                "timeout",
                f"subscription to {topic}: no answer within {self.timeout_s:g} s",
            )
        return fresh

    def _on_suback(self, topic: str, granted: bool, why: str) -> None:
        """The broker's answer to a subscription (paho's thread)."""
        with self._lock:
            if granted:
                self._errors.pop(topic, None)
            else:
                self._errors[topic] = why
            event = self._subscribed.get(topic)
        if event is not None:
            event.set()

    def _on_message(self, message: paho.MQTTMessage) -> None:
        """A message on a subscribed topic (paho's thread; wrapped by the session)."""
        payload: bytes | None = bytes(message.payload)
        topic = message.topic
        self.counts["messages"] += 1
        if len(payload or b"") > MAX_PAYLOAD_BYTES:
            self.counts["too_large"] += 1
            payload = None
        with self._lock:
            if topic not in self._subscribed:
                return  # a message of a subscription this driver no longer has
            self._last[topic] = payload
            self._arrived.notify_all()
            watchers = list(self._watchers.get(topic, ()))
        for index, point, on_change in watchers:
            try:
                on_change(index, _parse_kept(point, payload))
            except ValueMismatch as exc:
                self.counts["watch_errors"] += 1
                log.warning("plc %s: %s", self.settings.name, exc)
            except Exception:
                self.counts["watch_errors"] += 1
                log.exception(
                    "plc %s: a message on %s was not handed on", self.settings.name, topic
                )
            else:
                self.counts["watch_changes"] += 1
