"""The broker's ACL file: deny by default, each device confined to its own subtree.

A device's user name is its certificate's CN (``use_identity_as_username``); pattern rules
substitute it for ``%u``, so one rule covers every device. What a device may write and read
is listed here, topic by topic, from :mod:`agent.wire.topics`; nothing else is granted
(no ``#`` under a device, no ``$SYS``). The fleet server's own identity may read and write
the whole fleet tree.

Mosquitto 2 denies every pattern-checked access to a client whose user name or client id
holds ``+`` or ``#``; the fleet CA refuses such names (and ``/``) at issue time as well.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.wire import topics

DEVICE_WRITES: tuple[Callable[[str], str], ...] = (
    topics.state,
    topics.heartbeat,
    topics.telemetry,
    topics.decisions,
    topics.thumbnails,
    topics.events,
    topics.fetch_request,
    topics.availability,
    topics.install_state,
)
"""Topics a device publishes to, in its own subtree."""

DEVICE_READS: tuple[Callable[[str], str], ...] = (
    topics.directive,
    topics.fetch_response,
)
"""Topics a device subscribes to, in its own subtree."""


def device_rules() -> list[str]:
    """The pattern lines that give each device its own topics."""
    writes = [f"pattern write {topics.device_pattern(t)}" for t in DEVICE_WRITES]
    reads = [f"pattern read {topics.device_pattern(t)}" for t in DEVICE_READS]
    return writes + reads


def acl_text(fleet_identity: str) -> str:
    """The ACL file for a broker whose fleet server connects as ``fleet_identity``.

    Raises:
        ValueError: ``fleet_identity`` can't be an ACL user name.
    """
    if not topics.is_device_id(fleet_identity):
        raise ValueError(f"{fleet_identity!r} can't be an ACL user name")
    lines = [
        "# Written by fleet-server at every start; edits here are lost.",
        "# Deny by default: a client may use only the topics granted below.",
        "",
        "# The fleet server: every device's topics, and the broker's own $SYS figures.",
        f"user {fleet_identity}",
        f"topic readwrite {topics.fleet_filter()}",
        "topic read $SYS/#",
        "",
        "# Devices (user name = certificate CN = device id): their own subtree only.",
        *device_rules(),
    ]
    return "\n".join(lines) + "\n"
