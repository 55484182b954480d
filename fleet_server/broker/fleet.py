"""The managed Mosquittos of a fleet: the main broker and one per ``[[broker.shards]]``
entry, on the main broker's host, each with its own state directory
(``state_dir/broker-<name>``) and server certificate, and the same CA, CRL and ACL.

``fleet-server serve`` runs them as children (``[broker] run = true``); with replicas,
``fleet-server brokers`` runs them (all, or one shard) and the replicas connect. Whoever
runs them watches the CRL file: a replica that revokes a device rewrites it, and every
broker re-reads it within :data:`WATCH_S`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fleet_server.broker import identity
from fleet_server.broker.certs import ensure_server_cert
from fleet_server.broker.config import MosquittoConfig
from fleet_server.broker.manage import BrokerError, ManagedBroker
from fleet_server.broker.section import MAIN_SHARD
from fleet_server.ca import FleetCA
from fleet_server.config import FleetServerConfig

log = logging.getLogger(__name__)

WATCH_S = 1.0
"""How often ``fleet-server brokers`` looks at the CRL file and its Mosquittos."""


def advertise_host(config: FleetServerConfig, shard: str) -> str:
    """The host devices on ``shard`` are told (the shard's, else the main broker's)."""
    b = config.broker
    main = b.advertise_host or b.listen_host()
    if shard == MAIN_SHARD:
        return main
    return b.shard(shard).advertise_host or main


@dataclass(frozen=True)
class ShardAddress:
    """Where one shard's broker is: ``host``/``port`` as configured (a managed shard's
    listen address, an external one's host), what devices on it are told, and the site
    labels that put a device on it."""

    name: str
    host: str
    port: int
    advertise_host: str
    advertise_port: int
    managed: bool
    sites: tuple[str, ...] = ()


def shard_addresses(config: FleetServerConfig) -> dict[str, ShardAddress]:
    """Every shard's address, ``main`` first (managed or external alike)."""
    b = config.broker
    if b.external is not None:
        ext = b.external
        main = ShardAddress(
            MAIN_SHARD, ext.host, ext.port,
            b.advertise_host or ext.host, b.advertise_port or ext.port, managed=False,
        )  # fmt: skip
        out = {MAIN_SHARD: main}
        for shard in b.shards:
            if shard.external is None:
                continue  # the config refuses it; for the type checker
            e = shard.external
            out[shard.name] = ShardAddress(
                shard.name, e.host, e.port, shard.advertise_host or e.host,
                shard.advertise_port or e.port, managed=False, sites=tuple(shard.sites),
            )  # fmt: skip
        return out
    out = {}
    for name, mq in config.shard_mosquitto_configs().items():
        entry = None if name == MAIN_SHARD else b.shard(name)
        advertised = b.advertise_port if entry is None else entry.advertise_port
        out[name] = ShardAddress(
            name, mq.host, mq.port, advertise_host(config, name), advertised or mq.port,
            managed=True, sites=() if entry is None else tuple(entry.sites),
        )  # fmt: skip
    return out


class BrokerSet:
    """The managed Mosquittos of ``config`` (``shards``: a subset by name, default all)."""

    def __init__(
        self, config: FleetServerConfig, ca: FleetCA, shards: Sequence[str] | None = None
    ) -> None:
        """Raises:
        BrokerError: a named shard is not one of the managed fleet's.
        """
        if not config.broker.managed:
            raise BrokerError("the fleet's brokers are external ([broker] managed = false)")
        configs = config.shard_mosquitto_configs()
        unknown = [s for s in shards or () if s not in configs]
        if unknown:
            raise BrokerError(f"no shard {unknown[0]!r} (shards: {', '.join(configs)})")
        self.config = config
        self.ca = ca
        services = identity.slots_services(config.ingest.workers, config.broker.replica_slots)
        self.brokers: dict[str, ManagedBroker] = {
            name: ManagedBroker(mq, services=services)
            for name, mq in configs.items()
            if shards is None or name in shards
        }
        self._crl_mtime: int | None = None
        self.reloads = 0

    def mosquitto(self, shard: str) -> MosquittoConfig:
        """Shard ``shard``'s Mosquitto settings."""
        return self.brokers[shard].config

    def issue_certs(self) -> None:
        """Each broker's server certificate, when missing, expiring or not naming its
        listener's and its advertised host.

        Raises:
            CertError: a file can't be written.
            CAError: the CA failed.
        """
        for name, broker in self.brokers.items():
            mq = broker.config
            ensure_server_cert(
                self.ca, mq.keyfile, mq.certfile, [mq.host, advertise_host(self.config, name)]
            )

    def start(self) -> None:
        """Start every broker (the ones started are stopped again on a failure).

        Raises:
            BrokerError: one can't start (a port in use: its log says so).
        """
        self._crl_mtime = self._mtime()
        started: list[ManagedBroker] = []
        try:
            for broker in self.brokers.values():
                broker.start()
                started.append(broker)
        except BaseException:
            for broker in reversed(started):
                try:
                    broker.stop()
                except BrokerError:
                    log.exception("stopping a broker after a failed start")
            raise

    def stop(self) -> None:
        """Stop every broker, last first; the first failure is raised after all tried.

        Raises:
            BrokerError: one did not stop.
        """
        first: BrokerError | None = None
        for broker in reversed(list(self.brokers.values())):
            try:
                broker.stop()
            except BrokerError as exc:
                log.exception("stopping mosquitto on port %d", broker.config.port)
                first = first or exc
        if first is not None:
            raise first

    def reload(self) -> int:
        """Make every running broker re-read its CRL and ACL; how many did.

        Raises:
            BrokerError: one did not confirm its reload in time (the others were tried).
        """
        done = 0
        first: BrokerError | None = None
        for broker in self.brokers.values():
            if not broker.running:
                continue
            try:
                broker.reload()
                done += 1
            except BrokerError as exc:
                first = first or exc
        self._crl_mtime = self._mtime()
        self.reloads += 1
        if first is not None:
            raise first
        return done

    def problem(self) -> str | None:
        """Which broker died, with its last words (None while all run)."""
        for name, broker in self.brokers.items():
            if not broker.running:
                return f"mosquitto of shard {name} exited: " + " | ".join(broker.log_tail()[-3:])
        return None

    def crl_changed(self) -> bool:
        """Whether the CRL file changed since the last start or reload."""
        return self._mtime() != self._crl_mtime

    def watch(self) -> bool:
        """Reload every broker if the CRL file changed; whether it did.

        Raises:
            BrokerError: a reload was not confirmed.
        """
        if not self.crl_changed():
            return False
        log.info("the CRL changed: reloading %d broker(s)", len(self.brokers))
        self.reload()
        return True

    def _mtime(self) -> int | None:
        crl: Path = next(iter(self.brokers.values())).config.crlfile
        try:
            return crl.stat().st_mtime_ns
        except OSError:
            return None
