"""What a running fleet server shares between its parts: the HTTP API, the ingest workers
and the rollout service get one :class:`ServerContext` (built by
:class:`fleet_server.serve.FleetServer`)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import Engine

from fleet_server.api.ports import RolloutOps
from fleet_server.broker import ManagedBroker
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
    (the API answers 503 on rollout endpoints until it is)."""

    config: FleetServerConfig
    engine: Engine
    ca: FleetCA
    repository: Repository
    keystore: KeyStore
    broker: BrokerEndpoint
    managed_broker: ManagedBroker | None = None
    rollouts: RolloutOps | None = None
    operator_token: str | None = None
    health: HealthRegistry = field(default_factory=HealthRegistry)
    leader: Leadership = field(default_factory=lambda: SingleReplica("single"))
    """Whether this replica leads (leader-only jobs ask it; rollout saves are fenced)."""
    _broker_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reload_broker(self) -> bool:
        """Make the managed broker re-read its CRL and ACL; False without a running one.

        Raises:
            BrokerError: the reload was not confirmed in time.
        """
        broker = self.managed_broker
        if broker is None or not broker.running:
            return False
        with self._broker_lock:
            broker.reload()
        return True
