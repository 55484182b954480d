"""The fleet server process: database, CA, brokers, services and the HTTP API, started in
order and stopped in reverse.

:meth:`FleetServer.start` opens the database (migrations), creates the CA at the first
start (passphrase of role ``ca``: see :class:`fleet_server.repository.Passphrases`),
claims a replica slot (:mod:`fleet_server.broker.slots`), issues the fleet server's own
MQTT identity and one identity per fleet service of that slot (``fleet:files``,
``fleet:rollouts``, ``fleet:ingest-<i>``: see :mod:`fleet_server.broker.identity`) when
missing, expiring or no longer from this CA, and with ``[broker] run = true`` issues the
brokers' server certificates and starts the managed Mosquittos, the main one and one per
shard (:class:`fleet_server.broker.fleet.BrokerSet`); with ``run = false`` they are run
elsewhere (``fleet-server brokers``). Then it builds the :class:`ServerContext`, starts
the services (ingest workers, the rollout service: factories given to the constructor)
and last the API (uvicorn in a thread). A background thread writes a fresh CRL before
the current one expires.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Protocol

import uvicorn

from agent.kernel.secrets import read_secret
from fleet_server.api.app import create_app
from fleet_server.api.context import BrokerEndpoint, ServerContext
from fleet_server.broker import identity
from fleet_server.broker.certs import ensure_cert
from fleet_server.broker.fleet import BrokerSet, shard_addresses
from fleet_server.broker.section import MAIN_SHARD
from fleet_server.broker.slots import claim_slot
from fleet_server.ca import FleetCA
from fleet_server.cluster import open_cluster, replica_name
from fleet_server.config import FleetServerConfig
from fleet_server.db import open_database
from fleet_server.errors import FleetError
from fleet_server.repository import KeyStore, Passphrases, Repository
from fleet_server.repository._files import make_dirs

__all__ = ["FleetServer", "ServeError", "ServerContext", "Service", "ServiceFactory"]

log = logging.getLogger(__name__)

API_START_TIMEOUT_S = 15.0
CRL_CHECK_S = 600.0
SLOW_STOP_S = 2.0
"""A part that takes this long to stop is named in a WARNING (what a stop waited on)."""
_POLL_S = 0.02


class ServeError(FleetError):
    """The fleet server can't start or stop a part.

    Attributes:
        part: the part ("api", "operator token", ...).
        reason: what failed.
    """

    def __init__(self, part: str, reason: str) -> None:
        self.part = part
        self.reason = reason
        super().__init__(f"fleet-server: {part}: {reason}")


class Service(Protocol):
    """A part started after the broker and before the API (ingest, rollout service)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


ServiceFactory = Callable[[ServerContext], Service]
"""Builds a service from the running context (it may attach ``ctx.rollouts``)."""


class _ApiThread:
    """uvicorn serving the app on a socket bound here, in a thread."""

    def __init__(self, ctx: ServerContext) -> None:
        http = ctx.config.http
        family = socket.AF_INET6 if ":" in http.host else socket.AF_INET
        try:
            self.sock = socket.create_server((http.host, http.port), family=family)
        except OSError as exc:
            raise ServeError("api", f"cannot listen on {http.host}:{http.port}: {exc}") from exc
        self.port = int(self.sock.getsockname()[1])
        config = uvicorn.Config(
            create_app(ctx),
            log_config=None,
            lifespan="off",
            limit_concurrency=http.max_concurrency,
            proxy_headers=False,  # the app applies [auth] trusted_proxies itself
            timeout_graceful_shutdown=int(http.shutdown_timeout_s) or 1,
        )
        self.server = uvicorn.Server(config)
        self.timeout_s = http.shutdown_timeout_s
        self.thread = threading.Thread(target=self._run, name="fleet-api", daemon=True)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except (Exception, SystemExit):
            log.exception("the HTTP API stopped on an error")

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + API_START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive():
                self.sock.close()
                raise ServeError("api", "uvicorn exited while starting (see the log)")
            if time.monotonic() > deadline:
                self.stop()
                raise ServeError("api", f"not serving within {API_START_TIMEOUT_S} s")
            time.sleep(_POLL_S)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(self.timeout_s + 5.0)
        if self.thread.is_alive():
            log.warning("the HTTP API did not stop in time; forcing it")
            self.server.force_exit = True
            self.thread.join(5.0)
        self.sock.close()
        if self.thread.is_alive():
            raise ServeError("api", "the uvicorn thread did not end")


class _CrlKeeper:
    """Writes a fresh CRL (and reloads the broker) before the current one expires."""

    def __init__(self, ctx: ServerContext, within: timedelta) -> None:
        self.ctx = ctx
        self.within = within
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-crl", daemon=True)

    def check(self) -> bool:
        """Refresh the CRL if it is due; whether it was."""
        if not self.ctx.ca.crl_due(self.within):
            return False
        self.ctx.ca.write_crl()
        self.ctx.reload_broker()
        log.info("wrote a fresh CRL")
        return True

    def _loop(self) -> None:
        while not self._stop.wait(CRL_CHECK_S):
            try:
                self.check()
            except FleetError:
                self.failures += 1
                log.exception("CRL refresh failed (%d so far)", self.failures)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
        if self._thread.is_alive():
            log.warning("the CRL thread did not end within 10 s")


class FleetServer:
    """One fleet server process's parts (see the module docstring)."""

    def __init__(
        self, config: FleetServerConfig, *, services: Sequence[ServiceFactory] = ()
    ) -> None:
        self.config = config
        self._factories = list(services)
        self._stops: list[tuple[str, Callable[[], None]]] = []
        self._ctx: ServerContext | None = None
        self._api: _ApiThread | None = None
        self._brokers: BrokerSet | None = None

    @property
    def context(self) -> ServerContext:
        """The running server's context.

        Raises:
            ServeError: not started.
        """
        if self._ctx is None:
            raise ServeError("server", "not started")
        return self._ctx

    @property
    def api_port(self) -> int:
        """The port the API listens on (the chosen one when configured as 0)."""
        if self._api is None:
            raise ServeError("api", "not started")
        return self._api.port

    @property
    def url(self) -> str:
        """The API's base URL."""
        host = self.config.http.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.api_port}"

    def problem(self) -> str | None:
        """Why the running server is no longer whole (None while it is)."""
        if self._api is not None and not self._api.thread.is_alive():
            return "the HTTP API stopped"
        if self._brokers is not None:
            return self._brokers.problem()
        return None

    def start(self) -> None:
        """Start every part; on a failure, stop those already started and raise.

        Raises:
            FleetError: a part can't start (StorageError, CAError, BrokerError, ServeError).
            PassphraseError: no passphrase for the CA key.
        """
        if self._ctx is not None:
            raise ServeError("server", "already started")
        try:
            self._start()
        except BaseException:
            try:
                self.stop()
            except FleetError:
                log.exception("stopping after a failed start")
            raise

    def _start(self) -> None:
        cfg = self.config
        try:
            make_dirs(cfg.state_dir, mode=0o700)
        except OSError as exc:
            raise ServeError("state_dir", f"cannot create {cfg.state_dir}: {exc}") from exc
        token = self._operator_token()
        engine = open_database(cfg.database_url)
        self._stops.append(("database", engine.dispose))
        cluster = open_cluster(cfg, engine)
        cluster.start()
        self._stops.append(("cluster", cluster.stop))
        passphrases = Passphrases(cfg.server.passphrase_name)
        ca = self._open_ca(passphrases)
        crl_within = timedelta(seconds=cfg.ca.crl_refresh_before_s)
        if ca.crl_due(crl_within):
            ca.write_crl()
        claimed = claim_slot(cfg.state_dir, cfg.broker.replica_slots, replica_name(cfg))
        self._stops.append(("replica slot", claimed.release))
        slot = claimed.index
        endpoints = self._identities(ca, slot)
        if cfg.broker.managed and cfg.broker.run:
            self._brokers = BrokerSet(cfg, ca)
            self._brokers.issue_certs()
            self._brokers.start()
            self._stops.append(("brokers", self._brokers.stop))
        managed = dict(self._brokers.brokers) if self._brokers is not None else {}
        repo = Repository(cfg.repository_path)
        if not repo.initialized():
            log.warning("no bundle repository in %s: enrollment answers 503", repo.path)
        ctx = ServerContext(
            config=cfg,
            engine=engine,
            ca=ca,
            repository=repo,
            keystore=KeyStore(cfg.keystore_path, passphrases),
            broker=endpoints[MAIN_SHARD],
            brokers=endpoints,
            managed_broker=managed.get(MAIN_SHARD),
            managed_brokers=managed,
            slot=slot,
            operator_token=token,
            leader=cluster.leadership,
        )
        self._ctx = ctx
        cluster.attach(ctx.health)  # replica reports: ingest rates, the cluster probe
        for factory in self._factories:
            service = factory(ctx)
            service.start()
            self._stops.append((type(service).__name__, service.stop))
        keeper = _CrlKeeper(ctx, crl_within)
        keeper.start()
        self._stops.append(("crl", keeper.stop))
        self._api = _ApiThread(ctx)
        self._api.start()
        self._stops.append(("api", self._api.stop))
        log.info(
            "fleet server ready: API %s, brokers %s",
            self.url,
            ", ".join(f"{n} {e.host}:{e.port}" for n, e in endpoints.items()),
        )

    def _operator_token(self) -> str | None:
        name = self.config.http.operator_token_env
        if name is None:
            return None
        token = read_secret(name)
        if token is None:
            raise ServeError(
                "operator token", f"${name} is not set (environment or $CREDENTIALS_DIRECTORY)"
            )
        return token

    def _open_ca(self, passphrases: Passphrases) -> FleetCA:
        ca = FleetCA(self.config.ca_path, passphrases)
        if ca.exists():
            return ca
        if not self.config.ca.create:
            raise ServeError("ca", f"no CA in {ca.path} and [ca] create = false")
        ca, created = FleetCA.open_or_create(ca.path, passphrases)
        if created:
            log.info("created the fleet CA in %s", ca.path)
        return ca

    def _identities(self, ca: FleetCA, slot: int) -> dict[str, BrokerEndpoint]:
        """Every shard's endpoint (``main`` first); on a managed fleet, the fleet
        server's MQTT identity and replica slot ``slot``'s service identities are issued
        when missing, expiring or no longer from this CA."""
        cfg = self.config
        addresses = shard_addresses(cfg)
        b = cfg.broker
        if b.external is not None:
            endpoints = {}
            for name, a in addresses.items():
                e = b.external if name == MAIN_SHARD else b.shard(name).external
                if e is not None:  # shard_addresses lists only shards with one
                    endpoints[name] = BrokerEndpoint(
                        a.host, a.port, e.ca, e.cert, e.key, a.advertise_host, a.advertise_port
                    )
            return endpoints
        key_file = cfg.identity_dir / "fleet-server.key"
        cert_file = cfg.identity_dir / "fleet-server.crt"
        ensure_cert(ca, key_file, cert_file, "the fleet server's MQTT identity", ca.issue_service)
        for service in identity.services_for(cfg.ingest.workers, slot):
            self._service_identity(ca, service)
        return {
            name: BrokerEndpoint(
                _connect_host(a.host),
                a.port,
                ca.cert_path,
                cert_file,
                key_file,
                a.advertise_host,
                a.advertise_port,
            )
            for name, a in addresses.items()
        }

    def _service_identity(self, ca: FleetCA, service: str) -> None:
        """Issue service ``service``'s certificate (CN ``fleet:<service>``) when missing,
        expiring or no longer from this CA."""
        cert_file, key_file = identity.identity_paths(self.config.identity_dir, service)
        cn = identity.service_cn(service)
        ensure_cert(
            ca, key_file, cert_file, f"the MQTT identity {cn}", lambda: ca.issue_service(cn)
        )

    def stop(self) -> None:
        """Stop every started part, in reverse order; errors are logged, the first re-raised.

        Raises:
            FleetError: a part failed to stop (the others were still stopped).
        """
        first: Exception | None = None
        began = time.monotonic()
        while self._stops:
            name, stop = self._stops.pop()
            part_began = time.monotonic()
            try:
                stop()
            except Exception as exc:
                log.exception("stopping %s failed", name)
                first = first or exc
            took = time.monotonic() - part_began
            if took >= SLOW_STOP_S:
                log.warning("stopping %s took %.1f s", name, took)
        log.info("stopped in %.1f s", time.monotonic() - began)
        self._ctx, self._api, self._brokers = None, None, None
        if first is not None:
            raise ServeError("stop", str(first)) from first

    def __enter__(self) -> FleetServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _connect_host(host: str) -> str:
    """Where this process reaches a Mosquitto listening on ``host``."""
    ip = "127.0.0.1" if host == "localhost" else host
    return "127.0.0.1" if ipaddress.ip_address(ip).is_unspecified else host
