"""The broker's ACL file: deny by default, each device confined to its own subtree.

A device's user name is its certificate's CN (``use_identity_as_username``); pattern rules
substitute it for ``%u``, so one rule covers every device. What a device may write and read
is listed here, topic by topic, from :mod:`agent.wire.topics`; nothing else is granted
(no ``#`` under a device, no ``$SYS``). The fleet server's own identity (``fleet-server``:
tools, benches, the HIL harness) may read and write the whole fleet tree; each fleet
service (:mod:`fleet_server.broker.identity`: ``fleet:files``, ``fleet:rollouts``,
``fleet:actions``, ``fleet:ingest-<i>``) gets only the topics it uses.

Mosquitto 2.0.11's ACL file does not check subscriptions (every SUBACK grants) and checks
read access at delivery: a device may subscribe to ``#`` and receives nothing of others'.

Mosquitto 2 denies every pattern-checked access to a client whose user name or client id
holds ``+`` or ``#``; the fleet CA refuses such names (and ``/``) at issue time as well.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.wire import topics
from fleet_server.broker import identity

DEVICE_WRITES: tuple[Callable[[str], str], ...] = (
    topics.state,
    topics.heartbeat,
    topics.telemetry,
    topics.decisions,
    topics.thumbnails,
    topics.events,
    topics.quality,
    topics.fetch_request,
    topics.availability,
    topics.install_state,
    topics.action_result,
    topics.action_chunk,
)
"""Topics a device publishes to, in its own subtree."""

DEVICE_READS: tuple[Callable[[str], str], ...] = (
    topics.directive,
    topics.fetch_response,
    topics.action_request,
)
"""Topics a device subscribes to, in its own subtree."""


ACTION_ANSWERS: tuple[Callable[[str], str], ...] = (topics.action_result, topics.action_chunk)
"""What a device answers a remote action with: read by the actions service, not ingest."""


def device_rules() -> list[str]:
    """The pattern lines that give each device its own topics."""
    writes = [f"pattern write {topics.device_pattern(t)}" for t in DEVICE_WRITES]
    reads = [f"pattern read {topics.device_pattern(t)}" for t in DEVICE_READS]
    return writes + reads


@dataclass(frozen=True)
class ServiceGrant:
    """What one fleet service identity may read and write (topic filters)."""

    service: str
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    @property
    def user(self) -> str:
        """The service's ACL user name (its certificate CN)."""
        return identity.service_cn(self.service)

    def lines(self) -> list[str]:
        """The ACL lines of this service."""
        return [
            f"user {self.user}",
            *(f"topic read {t}" for t in self.reads),
            *(f"topic write {t}" for t in self.writes),
        ]


def service_grant(service: str) -> ServiceGrant:
    """The grant of fleet service ``service`` (files, rollouts, ingest-<i>, of any
    replica slot: :func:`fleet_server.broker.identity.service_kind`).

    Raises:
        ValueError: not a known service.
    """
    kind = identity.service_kind(service)
    if kind == identity.FILES:
        return ServiceGrant(
            service,
            reads=(topics.fetch_request_filter(),),
            writes=(topics.device_filter(topics.fetch_response),),
        )
    if kind == identity.ROLLOUTS:
        return ServiceGrant(service, writes=(topics.device_filter(topics.directive),))
    if kind == identity.ACTIONS:
        return ServiceGrant(
            service,
            reads=tuple(topics.device_filter(t) for t in ACTION_ANSWERS),
            writes=(topics.device_filter(topics.action_request),),
        )
    reports = (t for t in DEVICE_WRITES if t not in (topics.fetch_request, *ACTION_ANSWERS))
    return ServiceGrant(service, reads=tuple(topics.device_filter(t) for t in reports))


def acl_text(fleet_identity: str, services: Sequence[str] = ()) -> str:
    """The ACL file for a broker whose fleet server connects as ``fleet_identity`` (full
    access) and as each of ``services`` (:func:`service_grant`).

    Raises:
        ValueError: ``fleet_identity`` can't be an ACL user name, or a service is unknown.
    """
    if not topics.is_device_id(fleet_identity):
        raise ValueError(f"{fleet_identity!r} can't be an ACL user name")
    grants = [service_grant(s) for s in services]
    lines = [
        "# Written by fleet-server at every start; edits here are lost.",
        "# Deny by default: a client may use only the topics granted below.",
        "",
        "# The fleet server: every device's topics, and the broker's own $SYS figures.",
        f"user {fleet_identity}",
        f"topic readwrite {topics.fleet_filter()}",
        "topic read $SYS/#",
        "",
        "# The fleet's services (user name = certificate CN): only what each uses.",
        *(line for grant in grants for line in [*grant.lines(), ""]),
        "# Devices (user name = certificate CN = device id): their own subtree only.",
        *device_rules(),
    ]
    return "\n".join(lines) + "\n"
