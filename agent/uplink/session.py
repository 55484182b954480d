"""The device's one session with the fleet broker.

An enrolled agent holds exactly one MQTT connection to the fleet broker: one TLS session
with the device's certificate and one client id (``<device>-uplink-<secret>``,
:func:`agent.kernel.clientid.secret_client_id`). The uplink (reports, outbox), the
directives service (retained directives, install reports) and the bundle fetcher
(fetch requests and responses) all go through it, each registering its own
subscriptions and listeners on the :class:`agent.kernel.mqtt.MqttSession` built here.
The broker can then bind the client id to the certificate (``clientid_is_identity``,
docs/adr/0005-broker-identity-and-limits.md).

Where the fleet broker is, in this order (this is the one place that decides it):

1. ``[uplink] broker_host`` / ``broker_port`` when set: an explicit override (a proxy
   or a test link between the device and the broker);
2. otherwise the broker enrollment gave (``fleet.json`` in the identity directory,
   :class:`agent.enrollment.identity.Identity`).

A device that is not enrolled has no fleet session; ``[bundles] mqtt`` then names a
plain broker for directives alone (development and tests without a fleet CA).
"""

from __future__ import annotations

from agent.enrollment.identity import Identity
from agent.kernel.clientid import secret_client_id
from agent.kernel.mqtt import MqttSession, SessionOptions, Will
from agent.uplink.config import UplinkConfig
from agent.wire import topics
from agent.wire.messages import ReportedState, encode


def fleet_broker(identity: Identity, config: UplinkConfig | None = None) -> tuple[str, int]:
    """The fleet broker's host and port (see the module docstring for the order)."""
    host = config.broker_host if config is not None else None
    port = config.broker_port if config is not None else None
    return host or identity.broker_host, port or identity.broker_port


def fleet_client_id(identity: Identity) -> str:
    """The client id of the device's one fleet session."""
    return secret_client_id(f"{identity.device_id}-uplink", identity.key_path)


def fleet_session(
    identity: Identity, config: UplinkConfig | None = None, *, will: bool = True
) -> MqttSession:
    """The session (not started) with the fleet broker for ``identity``: MQTT 5 over TLS
    with the device's certificate; with ``will``, the retained offline state as last
    will (the uplink's: the fleet sees the device offline when the connection dies).

    Raises:
        IdentityError: the identity's TLS files can't be loaded.
    """
    cfg = config or UplinkConfig()
    host, port = fleet_broker(identity, config)
    device = identity.device_id
    return MqttSession(
        "fleet",
        SessionOptions(
            host=host,
            port=port,
            client_id=fleet_client_id(identity),
            keepalive_s=cfg.keepalive_s,
            tls=identity.tls_context(),
            will=Will(topics.state(device), encode(ReportedState.offline(device)))
            if will
            else None,
            reconnect_min_s=1,
            reconnect_max_s=cfg.reconnect_max_s,
            max_queued_messages=cfg.max_queued_messages,
        ),
    )


__all__ = ["fleet_broker", "fleet_client_id", "fleet_session"]
