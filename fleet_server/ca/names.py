"""Which names a fleet certificate may carry, and the CA's errors.

A device certificate's CN is the device id: the broker takes it as the MQTT user name and
its ACL patterns substitute it for ``%u``. So a CN must be a valid device topic level
(no ``+``, ``#``, ``/``: ``a/b`` would reach device ``a``'s topics) and may not be one of
the fleet's own identities.
"""

from __future__ import annotations

import re

from agent.wire import topics
from fleet_server.errors import FleetError

FLEET_IDENTITY = "fleet-server"
"""CN of the fleet server's own MQTT client certificate (full access in the broker ACL)."""
BROKER_NAME = "edgefleet-broker"
"""CN of the broker's server certificate."""
RESERVED_NAMES = frozenset({FLEET_IDENTITY, BROKER_NAME})
SERVICE_PREFIX = "fleet:"
"""A fleet service's CN is ``fleet:<service>`` (``fleet:files``, ``fleet:ingest-0``): the
``:`` is in no device id, so no device certificate can carry it."""
_SERVICE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


def is_service_name(name: str) -> bool:
    """Whether ``name`` is a fleet service CN: ``fleet:`` and 1-32 of a-z 0-9 - (a letter
    first)."""
    return name.startswith(SERVICE_PREFIX) and bool(_SERVICE.match(name[len(SERVICE_PREFIX) :]))


class CAError(FleetError):
    """The CA is missing or unreadable, or refuses a request.

    Attributes:
        path: the CA directory (or the file at fault).
        reason: what is wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"fleet CA {path}: {reason}")


class NameRefused(CAError):
    """A certificate was asked for a name the broker's ACL can't hold safely.

    Attributes:
        name: the refused common name.
    """

    def __init__(self, path: str, name: str, reason: str) -> None:
        self.name = name
        super().__init__(path, f"name {name!r} refused: {reason}")


def check_name(name: str, where: str = "") -> None:
    """Refuse a device CN that can't be a device topic level or that is reserved.

    Raises:
        NameRefused: ``name`` is not acceptable.
    """
    if not topics.is_device_id(name):
        raise NameRefused(
            where,
            name,
            "a device id is 1-64 of A-Z a-z 0-9 _ . - starting with a letter or digit "
            "(no MQTT wildcard + #, no /)",
        )
    if name in RESERVED_NAMES:
        raise NameRefused(where, name, "reserved for the fleet's own services")
