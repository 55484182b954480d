"""The fleet CA: per-device X.509 identities (CN = device id), the broker's server
certificate, the fleet server's own client certificate, revocation through a CRL."""

from fleet_server.ca.ca import CA_ROLE, FleetCA, Issued
from fleet_server.ca.csr import make_device_key_and_csr
from fleet_server.ca.names import (
    BROKER_NAME,
    FLEET_IDENTITY,
    RESERVED_NAMES,
    CAError,
    NameRefused,
    check_name,
)

__all__ = [
    "BROKER_NAME",
    "CA_ROLE",
    "FLEET_IDENTITY",
    "RESERVED_NAMES",
    "CAError",
    "FleetCA",
    "Issued",
    "NameRefused",
    "check_name",
    "make_device_key_and_csr",
]
