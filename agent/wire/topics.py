"""MQTT topic names of the fleet protocol. No topic string is spelled anywhere else.

Every device has its own subtree ``edgefleet/devices/<device_id>/...``; the broker's
ACL gives a device access to its own subtree only.
"""

from __future__ import annotations

import re

PREFIX = "edgefleet"
_DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _device(device_id: str) -> str:
    if not _DEVICE_ID.match(device_id):
        raise ValueError(f"device id {device_id!r} is not a valid topic level")
    return f"{PREFIX}/devices/{device_id}"


def directive(device_id: str) -> str:
    """Retained: the signed directive (what this device should run)."""
    return f"{_device(device_id)}/directive"


def fetch_request(device_id: str) -> str:
    """Device -> fleet: a request for a byte range of a repository file."""
    return f"{_device(device_id)}/fetch/request"


def fetch_response(device_id: str) -> str:
    """Fleet -> device: the answer to a fetch request (correlated by request id)."""
    return f"{_device(device_id)}/fetch/response"


def fetch_request_filter() -> str:
    """What the fleet's file server subscribes to: every device's fetch requests."""
    return f"{PREFIX}/devices/+/fetch/request"


def install_state(device_id: str) -> str:
    """Device -> fleet, retained: the installer's state (slots, versions, last result)."""
    return f"{_device(device_id)}/install/state"


def availability(device_id: str) -> str:
    """Device -> fleet, retained; "offline" is the last will."""
    return f"{_device(device_id)}/availability"


def device_of(topic: str) -> str:
    """The device id in a per-device topic.

    Raises:
        ValueError: the topic is not in a device's subtree.
    """
    parts = topic.split("/")
    if len(parts) < 4 or parts[0] != PREFIX or parts[1] != "devices":
        raise ValueError(f"not a device topic: {topic!r}")
    return _device(parts[2]).split("/")[2]
