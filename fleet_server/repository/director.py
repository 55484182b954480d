"""Directives: "install bundle X release N on device D", signed by the director key.

A directive is a TUF ``Metadata[Targets]`` document: ``signed.version`` is the device's
monotonic counter, ``signed.expires`` its expiry, ``signed.targets`` holds the release's
``manifest.json`` target with the length and hashes the repository signed, and
``signed.unrecognized_fields["custom"]`` = ``{"device_id", "hardware_class"}``. The
device checks it with ``targets.verify_delegate("director", ...)`` against the
repository's top-level targets, which delegate to the director's keys.

The last counter issued to each device is kept in ``<repo>/director/counters.json``,
written durably before a directive is returned, so a counter is never issued twice.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from tuf.api.exceptions import UnsignedMetadataError
from tuf.api.metadata import (  # type: ignore[attr-defined, unused-ignore]
    Metadata,
    TargetFile,
    Targets,
)
from tuf.api.serialization.json import JSONSerializer

from agent.wire import topics
from agent.wire.base import slug
from fleet_server.errors import DirectiveError
from fleet_server.repository._files import make_dirs, write_durable
from fleet_server.repository._store import utcnow
from fleet_server.repository.bundledir import manifest_target
from fleet_server.repository.keys import KeyStore
from fleet_server.repository.repo import DIRECTOR, Repository

COUNTERS_FILE = "director/counters.json"
"""Relative to the repository directory; outside what the file server serves."""

DEFAULT_EXPIRY = timedelta(days=7)


def _read_counters(repo: Repository, device_id: str) -> dict[str, int]:
    path = repo.path / COUNTERS_FILE
    try:
        raw: Any = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise DirectiveError(device_id, f"cannot read {path}: {exc}") from exc
    devices = raw.get("devices") if isinstance(raw, dict) else None
    if not isinstance(devices, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in devices.values()
    ):
        raise DirectiveError(device_id, f"{path}: not a counters file ({{'devices': {{id: n}}}})")
    return {str(k): int(v) for k, v in devices.items()}


def last_counter(repo: Repository, device_id: str) -> int:
    """The highest counter issued to ``device_id`` (0 when none).

    Raises:
        DirectiveError: the counters file is unreadable.
    """
    return _read_counters(repo, device_id).get(device_id, 0)


def next_counter(repo: Repository, device_id: str) -> int:
    """The counter the next directive for ``device_id`` gets by default."""
    return last_counter(repo, device_id) + 1


def _record(repo: Repository, device_id: str, counter: int) -> None:
    counters = _read_counters(repo, device_id)
    counters[device_id] = max(counter, counters.get(device_id, 0))
    path = repo.path / COUNTERS_FILE
    data = json.dumps({"format": 1, "devices": counters}, indent=2, sort_keys=True).encode()
    try:
        make_dirs(path.parent)
        write_durable(path, data + b"\n")
    except OSError as exc:
        raise DirectiveError(device_id, f"cannot write {path}: {exc}") from exc


def issue_directive(
    repo: Repository,
    keystore: KeyStore,
    device_id: str,
    hardware_class: str,
    bundle_name: str,
    release: int,
    counter: int | None = None,
    expires_in: timedelta = DEFAULT_EXPIRY,
    *,
    now: datetime | None = None,
    mode: str = "active",
) -> bytes:
    """A signed directive (JSON bytes) assigning ``bundle_name`` ``release`` to a device.

    ``mode`` is ``active`` (install and switch), ``revert`` (install and switch even
    below the release the device runs: the fleet sends it back, e.g. to the bundle it was
    set up with; an agent older than this mode refuses it, naming the mode) or ``shadow``
    (install into the device's shadow slot, run beside the active bundle, never act); a
    shadow or revert directive carries ``custom.mode``, an active one does not (older
    agents read it as before).

    ``counter`` defaults to :func:`next_counter`; an explicit one is used as given (the
    device refuses one not above what it has applied) and the record keeps the highest.

    Raises:
        DirectiveError: a bad device id or hardware class, a non-positive counter or
            expiry, a release not published, a bundle whose profiles exclude the
            hardware class, or no usable director key.
        RepoError: the repository is not initialised or unreadable.
        KeystoreError: the director key can't be read or decrypted.
    """
    try:
        topics.directive(device_id)
        slug(hardware_class, "hardware class")
    except ValueError as exc:
        raise DirectiveError(device_id, str(exc)) from exc
    if expires_in <= timedelta(0):
        raise DirectiveError(device_id, f"expiry {expires_in} is not in the future")
    if mode not in ("active", "revert", "shadow"):
        raise DirectiveError(device_id, f"mode {mode!r} is not 'active', 'revert' or 'shadow'")
    now = now or utcnow()
    with repo.locked():
        targets = repo.targets().signed
        path = manifest_target(bundle_name, release)
        target = targets.targets.get(path)
        if target is None:
            raise DirectiveError(
                device_id, f"bundle '{bundle_name}' release {release} is not published ({path})"
            )
        profiles = target.custom.get("profiles") if isinstance(target.custom, dict) else None
        if profiles and hardware_class not in profiles:
            raise DirectiveError(
                device_id,
                f"bundle '{bundle_name}' release {release} is for profiles "
                f"{', '.join(profiles)}, not {hardware_class!r}",
            )
        counter = next_counter(repo, device_id) if counter is None else counter
        custom = {"device_id": device_id, "hardware_class": hardware_class}
        if mode != "active":
            custom["mode"] = mode
        if counter < 1:
            raise DirectiveError(device_id, f"counter {counter} is not positive")
        directive = Metadata(
            Targets(
                version=counter,
                expires=now + expires_in,
                targets={path: TargetFile(target.length, dict(target.hashes), path)},
                unrecognized_fields={"custom": custom},
            )
        )
        _sign(targets, keystore, device_id, directive)
        _record(repo, device_id, counter)
    return directive.to_bytes(JSONSerializer())


def _sign(targets: Targets, keystore: KeyStore, device_id: str, md: Metadata[Targets]) -> None:
    """Sign ``md`` with the director keys ``targets`` delegates to, and check that the
    signatures meet the delegation's threshold (what the device will check).

    Raises:
        DirectiveError: no director delegation, or the keystore lacks its keys.
    """
    role = targets.get_delegated_role(DIRECTOR) if targets.delegations else None
    if role is None:
        raise DirectiveError(device_id, "the repository's targets delegate no director")
    for signer in keystore.signers(role.keyids):
        md.sign(signer, append=True)
    try:
        targets.verify_delegate(DIRECTOR, md.signed_bytes, md.signatures)
    except UnsignedMetadataError as exc:
        raise DirectiveError(
            device_id,
            f"the keystore {keystore.path} lacks the director key the repository "
            f"delegates to ({exc})",
        ) from exc


def sign_action(
    repo: Repository,
    keystore: KeyStore,
    *,
    device_id: str,
    request_id: str,
    action: str,
    params: dict[str, Any],
    counter: int,
    expires: datetime,
) -> bytes:
    """A signed action request (JSON bytes): a directive with no target whose ``custom``
    is ``{"type": "action", "device_id", "request_id", "action", "params"}``, signed by
    the same director keys as bundle directives (see :mod:`agent.wire.actions`).

    ``counter`` is the device's action counter (a sequence of its own, kept by the
    caller: :mod:`fleet_server.actions.store`); ``params`` are already checked
    (:func:`agent.wire.actions.check_params`) and hold no float (canonical JSON has none).

    Raises:
        DirectiveError: a bad device id, a non-positive counter, no usable director key.
        RepoError: the repository is not initialised or unreadable.
        KeystoreError: the director key can't be read or decrypted.
    """
    try:
        topics.action_request(device_id)
    except ValueError as exc:
        raise DirectiveError(device_id, str(exc)) from exc
    if counter < 1:
        raise DirectiveError(device_id, f"counter {counter} is not positive")
    custom = {
        "type": "action",
        "device_id": device_id,
        "request_id": request_id,
        "action": action,
        "params": params,
    }
    with repo.locked():
        targets = repo.targets().signed
        request = Metadata(
            Targets(
                version=counter, expires=expires, targets={}, unrecognized_fields={"custom": custom}
            )
        )
        _sign(targets, keystore, device_id, request)
    return request.to_bytes(JSONSerializer())
