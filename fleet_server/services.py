"""The services ``fleet-server serve`` runs beside the API: MQTT ingest into the
database, and the rollout controller's reconciliation loop publishing directives.
Both connect to the fleet broker with the server's own identity (CN "fleet-server")."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import uuid

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from fleet_server.api.context import ServerContext
from fleet_server.distribution.file_server import MqttFileServer
from fleet_server.errors import FleetError
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.ingest.worker import IngestWorker
from fleet_server.rollout.service import RolloutService

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 10.0


class MqttPublisher:
    """Publishes as the fleet server: QoS 1, retain as asked, message expiry; a publish
    the broker does not acknowledge in time (or refuses) raises."""

    def __init__(self, ctx: ServerContext) -> None:
        b = ctx.broker
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"fleet-rollouts-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.tls_set(
            ca_certs=str(b.ca_file), certfile=str(b.cert_file), keyfile=str(b.key_file)
        )
        self.client.reconnect_delay_set(1, 10)
        self.client.connect_async(b.host, b.port)
        self.client.loop_start()

    def __call__(self, topic: str, payload: bytes, retain: bool, expiry: int | None) -> None:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        if expiry is not None:
            props.MessageExpiryInterval = expiry
        info = self.client.publish(topic, payload, qos=1, retain=retain, properties=props)
        info.wait_for_publish(PUBLISH_TIMEOUT_S)
        if not info.is_published():
            raise FleetError(f"{topic}: the broker did not acknowledge the publish")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _tls(ctx: ServerContext) -> ssl.SSLContext:
    b = ctx.broker
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(b.ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(b.cert_file), str(b.key_file))
    return context


class FileService:
    """Serves the bundle repository to devices over MQTT (bundle fetches)."""

    def __init__(self, ctx: ServerContext) -> None:
        b = ctx.broker
        self.server = MqttFileServer(
            ctx.repository.path,
            b.host,
            b.port,
            tls_context=_tls(ctx),
            client_id=f"fleet-files-{socket.gethostname()}",
        )

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()


class IngestService:
    """``ingest.workers`` workers on one shared subscription, storing through SQL."""

    def __init__(self, ctx: ServerContext) -> None:
        b, cfg = ctx.broker, ctx.config.ingest
        host = socket.gethostname()
        self.workers = [
            IngestWorker(
                b.host,
                b.port,
                sink=SqlSink(ctx.engine),
                group=cfg.group,
                client_id=f"fleet-ingest-{host}-{i}",
                tls_ca=b.ca_file,
                tls_cert=b.cert_file,
                tls_key=b.key_file,
            )
            for i in range(cfg.workers)
        ]

    def start(self) -> None:
        for w in self.workers:
            w.start()

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


class RolloutRunner:
    """The rollout service on its own thread; attaches itself as the API's RolloutOps."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.publisher: MqttPublisher | None = None
        self.service: RolloutService | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.publisher = MqttPublisher(self.ctx)
        self.service = RolloutService(
            self.ctx.engine,
            repo=self.ctx.repository,
            keystore=self.ctx.keystore,
            publish=self.publisher,
        )
        self.ctx.rollouts = self.service
        tick_s = self.ctx.config.rollouts.tick_s
        self._thread = threading.Thread(
            target=self.service.run, args=(self._stop, tick_s), name="rollouts", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.ctx.rollouts = None
        if self.publisher is not None:
            self.publisher.close()
