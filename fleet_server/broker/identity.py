"""Who the fleet's own services are on the broker, and the ingest group's secret name.

The managed Mosquitto takes a client's certificate CN as its user name, and with
``clientid_is_identity`` as its client id too (``use_username_as_clientid``): then no
client can take over another's session by reusing its client id, and every connection
needs its own certificate. The fleet's services hold one each: ``fleet:files`` (the
bundle file server), ``fleet:rollouts`` (the rollout publisher), ``fleet:actions``
(remote actions: the signed requests out, the devices' answers and chunks in),
``fleet:ingest-<i>`` (ingest worker ``i``, a stable CN: its persistent session survives
a restart). The ``:`` keeps these names apart from every device id
(:func:`agent.wire.topics.is_device_id` refuses it, and so does the CA for a device).

Several replicas of the fleet server connect to the same brokers, and a broker that
forces the client id to the CN would hand one replica's sessions to the other. So each
replica claims a slot (:mod:`fleet_server.broker.slots`) and connects with that slot's
identities: slot 0 has the names above, slot ``k`` ``fleet:files-r<k>``,
``fleet:rollouts-r<k>``, ``fleet:ingest-r<k>-<i>``. The ACL grants every slot's names.
The same certificate serves every shard (each shard is a broker of its own).

The ingest workers share one subscription group (``$share/<group>/...``). Mosquitto 2.0's
ACL file grants every subscription and checks read access only at delivery, so a device
that names the group takes a share of every device's messages (which it may not read:
they are dropped). The group name is therefore a secret: generated here (128 bits),
kept in the server's state directory, never sent to a device. The file servers of all
replicas share the fetch requests the same way, on a secret group of their own, and the
actions services the devices' answers on a third. See
``docs/adr/0005-broker-identity-and-limits.md``.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path

from fleet_server.ca.names import SERVICE_PREFIX, is_service_name
from fleet_server.errors import FleetError
from fleet_server.repository._files import make_dirs, write_durable

FILES = "files"
ROLLOUTS = "rollouts"
ACTIONS = "actions"
INGEST = "ingest"
GROUP_FILE = "ingest-group"
"""The file under the server's state directory that keeps the generated group name."""
FILES_GROUP_FILE = "files-group"
"""The same for the file servers' group."""
ACTIONS_GROUP_FILE = "actions-group"
"""The same for the remote actions services' group (devices' answers and chunks)."""
GROUP_BYTES = 16
"""Random bytes in a generated group name (128 bits)."""
MIN_GROUP_CHARS = 16
MIN_GROUP_DISTINCT = 10
_GROUP = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class IdentityError(FleetError):
    """A service identity or the ingest group can't be made or read.

    Attributes:
        reason: what is wrong.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"fleet identity: {reason}")


def service_cn(service: str) -> str:
    """The certificate CN (= MQTT user name = client id) of fleet service ``service``.

    Raises:
        IdentityError: ``service`` is not 1-32 of a-z 0-9 - starting with a letter.
    """
    if not is_service_name(SERVICE_PREFIX + service):
        raise IdentityError(f"service name {service!r} is not 1-32 of a-z 0-9 - (a letter first)")
    return SERVICE_PREFIX + service


def is_service_cn(name: str) -> bool:
    """Whether ``name`` is a fleet service's CN (``fleet:<service>``)."""
    return is_service_name(name)


def _slot_suffix(slot: int) -> str:
    if slot < 0:
        raise IdentityError(f"replica slot {slot} is negative")
    return f"-r{slot}" if slot else ""


def slot_service(kind: str, slot: int = 0) -> str:
    """Service ``kind`` (files, rollouts) of replica slot ``slot``: ``files`` for slot 0
    (the one-replica names), ``files-r<slot>`` for the others.

    Raises:
        IdentityError: a negative slot.
    """
    return f"{kind}{_slot_suffix(slot)}"


def ingest_service(index: int, slot: int = 0) -> str:
    """The service name of ingest worker ``index`` of replica slot ``slot``
    (``ingest-<index>``, or ``ingest-r<slot>-<index>``).

    Raises:
        IdentityError: a negative slot.
    """
    return f"{INGEST}{_slot_suffix(slot)}-{index}"


def services_for(ingest_workers: int, slot: int = 0) -> list[str]:
    """The service names a fleet server with ``ingest_workers`` workers in replica slot
    ``slot`` connects as (one certificate each; the same on every shard)."""
    return [
        slot_service(FILES, slot),
        slot_service(ROLLOUTS, slot),
        slot_service(ACTIONS, slot),
        *(ingest_service(i, slot) for i in range(ingest_workers)),
    ]


def slots_services(ingest_workers: int, slots: int) -> list[str]:
    """Every replica slot's services: what a managed broker's ACL grants."""
    return [name for slot in range(slots) for name in services_for(ingest_workers, slot)]


def service_kind(service: str) -> str:
    """``files``, ``rollouts``, ``actions`` or ``ingest``: what service ``service`` of
    any slot is.

    Raises:
        ValueError: not a fleet service name of any slot.
    """
    kind = service.split("-", 1)[0]
    if kind in (FILES, ROLLOUTS, ACTIONS) and re.fullmatch(rf"{kind}(?:-r[1-9][0-9]*)?", service):
        return kind
    if kind == INGEST and re.fullmatch(r"ingest(?:-r[1-9][0-9]*)?-[0-9]+", service):
        return kind
    raise ValueError(
        f"{service!r} is not a fleet service (files, rollouts, actions, ingest-<i>, -r<slot>)"
    )


def identity_paths(identity_dir: Path, service: str) -> tuple[Path, Path]:
    """Where the certificate and key of ``service`` are kept (``svc-<service>.crt/.key``)."""
    service_cn(service)  # checks the name
    return identity_dir / f"svc-{service}.crt", identity_dir / f"svc-{service}.key"


def guessable_group(group: str) -> str:
    """Why ``group`` is too easy to guess for a shared-subscription group ("" if it is not).

    A configured group must hold a random-looking part: between its ``-``, ``_`` and
    ``.``, a run of at least :data:`MIN_GROUP_CHARS` letters and digits, with digits and
    letters both, and at least :data:`MIN_GROUP_DISTINCT` different characters
    ("ingest", "fleet-ingest-group", "aaaaaaaaaaaaaaaa" are refused; ``ingest-`` and 32
    hex digits, or 20 characters from a password generator, are not). A heuristic: it
    stops names a person would pick, not a bad random generator.
    """
    parts = re.split(r"[-_.]", group)
    best = max(parts, key=len)
    if len(best) < MIN_GROUP_CHARS:
        return f"no part of {MIN_GROUP_CHARS} letters and digits (the longest has {len(best)})"
    for part in (p for p in parts if len(p) >= MIN_GROUP_CHARS):
        mixed = any(c.isdigit() for c in part) and any(c.isalpha() for c in part)
        if mixed and len(set(part)) >= MIN_GROUP_DISTINCT:
            return ""
    return (
        f"no part of {MIN_GROUP_CHARS}+ characters mixes letters and digits with "
        f"{MIN_GROUP_DISTINCT} different characters"
    )


def new_group(prefix: str = INGEST) -> str:
    """A fresh secret group name: ``ingest-`` (or ``prefix-``) and 32 hex digits (128
    random bits)."""
    return f"{prefix}-{secrets.token_hex(GROUP_BYTES)}"


def ingest_group(state_dir: Path, configured: str | None = None) -> str:
    """The ingest workers' shared-subscription group.

    ``configured`` (from ``[ingest] group``) wins; else the name kept in
    ``state_dir/ingest-group``, generated (and written durably, mode 0600) at the first
    call. The same name across restarts keeps the workers' persistent sessions on one group.

    Raises:
        IdentityError: the kept name is unreadable or malformed, or can't be written.
    """
    if configured is not None:
        return configured
    return _kept_group(state_dir / GROUP_FILE, INGEST)


def files_group(state_dir: Path) -> str:
    """The file servers' shared-subscription group (``$share/<group>/...`` on the fetch
    requests: each request is answered by one file server of all replicas). A secret
    like the ingest group (a device naming it would take a share of the requests),
    kept in ``state_dir/files-group``.

    Raises:
        IdentityError: the kept name is unreadable or malformed, or can't be written.
    """
    return _kept_group(state_dir / FILES_GROUP_FILE, FILES)


def actions_group(state_dir: Path) -> str:
    """The remote actions services' shared-subscription group (``$share/<group>/...`` on
    the devices' answers and chunks: each is stored once, by one replica). A secret like
    the ingest group, kept in ``state_dir/actions-group``.

    Raises:
        IdentityError: the kept name is unreadable or malformed, or can't be written.
    """
    return _kept_group(state_dir / ACTIONS_GROUP_FILE, ACTIONS)


def _kept_group(path: Path, prefix: str) -> str:
    state_dir = path.parent
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    except OSError as exc:
        raise IdentityError(f"cannot read {path}: {exc}") from exc
    if kept:
        if not _GROUP.match(kept) or guessable_group(kept):
            raise IdentityError(f"{path} does not hold a generated group name; delete it")
        return kept
    group = new_group(prefix)
    try:
        make_dirs(state_dir, mode=0o700)
        write_durable(path, f"{group}\n".encode(), mode=0o600)
    except OSError as exc:
        raise IdentityError(f"cannot write {path}: {exc}") from exc
    return group


__all__ = [
    "ACTIONS",
    "ACTIONS_GROUP_FILE",
    "FILES",
    "FILES_GROUP_FILE",
    "GROUP_FILE",
    "INGEST",
    "ROLLOUTS",
    "SERVICE_PREFIX",
    "IdentityError",
    "actions_group",
    "files_group",
    "guessable_group",
    "identity_paths",
    "ingest_group",
    "ingest_service",
    "is_service_cn",
    "new_group",
    "service_cn",
    "service_kind",
    "services_for",
    "slot_service",
    "slots_services",
]
