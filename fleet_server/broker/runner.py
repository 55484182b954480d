"""``fleet-server brokers``: the managed Mosquittos of a fleet whose replicas run with
``[broker] run = false``, in the foreground until stopped.

It opens the fleet CA (created at the first start, as ``serve`` does), writes a CRL when
none is fresh, issues each broker's server certificate, writes its configuration and
ACL (every replica slot's service identities) and starts it; then every
:data:`fleet_server.broker.fleet.WATCH_S` it reloads them all when the CRL file changed
(a replica revoked a device) and stops when one of them died.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta

from fleet_server.broker.fleet import WATCH_S, BrokerSet
from fleet_server.broker.manage import BrokerError
from fleet_server.ca import FleetCA
from fleet_server.config import FleetServerConfig
from fleet_server.repository import Passphrases

log = logging.getLogger(__name__)

EXIT_DIED = 1


def open_brokers(config: FleetServerConfig, shards: Sequence[str] | None = None) -> BrokerSet:
    """The fleet's managed brokers (``shards``: by name, default all), their CA and
    certificates ready, not started.

    Raises:
        BrokerError: an external fleet, or an unknown shard.
        CAError: no CA and ``[ca] create = false``, or the CA fails.
        PassphraseError: no passphrase for the CA key.
        CertError: a certificate can't be written.
    """
    passphrases = Passphrases(config.server.passphrase_name)
    ca = FleetCA(config.ca_path, passphrases)
    if not ca.exists():
        if not config.ca.create:
            raise BrokerError(f"no CA in {ca.path} and [ca] create = false")
        log.info("creating the fleet CA in %s", ca.path)
        ca = FleetCA.create(ca.path, passphrases=passphrases)
    if ca.crl_due(timedelta(seconds=config.ca.crl_refresh_before_s)):
        ca.write_crl()
    brokers = BrokerSet(config, ca, shards)
    brokers.issue_certs()
    return brokers


def run_brokers(
    brokers: BrokerSet,
    stop: threading.Event,
    on_ready: Callable[[], None] | None = None,
    watch_s: float = WATCH_S,
) -> int:
    """Start ``brokers``, keep them until ``stop`` is set (0) or one dies (1).

    Raises:
        BrokerError: one can't start.
    """
    brokers.start()
    code = 0
    try:
        if on_ready is not None:
            on_ready()
        while not stop.wait(watch_s):
            problem = brokers.problem()
            if problem is not None:
                log.error("stopping: %s", problem)
                code = EXIT_DIED
                break
            try:
                brokers.watch()
            except BrokerError:
                log.exception("reloading after a CRL change")
    finally:
        brokers.stop()
    return code
