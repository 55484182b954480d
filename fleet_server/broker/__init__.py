"""The fleet's MQTT broker: a Mosquitto that fleet-server configures and runs (TLS, one
identity per device, ACLs on the certificate's CN, revocation through the CA's CRL)."""

from fleet_server.broker.acl import DEVICE_READS, DEVICE_WRITES, acl_text, device_rules
from fleet_server.broker.config import MosquittoConfig, mosquitto_conf
from fleet_server.broker.manage import BrokerError, ManagedBroker, find_mosquitto

__all__ = [
    "DEVICE_READS",
    "DEVICE_WRITES",
    "BrokerError",
    "ManagedBroker",
    "MosquittoConfig",
    "acl_text",
    "device_rules",
    "find_mosquitto",
    "mosquitto_conf",
]
