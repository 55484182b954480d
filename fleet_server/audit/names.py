"""The action name and target of each route that may change something.

A route's name is its entry in :data:`ACTIONS` (method and path template); ``{action}``
in a name is the path's own ``action`` parameter (``rollout.pause``). A route missing
from the table is still recorded, under ``<METHOD> <path template>`` (a test holds that
every such route of the app has a name). The target names the first of the path's
parameters in :data:`TARGETS` (``rollout:r-12``); a handler may name another one with
:func:`fleet_server.audit.middleware.note`.
"""

from __future__ import annotations

from typing import Any

ACTIONS: dict[tuple[str, str], str] = {
    ("POST", "/login"): "session.login",
    ("POST", "/logout"): "session.logout",
    ("POST", "/ui/login"): "session.login",
    ("POST", "/ui/logout"): "session.logout",
    ("POST", "/api/v1/enroll"): "device.enroll",
    ("POST", "/api/v1/devices/{device_id}/tokens"): "device.token",
    ("POST", "/api/v1/devices/{device_id}/revoke"): "device.revoke",
    ("POST", "/api/v1/devices/{device_id}/actions"): "device.action",
    ("POST", "/ui/devices/{device_id}/actions"): "device.action",
    ("POST", "/api/v1/rollouts"): "rollout.create",
    ("POST", "/ui/rollouts"): "rollout.create",
    ("POST", "/api/v1/rollouts/{rollout_id}/{action}"): "rollout.{action}",
    ("POST", "/ui/rollouts/{rollout_id}/{action}"): "rollout.{action}",
    ("POST", "/api/v1/rollouts/{rollout_id}/devices/{device_id}/resolve"): "rollout.resolve",
    ("POST", "/ui/rollouts/{rollout_id}/devices/{device_id}/resolve"): "rollout.resolve",
    ("POST", "/api/v1/drift/check"): "drift.check",
    ("PUT", "/api/v1/drift/pin"): "drift.pin",
    ("DELETE", "/api/v1/drift/pin"): "drift.unpin",
    ("POST", "/api/v1/decisions/{decision_id}/review"): "decision.review",
    ("POST", "/ui/decisions/{decision_id}/review"): "decision.review",
    ("POST", "/ui/decisions/confirm"): "decision.confirm_ticked",
    ("POST", "/ui/users"): "user.add",
    ("POST", "/ui/users/{username}/{action}"): "user.{action}",
}

NOT_CHANGES: frozenset[tuple[str, str]] = frozenset({("POST", "/ui/rollouts/preview")})
"""Posts that change nothing (a form's preview): not recorded."""

TARGETS = (
    ("rollout_id", "rollout"),
    ("decision_id", "decision"),
    ("device_id", "device"),
    ("username", "user"),
)
"""Path parameters that name a target, in order of preference, and their kind."""


def action_name(method: str, template: str, params: dict[str, Any]) -> str:
    """The action of a request to ``template`` (see the module's docstring)."""
    name = ACTIONS.get((method, template))
    if name is None:
        return f"{method} {template}"
    if "{action}" in name:
        action = "".join(ch for ch in str(params.get("action", "")) if ch.isalnum() or ch in "-_")
        name = name.replace("{action}", action[:40] or "unknown")
    return name


def target_of(params: dict[str, Any]) -> str:
    """``kind:value`` of the first path parameter in :data:`TARGETS` (``""``: none)."""
    for key, kind in TARGETS:
        if params.get(key):
            return f"{kind}:{params[key]}"
    return ""
