"""MQTT topic names of the fleet protocol. No topic string is spelled anywhere else.

Every device has its own subtree ``edgefleet/devices/<device_id>/...``; the broker's
ACL gives a device access to its own subtree only.
"""

from __future__ import annotations

import re
from collections.abc import Callable

PREFIX = "edgefleet"
_DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _device(device_id: str) -> str:
    if not _DEVICE_ID.fullmatch(device_id):
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


def state(device_id: str) -> str:
    """Device -> fleet, retained: the reported state (versions, bundles, health summary)."""
    return f"{_device(device_id)}/state"


def heartbeat(device_id: str) -> str:
    """Device -> fleet: a periodic sign of life."""
    return f"{_device(device_id)}/heartbeat"


def telemetry(device_id: str) -> str:
    """Device -> fleet: health figures (fps, latency percentiles, queues, CPU, memory)."""
    return f"{_device(device_id)}/telemetry"


def decisions(device_id: str) -> str:
    """Device -> fleet: decision uploads from the decision log."""
    return f"{_device(device_id)}/decisions"


def thumbnails(device_id: str) -> str:
    """Device -> fleet: the JPEG thumbnail of one decision (after its decision upload)."""
    return f"{_device(device_id)}/thumbnails"


def quality(device_id: str) -> str:
    """Device -> fleet: model-quality records (shadow comparisons, drift histograms),
    told apart by ``kind`` (:mod:`agent.wire.quality`)."""
    return f"{_device(device_id)}/quality"


def events(device_id: str) -> str:
    """Device -> fleet: events (install progress, alarms)."""
    return f"{_device(device_id)}/events"


def action_request(device_id: str) -> str:
    """Fleet -> device, retained with a message expiry: the newest signed action request
    (logs, restart, reload, diagnostics; :mod:`agent.wire.actions`)."""
    return f"{_device(device_id)}/actions/request"


def action_result(device_id: str) -> str:
    """Device -> fleet: the answers to an action request (accepted, running, ok,
    refused, failed)."""
    return f"{_device(device_id)}/actions/result"


def action_chunk(device_id: str) -> str:
    """Device -> fleet: what an action collected (log lines, a diagnostics archive), in
    bounded chunks."""
    return f"{_device(device_id)}/actions/chunk"


def is_device_id(value: str) -> bool:
    """Whether ``value`` can be a device id (one topic level, no wildcard, no ``/``)."""
    return _DEVICE_ID.fullmatch(value) is not None


def fleet_filter() -> str:
    """Every topic of the fleet protocol (what the fleet server's own identity may use)."""
    return f"{PREFIX}/#"


_PROBE = "device"


def device_pattern(topic_of: Callable[[str], str], placeholder: str = "%u") -> str:
    """The per-device topic ``topic_of`` names, with ``placeholder`` as the device level.

    For broker ACL patterns: ``device_pattern(directive)`` is
    ``edgefleet/devices/%u/directive``.

    Raises:
        ValueError: ``topic_of`` does not name a topic in a device's subtree.
    """
    parts = topic_of(_PROBE).split("/")
    if len(parts) < 4 or parts[:3] != [PREFIX, "devices", _PROBE]:
        raise ValueError(f"{getattr(topic_of, '__name__', topic_of)!r} is not a device topic")
    parts[2] = placeholder
    return "/".join(parts)


_SHARE_GROUP = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def device_filter(topic_of: Callable[[str], str]) -> str:
    """Fleet side: ``topic_of``'s topic of every device, e.g. ``edgefleet/devices/+/heartbeat``.

    Raises:
        ValueError: ``topic_of`` does not name a topic in a device's subtree.
    """
    return device_pattern(topic_of, "+")


def shared(group: str, topic_filter: str) -> str:
    """The MQTT 5 shared-subscription form of ``topic_filter``: ``$share/<group>/<filter>``.

    Subscribers of one group share the messages: each goes to one of them.

    Raises:
        ValueError: ``group`` is empty, too long, or holds '/', '+', '#' or other characters.
    """
    if not _SHARE_GROUP.match(group):
        raise ValueError(f"shared subscription group {group!r} is not 1-64 of A-Z a-z 0-9 _ . -")
    return f"$share/{group}/{topic_filter}"


def filter_of(topic: str) -> str:
    """The :func:`device_filter` a per-device topic matches (its device level as '+').

    Raises:
        ValueError: the topic is not in a device's subtree.
    """
    device_of(topic)
    parts = topic.split("/")
    parts[2] = "+"
    return "/".join(parts)
