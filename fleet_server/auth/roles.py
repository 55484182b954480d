"""Roles and what each may do: a pure table, no I/O.

Every endpoint names the one permission it needs (see
:func:`fleet_server.auth.deps.require`); a role is the set of permissions below. The
operator's bearer token (scripts, ``fleetctl``) counts as the ``operator`` role.

=================  ===========================================================
permission         allows
=================  ===========================================================
fleet:read         devices, telemetry, bundles and rollouts: read only
rollouts:write     create a rollout; pause, resume, approve, cancel, roll back
devices:write      enrollment tokens, revocation
devices:act        remote actions on a device (logs, restart, reload, diagnostics),
                   and what they sent back
bundles:write      publish or withdraw bundle releases
decisions:review   confirm or override a device's decision
decisions:export   export decisions
users:admin        add, change and disable users
audit:read         the audit trail: who changed what, when, from where
=================  ===========================================================
"""

from __future__ import annotations

from typing import Literal, get_args

from fleet_server.auth.errors import UnknownRole

Permission = Literal[
    "fleet:read",
    "rollouts:write",
    "devices:write",
    "devices:act",
    "bundles:write",
    "decisions:review",
    "decisions:export",
    "users:admin",
    "audit:read",
]
PERMISSIONS: tuple[Permission, ...] = get_args(Permission)

Role = Literal["operator", "line-manager", "viewer"]
ROLES: tuple[Role, ...] = get_args(Role)

ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    "operator": frozenset(PERMISSIONS),
    "line-manager": frozenset({"fleet:read", "decisions:review", "decisions:export"}),
    "viewer": frozenset({"fleet:read"}),
}


def parse_role(name: str) -> Role:
    """``name`` as a :data:`Role`.

    Raises:
        UnknownRole: it is not one.
    """
    for role in ROLES:
        if name == role:
            return role
    raise UnknownRole(name, ROLES)


def permissions_of(role: Role) -> frozenset[Permission]:
    """What ``role`` may do."""
    return ROLE_PERMISSIONS[role]


def allows(role: Role, permission: Permission) -> bool:
    """Whether ``role`` has ``permission``."""
    return permission in ROLE_PERMISSIONS[role]
