"""Verify a directive: "install bundle X on device D", signed by the director key(s).

A directive is a TUF ``Metadata[Targets]`` document: ``signed.version`` is the monotonic
counter, ``signed.expires`` the expiry, ``signed.targets`` holds exactly one
``bundles/<name>/<release>/manifest.json`` with its length and hashes, and
``signed.custom`` names the device and its hardware class, and its ``mode``: ``active``
(install and switch; the default when absent), ``revert`` (install and switch even below
the committed release: the fleet sends the device back, e.g. to the bundle it was set up
with) or ``shadow`` (install into the shadow slot beside the active bundle, run on
sampled frames, never act). Its signatures are checked
with the trusted top-level targets' delegation to the role ``director``
(``Targets.verify_delegate``) — no hand-written cryptography. This module checks what a
directive says; the counter, expiry and release rules that need the device's state are
the client's (:mod:`agent.update.client`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tuf.api.exceptions import UnsignedMetadataError
from tuf.api.metadata import Metadata, Root, Targets  # type: ignore[attr-defined, unused-ignore]
from tuf.api.serialization import DeserializationError, SerializationError

from agent.update.errors import DirectiveRefused
from agent.wire import untrusted
from agent.wire.manifest import MANIFEST_NAME

DIRECTOR_ROLE = "director"
MODE_ACTIVE = "active"
MODE_SHADOW = "shadow"
MODE_REVERT = "revert"
MODES = (MODE_ACTIVE, MODE_REVERT, MODE_SHADOW)
MAX_DIRECTIVE_BYTES = 64 * 1024
BUNDLES_PREFIX = "bundles"
_TARGET = re.compile(
    r"^bundles/(?P<name>[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?)/(?P<release>0|[1-9][0-9]{0,17})/"
    r"(?P<file>[^\x00\\]+)$"
)


def bundle_target(name: str, release: int, file: str) -> str:
    """The target path of a bundle's file: ``bundles/<name>/<release>/<file>``."""
    return f"{BUNDLES_PREFIX}/{name}/{release}/{file}"


def parse_bundle_target(path: str) -> tuple[str, int, str]:
    """``(name, release, file)`` of a target path ``bundles/<name>/<release>/<file>``.

    Raises:
        ValueError: the path is not a bundle file's target path.
    """
    match = _TARGET.match(path)
    if match is None or any(p in ("", ".", "..") for p in match["file"].split("/")):
        raise ValueError(f"{_shown(path)} is not bundles/<name>/<release>/<file>")
    return match["name"], int(match["release"]), match["file"]


def _key_identity(key: Any) -> str:
    """Key type and public value: two keyids for the same key give the same identity."""
    return json.dumps([key.keytype, key.keyval], sort_keys=True)


def duplicate_keys(delegator: Root | Targets, only: str | None = None) -> list[str]:
    """Roles of ``delegator`` (or just the role ``only``) that list one public key under
    two keyids.

    python-tuf refuses a keyid listed twice, but counts one key held under two keyids
    twice towards a threshold; a role like that is refused here.
    """
    if isinstance(delegator, Root):
        roles: dict[str, Any] = dict(delegator.roles)
    elif delegator.delegations is not None and delegator.delegations.roles is not None:
        roles = dict(delegator.delegations.roles)
    else:
        roles = {}
    problems = []
    for name, role in roles.items():
        if only is not None and name != only:
            continue
        seen: dict[str, str] = {}
        for keyid in role.keyids:
            try:
                identity = _key_identity(delegator.get_key(keyid))
            except ValueError:
                continue
            if identity in seen:
                problems.append(f"role {name!r} lists one key as {seen[identity]} and {keyid}")
            seen.setdefault(identity, keyid)
    return problems


@dataclass(frozen=True)
class Directive:
    """A directive whose director signature verified.

    Attributes:
        counter: the monotonic counter (``signed.version``).
        expires: its expiry.
        device_id: the device it is for.
        hardware_class: the firmware profile it is for.
        target_path: ``bundles/<name>/<release>/manifest.json``.
        name, release: the bundle and release it assigns.
        length, hashes: of the manifest target, as the director signed them.
        digest: sha256 of the signed part; equal digests are the same directive.
        mode: ``active`` (install and switch), ``revert`` (install and switch, also below
            the committed release) or ``shadow`` (install into the shadow slot).
    """

    counter: int
    expires: datetime
    device_id: str
    hardware_class: str
    target_path: str
    name: str
    release: int
    length: int
    hashes: dict[str, str] = field(default_factory=dict)
    digest: str = ""
    mode: str = MODE_ACTIVE

    def is_expired(self, now: datetime) -> bool:
        """Whether the directive has expired at ``now``."""
        return now >= self.expires


def _shown(text: str, limit: int = 120) -> str:
    """``repr(text)``, cut to ``limit`` characters: a directive can't fill a log line."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def _custom_str(custom: dict[str, Any], key: str) -> str:
    value = custom.get(key)
    if not isinstance(value, str) or not value:
        raise DirectiveRefused(f"custom.{key} is missing or not a string")
    return value


def verify_signed(
    data: bytes, trusted_targets: Targets, what: str = "directive"
) -> tuple[Targets, bytes]:
    """The signed part of ``data`` and its canonical bytes, once ``data`` is a TUF targets
    document signed by a threshold of the distinct director keys ``trusted_targets``
    delegates to (bundle directives and action requests: :mod:`agent.remote.request`).

    Raises:
        DirectiveRefused: too large, not a signed targets document, not canonical, or
            not signed by a threshold of distinct director keys.
    """
    if len(data) > MAX_DIRECTIVE_BYTES:
        raise DirectiveRefused(f"{what} of {len(data)} bytes (limit {MAX_DIRECTIVE_BYTES})")
    try:  # depth, numbers and Unicode first: python-tuf's parser sees only checked JSON
        untrusted.loads_object(data, what=what, max_bytes=MAX_DIRECTIVE_BYTES)
    except untrusted.UntrustedInputError as exc:
        raise DirectiveRefused(f"not a TUF targets document: {exc.reason}") from None
    try:
        md = Metadata[Targets].from_bytes(data)
    except DeserializationError as exc:
        raise DirectiveRefused(f"not a TUF targets document: {exc}") from exc
    if not isinstance(md.signed, Targets):
        raise DirectiveRefused(f"a {md.signed.type} document, not targets")
    duplicated = duplicate_keys(trusted_targets, only=DIRECTOR_ROLE)
    if duplicated:
        raise DirectiveRefused(f"the repository's director delegation: {'; '.join(duplicated)}")
    try:
        payload = md.signed_bytes
    except SerializationError as exc:  # a float, say: canonical JSON has none
        why = str(exc.__cause__ or exc).rpartition(": ")[2]
        raise DirectiveRefused(f"not canonical JSON (floats have none): {why[:120]}") from None
    try:
        trusted_targets.verify_delegate(DIRECTOR_ROLE, payload, md.signatures)
    except UnsignedMetadataError as exc:
        raise DirectiveRefused(f"not signed by the director: {exc}") from exc
    except ValueError as exc:
        raise DirectiveRefused(f"the repository delegates no director: {exc}") from exc
    return md.signed, payload


def verify_directive(
    data: bytes, trusted_targets: Targets, *, device_id: str, hardware_class: str
) -> Directive:
    """Verify ``data`` with the director delegation of ``trusted_targets`` and check that
    it is for ``device_id`` on ``hardware_class`` and names one bundle manifest.

    Raises:
        DirectiveRefused: too large, not a signed targets document, not signed by a
            threshold of distinct director keys, for another device or hardware class,
            or not naming exactly one ``bundles/<name>/<release>/manifest.json``.
    """
    signed, payload = verify_signed(data, trusted_targets)
    custom = signed.unrecognized_fields.get("custom")
    if not isinstance(custom, dict):
        raise DirectiveRefused("custom is missing (device_id, hardware_class)")
    if custom.get("type") is not None:  # an action request (agent.remote.request)
        raise DirectiveRefused(f"a {_shown(str(custom.get('type')))} request, not a directive")
    for_device = _custom_str(custom, "device_id")
    for_class = _custom_str(custom, "hardware_class")
    if for_device != device_id:
        raise DirectiveRefused(f"for device {_shown(for_device)}, this is {device_id!r}")
    if for_class != hardware_class:
        raise DirectiveRefused(
            f"for hardware class {_shown(for_class)}, this device is {hardware_class!r}"
        )
    mode = custom.get("mode", MODE_ACTIVE)
    if mode not in MODES:
        raise DirectiveRefused(f"custom.mode {_shown(str(mode))} is not one of {', '.join(MODES)}")
    if len(signed.targets) != 1:
        raise DirectiveRefused(f"names {len(signed.targets)} targets, not one manifest")
    ((path, target),) = signed.targets.items()
    try:
        name, release, file = parse_bundle_target(path)
    except ValueError as exc:
        raise DirectiveRefused(str(exc)) from exc
    if file != MANIFEST_NAME:
        raise DirectiveRefused(f"names {_shown(path)}, not a bundle's {MANIFEST_NAME}")
    return Directive(
        counter=signed.version,
        expires=signed.expires,
        device_id=for_device,
        hardware_class=for_class,
        target_path=path,
        name=name,
        release=release,
        length=target.length,
        hashes=dict(target.hashes),
        digest=hashlib.sha256(payload).hexdigest(),
        mode=mode,
    )
