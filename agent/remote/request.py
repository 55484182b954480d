"""Verify a signed action request: the bundle directive's signature check
(:func:`agent.update.directive.verify_signed`: python-tuf's ``verify_delegate`` against
the repository's delegation to the director keys, no hand-written cryptography), then
what an action request must say (:mod:`agent.wire.actions`).

The counter, expiry and replay rules that need the device's state are
:mod:`agent.remote.counter`'s.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tuf.api.metadata import Targets  # type: ignore[attr-defined, unused-ignore]

from agent.update.directive import verify_signed
from agent.update.errors import DirectiveRefused
from agent.wire.actions import REQUEST_TYPE, check_params, is_request_id

UNKNOWN_ID = "unknown"
"""The request id answered when a request names none that can be one."""
_PEEK_BYTES = 64 * 1024


@dataclass(frozen=True)
class ActionRequest:
    """An action request whose director signature verified.

    Attributes:
        counter: the device's action counter (``signed.version``).
        expires: its expiry.
        device_id: the device it is for.
        request_id: the fleet's id for it.
        action: logs, restart, reload or diagnostics.
        params: its parameters, defaults filled in.
        digest: sha256 of the signed part; equal digests are the same request.
    """

    counter: int
    expires: datetime
    device_id: str
    request_id: str
    action: str
    params: dict[str, Any] = field(default_factory=dict)
    digest: str = ""

    def is_expired(self, now: datetime) -> bool:
        """Whether the request has expired at ``now``."""
        return now >= self.expires


def claimed_request_id(data: bytes) -> str:
    """The request id a payload claims, unverified (to answer a refusal with), or
    :data:`UNKNOWN_ID` when it names none that can be one."""
    if len(data) > _PEEK_BYTES:
        return UNKNOWN_ID
    try:
        raw = json.loads(data)
        claimed = raw["signed"]["custom"]["request_id"]
    except (ValueError, TypeError, KeyError, RecursionError):
        return UNKNOWN_ID
    return claimed if is_request_id(claimed) else UNKNOWN_ID


def verify_action(data: bytes, trusted_targets: Targets, *, device_id: str) -> ActionRequest:
    """Verify ``data`` with the director delegation of ``trusted_targets`` and check that
    it is an action request for ``device_id`` with parameters this agent knows.

    Raises:
        DirectiveRefused: not signed by the director (forged or tampered), a bundle
            directive, for another device, naming no valid request id, an unknown action
            or parameter, or any target.
    """
    signed, payload = verify_signed(data, trusted_targets, what="action request")
    custom = signed.unrecognized_fields.get("custom")
    if not isinstance(custom, dict) or custom.get("type") != REQUEST_TYPE:
        raise DirectiveRefused("not an action request (custom.type is not 'action')")
    for_device = custom.get("device_id")
    if for_device != device_id:
        raise DirectiveRefused(f"for device {str(for_device)[:80]!r}, this is {device_id!r}")
    request_id = custom.get("request_id")
    if not is_request_id(request_id):
        raise DirectiveRefused(f"custom.request_id {str(request_id)[:80]!r} is not a request id")
    if signed.targets:
        raise DirectiveRefused(f"names {len(signed.targets)} targets; an action request names none")
    params = custom.get("params", {})
    if not isinstance(params, dict):
        raise DirectiveRefused("custom.params is not an object")
    action = str(custom.get("action", ""))
    try:
        checked = check_params(action, params)
    except ValueError as exc:
        raise DirectiveRefused(str(exc)) from None
    return ActionRequest(
        counter=signed.version,
        expires=signed.expires,
        device_id=device_id,
        request_id=str(request_id),
        action=action,
        params=checked,
        digest=hashlib.sha256(payload).hexdigest(),
    )
