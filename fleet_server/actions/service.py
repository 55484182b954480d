"""The fleet's remote actions service: signs requests, publishes them retained to each
device's shard, and stores what devices answer.

One MQTT session per broker shard, as the fleet service ``actions`` of this replica's
slot (certificate CN ``fleet:actions``, ``-r<slot>``; its ACL grant writes the devices'
request topics and reads their answers and chunks). It subscribes to every device's
``actions/result`` and ``actions/chunk`` through a shared subscription on a secret group
(:func:`fleet_server.broker.identity.actions_group`): each answer is stored once, by one
replica. An answer is stored on the network thread (a few rows; an answer that can't be
stored after :data:`STORE_TRIES` tries is logged and counted, and the request shows what
was stored before it); a payload that is not a valid answer, or answers a request the
device does not have, is quarantined with why.

:meth:`ActionService.request` is what the API and the console call: check, sign
(:func:`fleet_server.repository.director.sign_action`, in the transaction that takes the
device's next counter), publish with QoS 1, retained, MQTT 5 message expiry = the time
left before the request's expiry. A publish the broker does not acknowledge marks the
request ``failed`` and raises.
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.kernel.clientid import secret_client_id
from agent.kernel.mqtt import MqttSession, SessionOptions
from agent.wire import topics
from agent.wire.actions import (
    DEFAULT_EXPIRES_S,
    MAX_EXPIRES_S,
    check_params,
    parse_chunk,
    parse_result,
)
from agent.wire.envelope import MAX_PAYLOAD_BYTES, MessageError
from fleet_server.actions import store
from fleet_server.actions.errors import ActionError
from fleet_server.actions.store import ActionRecord
from fleet_server.api.context import ServerContext
from fleet_server.broker import identity
from fleet_server.broker.section import MAIN_SHARD
from fleet_server.db import store as db
from fleet_server.db.quarantine import quarantine
from fleet_server.errors import FleetError
from fleet_server.health import PartHealth
from fleet_server.repository.director import sign_action

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 10.0
STORE_TRIES = 3
HEALTH = "actions"


@dataclass
class ActionStats:
    """Counters of the service (its health probe shows them)."""

    requested: int = 0
    published: int = 0
    publish_failures: int = 0
    answers: int = 0
    chunks: int = 0
    quarantined: int = 0
    store_failures: int = 0


def _tls(ctx: ServerContext, shard: str, cert: Any, key: Any) -> ssl.SSLContext:
    b = ctx.brokers[shard]
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(b.ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


def _identity(ctx: ServerContext, shard: str) -> tuple[Any, Any, str]:
    service = identity.slot_service(identity.ACTIONS, ctx.slot)
    if ctx.config.broker.managed:
        cert, key = identity.identity_paths(ctx.config.identity_dir, service)
        return cert, key, secret_client_id(identity.service_cn(service), key)
    b = ctx.brokers[shard]
    prefix = f"fleet-{service}-{socket.gethostname()}"
    return b.cert_file, b.key_file, secret_client_id(prefix, b.key_file)


class ActionService:
    """Remote actions for the whole fleet (see the module); attaches ``ctx.actions``."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.stats = ActionStats()
        group = identity.actions_group(ctx.config.state_dir)
        self.sessions: dict[str, MqttSession] = {}
        for shard in ctx.brokers:
            cert, key, client_id = _identity(ctx, shard)
            if not ctx.config.broker.managed:
                client_id = f"{client_id}-{uuid.uuid4().hex[:6]}"
            b = ctx.brokers[shard]
            session = MqttSession(
                f"actions-{shard}",
                SessionOptions(
                    host=b.host, port=b.port, client_id=client_id, tls=_tls(ctx, shard, cert, key)
                ),
            )
            for topic_of, handler in (
                (topics.action_result, self._on_result),
                (topics.action_chunk, self._on_chunk),
            ):
                session.subscribe(topics.shared(group, topics.device_filter(topic_of)), handler)
            self.sessions[shard] = session

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        for session in self.sessions.values():
            session.start()
        self.ctx.actions = self
        self.ctx.health.register(HEALTH, self.health)

    def stop(self) -> None:
        self.ctx.health.unregister(HEALTH)
        self.ctx.actions = None
        for session in self.sessions.values():
            session.stop()

    def health(self) -> PartHealth:
        """Ok while every shard's session is connected; the detail counts."""
        s = self.stats
        connected = {shard: sess.connected for shard, sess in self.sessions.items()}
        detail = {"connected": connected, "requested": s.requested, "published": s.published,
                  "publish_failures": s.publish_failures, "answers": s.answers,
                  "chunks": s.chunks, "quarantined": s.quarantined,
                  "store_failures": s.store_failures}  # fmt: skip
        alive = all(sess.guard.thread_alive for sess in self.sessions.values())
        return PartHealth(all(connected.values()) and alive, detail)

    # -- asking -----------------------------------------------------------------------
    def request(
        self,
        device_id: str,
        action: str,
        params: dict[str, Any],
        *,
        expires_s: int = DEFAULT_EXPIRES_S,
        by: str,
    ) -> ActionRecord:
        """Sign, store and publish a request for ``device_id``.

        Raises:
            ActionError: 400 bad action, parameter or expiry; 404 no such device; 409 a
                revoked device; 503 the repository can't sign it or the broker did not
                take it (the request is then stored as ``failed``).
        """
        try:
            checked = check_params(action, params)
        except ValueError as exc:
            raise ActionError(400, str(exc)) from None
        if not 1 <= expires_s <= MAX_EXPIRES_S:
            raise ActionError(400, f"expires_s {expires_s} is not in [1, {MAX_EXPIRES_S}]")
        device = db.get_device(self.ctx.engine, device_id)
        if device is None:
            raise ActionError(404, f"no device {device_id!r}")
        if device.revoked:
            raise ActionError(409, f"device {device_id!r} is revoked: it can't connect")
        shard = device.shard or MAIN_SHARD
        session = self.sessions.get(shard)
        if session is None:
            raise ActionError(503, f"device {device_id!r} is on shard {shard!r}, not configured")
        now = time.time()
        expires = datetime.fromtimestamp(math.floor(now) + expires_s, timezone.utc)

        def sign(counter: int, request_id: str) -> bytes:
            return sign_action(
                self.ctx.repository, self.ctx.keystore, device_id=device_id,
                request_id=request_id, action=action, params=checked, counter=counter,
                expires=expires,
            )  # fmt: skip

        try:
            record, signed = store.create(
                self.ctx.engine, device_id=device_id, action=action, params=checked,
                requested_by=by, expires_at=expires.timestamp(), sign=sign, now=now,
            )  # fmt: skip
        except FleetError as exc:
            raise ActionError(503, f"the request can't be signed: {exc}") from exc
        self.stats.requested += 1
        try:
            self._publish(session, device_id, signed, max(1, int(expires.timestamp() - now)))
        except FleetError as exc:
            self.stats.publish_failures += 1
            store.mark_failed(self.ctx.engine, record.request_id, f"not sent: {exc}")
            raise ActionError(503, f"the request was not sent: {exc}") from exc
        self.stats.published += 1
        log.info("action %s %s for %s by %s (counter %d)", record.request_id, action,
                 device_id, by, record.counter)  # fmt: skip
        return record

    def _publish(self, session: MqttSession, device_id: str, payload: bytes, expiry: int) -> None:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.MessageExpiryInterval = expiry
        delivery = session.publish(
            topics.action_request(device_id), payload, qos=1, retain=True, properties=props
        )
        if not delivery.queued:
            raise FleetError(f"paho refused the publish: {mqtt.error_string(delivery.rc)}")
        if not delivery.wait(PUBLISH_TIMEOUT_S):
            raise FleetError("the broker did not acknowledge the publish")
        if delivery.refused:
            raise FleetError(f"the broker refused the publish: {delivery.reason}")

    # -- what devices answer (network thread) -----------------------------------------------
    def _quarantine(self, topic: str, reason: str, payload: bytes) -> None:
        self.stats.quarantined += 1
        log.warning("actions: quarantined %s: %s", topic, reason)
        try:
            quarantine(self.ctx.engine, topic, reason, payload)
        except Exception:  # the answer is lost either way: say so
            log.exception("actions: could not quarantine %s", topic)

    def _stored(self, what: str, call: Any) -> Any:
        for attempt in range(STORE_TRIES):
            try:
                return call()
            except Exception:
                if attempt == STORE_TRIES - 1:
                    self.stats.store_failures += 1
                    log.exception("actions: %s not stored", what)
                    return None
                time.sleep(0.2 * (attempt + 1))
        return None

    def _on_result(self, msg: mqtt.MQTTMessage) -> None:
        payload = bytes(msg.payload)
        try:
            device_id = topics.device_of(msg.topic)
            answer = parse_result(payload, MAX_PAYLOAD_BYTES)
        except (MessageError, ValueError) as exc:
            self._quarantine(msg.topic, str(exc), payload)
            return
        if answer.device_id != device_id:
            self._quarantine(msg.topic, f"device_id {answer.device_id!r} is not the topic's",
                             payload)  # fmt: skip
            return
        self.stats.answers += 1
        outcome = self._stored(
            f"answer to {answer.request_id}",
            lambda: store.store_answer(self.ctx.engine, device_id, answer),
        )
        if outcome == "unknown":
            self._quarantine(msg.topic, f"{device_id} answered {answer.request_id}, no request "
                             "of its own", payload)  # fmt: skip

    def _on_chunk(self, msg: mqtt.MQTTMessage) -> None:
        payload = bytes(msg.payload)
        try:
            device_id = topics.device_of(msg.topic)
            chunk = parse_chunk(payload, MAX_PAYLOAD_BYTES)
            store.chunk_bytes(chunk)
        except (MessageError, ValueError) as exc:
            self._quarantine(msg.topic, str(exc), payload)
            return
        if chunk.device_id != device_id:
            self._quarantine(msg.topic, f"device_id {chunk.device_id!r} is not the topic's",
                             payload[:1024])  # fmt: skip
            return
        self.stats.chunks += 1
        ok = self._stored(
            f"chunk {chunk.seq} of {chunk.request_id}",
            lambda: store.store_chunk(self.ctx.engine, device_id, chunk),
        )
        if ok is False:
            self._quarantine(msg.topic, f"{device_id} sent a chunk of {chunk.request_id}, no "
                             "request of its own", payload[:1024])  # fmt: skip
