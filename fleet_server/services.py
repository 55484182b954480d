"""The MQTT services ``fleet-server serve`` runs beside the API: ingest into the
database, the bundle file server, and the publisher the rollout service sends directives
through (the leader-only jobs are in :mod:`fleet_server.jobs`).

On the managed broker each connection holds its own certificate (CN ``fleet:files``,
``fleet:rollouts``, ``fleet:ingest-<i>``: :mod:`fleet_server.broker.identity`), which is
also its client id there; the ingest workers share a secret subscription group. On an
external broker they all use the one configured certificate with distinct client ids
(such a broker must not force the client id to the certificate's name: the services
would take over each other's session). Each service registers a probe on
``ctx.health`` (``GET /healthz``).
"""

from __future__ import annotations

import logging
import socket
import ssl
import uuid
from pathlib import Path
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.kernel.clientid import secret_client_id
from agent.kernel.mqtt import MqttSession, SessionOptions
from fleet_server.api.context import ServerContext
from fleet_server.broker import identity
from fleet_server.distribution.file_server import MqttFileServer
from fleet_server.errors import FleetError
from fleet_server.ingest.health import register_workers, worker_options
from fleet_server.ingest.quality import PublishedVersions
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.ingest.worker import IngestWorker

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 10.0
FILES_HEALTH = "files"


def service_identity(ctx: ServerContext, service: str) -> tuple[Path, Path, str]:
    """The certificate, key and client id fleet service ``service`` connects with."""
    b = ctx.broker
    if ctx.managed_broker is not None:
        cert, key = identity.identity_paths(ctx.config.identity_dir, service)
        return cert, key, secret_client_id(identity.service_cn(service), key)
    host = socket.gethostname()
    kind, _, index = service.partition("-")
    prefix = f"fleet-{kind}-{host}-{index}" if index else f"fleet-{service}-{host}"
    # A secret suffix (from the key): a device can't name the id to take the session over.
    return b.cert_file, b.key_file, secret_client_id(prefix, b.key_file)


def _tls(ctx: ServerContext, cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ctx.broker.ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


class MqttPublisher:
    """Publishes as the rollout service: QoS 1, retain as asked, message expiry; a
    publish the broker does not acknowledge in time, or refuses, raises."""

    def __init__(self, ctx: ServerContext) -> None:
        b = ctx.broker
        cert, key, client_id = service_identity(ctx, identity.ROLLOUTS)
        if ctx.managed_broker is None:
            client_id = f"fleet-rollouts-{uuid.uuid4().hex[:8]}"
        self.session = MqttSession(
            "rollout-publisher",
            SessionOptions(host=b.host, port=b.port, client_id=client_id, tls=_tls(ctx, cert, key)),
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
        snap = self.session.snapshot()
        return {
            "published": self.published,
            "publish_failures": self.failures,
            **snap,
        }

    def close(self) -> None:
        self.session.stop()


class FileService:
    """Serves the bundle repository to devices over MQTT (bundle fetches)."""

    def __init__(self, ctx: ServerContext) -> None:
        b = ctx.broker
        cert, key, client_id = service_identity(ctx, identity.FILES)
        self.ctx = ctx
        self.server = MqttFileServer(
            ctx.repository.path,
            b.host,
            b.port,
            tls_context=_tls(ctx, cert, key),
            client_id=client_id,
        )

    def start(self) -> None:
        self.server.start()
        self.ctx.health.register(FILES_HEALTH, self.server.health)

    def stop(self) -> None:
        self.ctx.health.unregister(FILES_HEALTH)
        self.server.stop()


class IngestService:
    """``ingest.workers`` workers on one shared subscription (its group a secret of the
    server: :func:`fleet_server.broker.identity.ingest_group`), storing through SQL."""

    def __init__(self, ctx: ServerContext) -> None:
        b, cfg = ctx.broker, ctx.config.ingest
        self.ctx = ctx
        group = identity.ingest_group(ctx.config.state_dir, cfg.group)
        if cfg.group is not None and identity.guessable_group(cfg.group):
            log.warning(
                "ingest group %r is guessable (allow_guessable_group): a device naming it "
                "takes a share of every device's messages",
                cfg.group,
            )
        options = worker_options(cfg)
        published = PublishedVersions(ctx.repository)  # quality records' model versions
        self.workers = []
        for i in range(cfg.workers):
            cert, key, client_id = service_identity(ctx, identity.ingest_service(i))
            self.workers.append(
                IngestWorker(
                    b.host,
                    b.port,
                    sink=SqlSink(ctx.engine, published=published),
                    group=group,
                    client_id=client_id,
                    tls_ca=b.ca_file,
                    tls_cert=cert,
                    tls_key=key,
                    **options,
                )
            )
        self._probes: list[str] = []

    def start(self) -> None:
        for w in self.workers:
            w.start()
        self._probes = register_workers(self.ctx.health, self.workers)

    def stop(self) -> None:
        for name in self._probes:
            self.ctx.health.unregister(name)
        self._probes = []
        for w in self.workers:
            w.stop()


def make_publisher(ctx: ServerContext) -> MqttPublisher:
    """The publisher the rollout service hands its directives to."""
    return MqttPublisher(ctx)
