"""What a running fleet server shares between its parts: the HTTP API, the ingest workers
and the rollout service get one :class:`ServerContext` (built by
:class:`fleet_server.serve.FleetServer`)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import Engine

from fleet_server.alerts.board import AlertBoard
from fleet_server.api.ports import DeviceActions, RolloutOps
from fleet_server.broker import BrokerError, ManagedBroker
from fleet_server.ca import FleetCA
from fleet_server.cluster import Leadership, SingleReplica
from fleet_server.config import FleetServerConfig
from fleet_server.health import HealthRegistry
from fleet_server.repository import KeyStore, Repository

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerEndpoint:
    """The fleet broker: where the fleet server's own clients connect (TLS, with its
    service identity) and what devices are told at enrollment."""

    host: str
    port: int
    ca_file: Path
    cert_file: Path
    key_file: Path
    advertise_host: str
    advertise_port: int


@dataclass
class ServerContext:
    """The running server's shared parts. ``rollouts`` is attached by the rollout service
    (the API answers 503 on rollout endpoints until it is).

    ``broker`` is the main broker (shard ``main``); ``brokers`` every shard's, ``main``
    first (the services connect to each; enrollment tells a device its shard's).
    ``managed_brokers`` are the Mosquittos this process runs (none with ``[broker]
    run = false`` or an external fleet); ``managed_broker`` is the main one of them.
    ``slot`` is the replica slot whose service identities this process connects with
    (:mod:`fleet_server.broker.slots`)."""

    config: FleetServerConfig
    engine: Engine
    ca: FleetCA
    repository: Repository
    keystore: KeyStore
    broker: BrokerEndpoint
    managed_broker: ManagedBroker | None = None
    brokers: dict[str, BrokerEndpoint] = field(default_factory=dict)
    managed_brokers: dict[str, ManagedBroker] = field(default_factory=dict)
    slot: int = 0
    rollouts: RolloutOps | None = None
    actions: DeviceActions | None = None
    """Remote actions on devices (attached by the actions service; the API answers 503
    on asking for one until it is)."""
    operator_token: str | None = None
    health: HealthRegistry = field(default_factory=HealthRegistry)
    leader: Leadership = field(default_factory=lambda: SingleReplica("single"))
    """Whether this replica leads (leader-only jobs ask it; rollout saves are fenced)."""
    alerts: AlertBoard | None = None
    """The alerts firing, for the console's badge (attached by the alerts service)."""
    _broker_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not self.brokers:
            self.brokers = {"main": self.broker}
        if not self.managed_brokers and self.managed_broker is not None:
            self.managed_brokers = {"main": self.managed_broker}

    def reload_broker(self) -> bool:
        """Make every managed broker this process runs (each shard's) re-read its CRL and
        ACL; False without a running one (brokers run elsewhere watch the CRL file).

        Raises:
            BrokerError: a reload was not confirmed in time (the others were tried).
        """
        running = [b for b in self.managed_brokers.values() if b.running]
        if not running:
            return False
        first: BrokerError | None = None
        with self._broker_lock:
            for broker in running:
                try:
                    broker.reload()
                except BrokerError as exc:
                    log.exception("reloading mosquitto on port %d", broker.config.port)
                    first = first or exc
        if first is not None:
            raise first
        return True
