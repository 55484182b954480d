"""The MQTT services ``fleet-server serve`` runs beside the API: ingest into the
database, the bundle file server, and the publisher the rollout service sends directives
through (the leader-only jobs are in :mod:`fleet_server.jobs`).

Every service runs on every broker shard (``ctx.brokers``): a device talks only to its
own shard, so each shard has its ingest workers (one shared-subscription group per
broker: every message is stored once, by one worker of all replicas), its file server
(a shared subscription too: a chunk request is answered once) and a publisher; directives
go out through the device's shard (:class:`MqttPublisher`).

On the managed brokers each connection holds its own certificate (CN ``fleet:files``,
``fleet:rollouts``, ``fleet:ingest-<i>``, with ``-r<slot>`` for replica slots past 0:
:mod:`fleet_server.broker.identity`), which is also its client id there; the same
certificate serves every shard. On external brokers they all use the one configured
certificate of the shard with distinct client ids, from the service and slot (such a
broker must not force the client id to the certificate's name: the services would take
over each other's session). Each service registers a probe on ``ctx.health``
(``GET /healthz``): ``files``, ``ingest-<i>`` on the main shard, ``files-<shard>``,
``ingest-<shard>-<i>`` on the others.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.kernel.clientid import secret_client_id
from agent.kernel.mqtt import MqttSession, SessionOptions
from agent.wire import topics
from fleet_server.api.context import ServerContext
from fleet_server.broker import identity
from fleet_server.broker.section import MAIN_SHARD
from fleet_server.db import store
from fleet_server.distribution.file_server import MqttFileServer
from fleet_server.errors import FleetError
from fleet_server.health import HealthRegistry
from fleet_server.ingest.health import register_workers, worker_options
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.ingest.worker import IngestWorker

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 10.0
FILES_HEALTH = "files"
SHARD_CACHE_S = 300.0
"""How long the publisher trusts a device's shard it looked up (a re-enrollment may move it)."""
SHARD_CACHE_MAX = 200_000


def probe_name(kind: str, shard: str) -> str:
    """A service's health probe name on ``shard`` (``files``; ``files-eu``)."""
    return kind if shard == MAIN_SHARD else f"{kind}-{shard}"


def service_identity(
    ctx: ServerContext, service: str, shard: str = MAIN_SHARD
) -> tuple[Path, Path, str]:
    """The certificate, key and client id fleet service ``service`` (a name of this
    replica's slot) connects to ``shard`` with."""
    if ctx.config.broker.managed:
        cert, key = identity.identity_paths(ctx.config.identity_dir, service)
        return cert, key, secret_client_id(identity.service_cn(service), key)
    b = ctx.brokers[shard]
    host = socket.gethostname()
    kind, _, index = service.partition("-")
    prefix = f"fleet-{kind}-{host}-{index}" if index else f"fleet-{service}-{host}"
    # A secret suffix (from the key): a device can't name the id to take the session over.
    return b.cert_file, b.key_file, secret_client_id(prefix, b.key_file)


def _tls(ca_file: Path, cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


class BrokerPublisher:
    """Publishes as the rollout service on one shard: QoS 1, retain as asked, message
    expiry; a publish the broker does not acknowledge in time, or refuses, raises."""

    def __init__(self, ctx: ServerContext, shard: str = MAIN_SHARD) -> None:
        b = ctx.brokers[shard]
        service = identity.slot_service(identity.ROLLOUTS, ctx.slot)
        cert, key, client_id = service_identity(ctx, service, shard)
        if not ctx.config.broker.managed:
            client_id = f"fleet-rollouts-{uuid.uuid4().hex[:8]}"
        self.shard = shard
        self.session = MqttSession(
            f"rollout-publisher-{shard}",
            SessionOptions(
                host=b.host, port=b.port, client_id=client_id, tls=_tls(b.ca_file, cert, key)
            ),
        )
        self.guard = self.session.guard
        self.client = self.session.client
        self.failures = 0
        self.published = 0
        self.session.start()

    @property
    def connected(self) -> bool:
        return self.session.connected

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait for a CONNACK that accepts; whether it came."""
        return self.session.wait_connected(timeout_s)

    def __call__(self, topic: str, payload: bytes, retain: bool, expiry: int | None) -> None:
        """Publish and wait for the broker's acknowledgement.

        Raises:
            FleetError: not queued, not acknowledged in time, or refused.
        """
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        if expiry is not None:
            props.MessageExpiryInterval = expiry
        delivery = self.session.publish(topic, payload, qos=1, retain=retain, properties=props)
        if not delivery.queued:
            self.failures += 1
            raise FleetError(f"{topic}: paho refused the publish: {delivery.rc}")
        if not delivery.wait(PUBLISH_TIMEOUT_S):
            self.failures += 1
            raise FleetError(f"{topic}: the broker did not acknowledge the publish")
        if delivery.refused:
            self.failures += 1
            raise FleetError(f"{topic}: the broker refused the publish: {delivery.reason}")
        self.published += 1

    def detail(self) -> dict[str, Any]:
        """Figures for the health probe."""
        return {
            "published": self.published,
            "publish_failures": self.failures,
            **self.session.snapshot(),
        }

    def close(self) -> None:
        self.session.stop()


class _Guards:
    """The network threads of every shard's publisher, as one guard."""

    def __init__(self, publishers: list[BrokerPublisher]) -> None:
        self._publishers = publishers

    @property
    def thread_alive(self) -> bool:
        return all(p.guard.thread_alive for p in self._publishers)


class MqttPublisher:
    """The rollout service's publisher: each directive goes out through its device's
    shard (``devices.shard``, looked up and cached; NULL is ``main``), on that shard's
    :class:`BrokerPublisher`. A topic outside a device's subtree goes to ``main``."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.shards: dict[str, BrokerPublisher] = {}
        try:
            for name in ctx.brokers:
                self.shards[name] = BrokerPublisher(ctx, name)
        except BaseException:
            self.close()
            raise
        self.guard = _Guards(list(self.shards.values()))
        self._lock = threading.Lock()
        self._shard_of: dict[str, tuple[str, float]] = {}
        self.lookups = 0
        self.unroutable = 0

    @property
    def connected(self) -> bool:
        """Whether every shard's publisher is connected."""
        return all(p.connected for p in self.shards.values())

    @property
    def published(self) -> int:
        return sum(p.published for p in self.shards.values())

    @property
    def failures(self) -> int:
        return sum(p.failures for p in self.shards.values()) + self.unroutable

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait (``timeout_s`` in all) until every shard's publisher is connected."""
        deadline = time.monotonic() + timeout_s
        return all(p.wait_connected(deadline - time.monotonic()) for p in self.shards.values())

    def shard_of(self, device_id: str) -> str:
        """The shard of ``device_id`` (``main`` when unknown or NULL)."""
        now = time.monotonic()
        with self._lock:
            hit = self._shard_of.get(device_id)
        if hit is not None and now - hit[1] < SHARD_CACHE_S:
            return hit[0]
        device = store.get_device(self.ctx.engine, device_id)
        shard = (device.shard if device is not None else None) or MAIN_SHARD
        with self._lock:
            self.lookups += 1
            if len(self._shard_of) >= SHARD_CACHE_MAX:
                self._shard_of.clear()
            self._shard_of[device_id] = (shard, now)
        return shard

    def __call__(self, topic: str, payload: bytes, retain: bool, expiry: int | None) -> None:
        """Publish on the shard of the device ``topic`` names.

        Raises:
            FleetError: the device's shard is not configured here, or the publish failed.
        """
        try:
            shard = self.shard_of(topics.device_of(topic))
        except ValueError:
            shard = MAIN_SHARD
        publisher = self.shards.get(shard)
        if publisher is None:
            self.unroutable += 1
            raise FleetError(f"{topic}: the device is on shard {shard!r}, not configured")
        publisher(topic, payload, retain, expiry)

    def detail(self) -> dict[str, Any]:
        """Figures for the health probe: totals, and each shard's."""
        return {
            "published": self.published,
            "publish_failures": self.failures,
            "connected": self.connected,
            "shard_lookups": self.lookups,
            "shards": {name: p.detail() for name, p in self.shards.items()},
        }

    def close(self) -> None:
        for publisher in self.shards.values():
            publisher.close()


class FileService:
    """Serves the bundle repository to devices over MQTT (bundle fetches): one file
    server per shard, each a member of the replicas' shared subscription."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        group = identity.files_group(ctx.config.state_dir)
        service = identity.slot_service(identity.FILES, ctx.slot)
        self.servers: dict[str, MqttFileServer] = {}
        for shard, b in ctx.brokers.items():
            cert, key, client_id = service_identity(ctx, service, shard)
            self.servers[shard] = MqttFileServer(
                ctx.repository.path,
                b.host,
                b.port,
                tls_context=_tls(b.ca_file, cert, key),
                client_id=client_id,
                share_group=group,
            )

    @property
    def server(self) -> MqttFileServer:
        """The main shard's file server."""
        return self.servers[MAIN_SHARD]

    def start(self) -> None:
        """Start every shard's file server (all stopped again when one fails).

        Raises:
            FileServerError: one is not subscribed in time.
        """
        try:
            for shard, server in self.servers.items():
                server.start()
                self.ctx.health.register(probe_name(FILES_HEALTH, shard), server.health)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for shard, server in self.servers.items():
            self.ctx.health.unregister(probe_name(FILES_HEALTH, shard))
            server.stop()


class IngestService:
    """``ingest.workers`` workers per shard, each shard's on one shared subscription
    (its group a secret of the server: :func:`fleet_server.broker.identity.ingest_group`),
    storing through SQL."""

    def __init__(self, ctx: ServerContext) -> None:
        cfg = ctx.config.ingest
        self.ctx = ctx
        group = identity.ingest_group(ctx.config.state_dir, cfg.group)
        if cfg.group is not None and identity.guessable_group(cfg.group):
            log.warning(
                "ingest group %r is guessable (allow_guessable_group): a device naming it "
                "takes a share of every device's messages",
                cfg.group,
            )
        options = worker_options(cfg)
        self.by_shard: dict[str, list[IngestWorker]] = {}
        for shard, b in ctx.brokers.items():
            workers = []
            for i in range(cfg.workers):
                service = identity.ingest_service(i, ctx.slot)
                cert, key, client_id = service_identity(ctx, service, shard)
                workers.append(
                    IngestWorker(
                        b.host,
                        b.port,
                        sink=SqlSink(ctx.engine),
                        group=group,
                        client_id=client_id,
                        tls_ca=b.ca_file,
                        tls_cert=cert,
                        tls_key=key,
                        **options,
                    )
                )
            self.by_shard[shard] = workers
        self._probes: list[str] = []

    @property
    def workers(self) -> list[IngestWorker]:
        """Every shard's workers, ``main`` first."""
        return [w for workers in self.by_shard.values() for w in workers]

    def start(self) -> None:
        for w in self.workers:
            w.start()
        self._probes = _register(self.ctx.health, self.by_shard)

    def stop(self) -> None:
        for name in self._probes:
            self.ctx.health.unregister(name)
        self._probes = []
        for w in self.workers:
            w.stop()


def _register(health: HealthRegistry, by_shard: dict[str, list[IngestWorker]]) -> list[str]:
    names: list[str] = []
    for shard, workers in by_shard.items():
        names += register_workers(health, workers, probe_name("ingest", shard))
    return names


def make_publisher(ctx: ServerContext) -> MqttPublisher:
    """The publisher the rollout service hands its directives to (routed by shard)."""
    return MqttPublisher(ctx)
