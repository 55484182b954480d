"""Users, roles and sessions of the fleet server's API and web console.

- :mod:`~fleet_server.auth.roles`: the roles and their permissions (a pure table).
- :mod:`~fleet_server.auth.passwords`: user-name and password rules, argon2id hashing.
- :mod:`~fleet_server.auth.users` and :mod:`~fleet_server.auth.sessions`: the
  ``users`` and ``user_sessions`` tables.
- :mod:`~fleet_server.auth.limiter`: failed sign-ins and lockouts (in memory).
- :mod:`~fleet_server.auth.csrf`: CSRF token and origin checks (pure).
- :mod:`~fleet_server.auth.service`: sign-in, session lookup, sign-out.
- :mod:`~fleet_server.auth.deps`: the FastAPI dependencies (imported on its own, so that
  ``fleetctl users`` does not load FastAPI).

docs/users-and-roles.md describes the whole.
"""

from __future__ import annotations

from fleet_server.auth.config import AuthSection
from fleet_server.auth.errors import (
    AuthBusy,
    AuthError,
    BadUsername,
    LoginLocked,
    LoginRefused,
    UnknownRole,
    UnknownUser,
    UserExists,
    WeakPassword,
)
from fleet_server.auth.passwords import PasswordHasher, check_new_password, check_username
from fleet_server.auth.roles import (
    PERMISSIONS,
    ROLE_PERMISSIONS,
    ROLES,
    Permission,
    Role,
    allows,
    parse_role,
    permissions_of,
)
from fleet_server.auth.service import AuthService, SignedIn
from fleet_server.auth.sessions import Session
from fleet_server.auth.users import (
    User,
    add_user,
    count_sessions,
    get_user,
    list_users,
    set_disabled,
    set_password,
    set_role,
)

__all__ = [
    "PERMISSIONS",
    "ROLES",
    "ROLE_PERMISSIONS",
    "AuthBusy",
    "AuthError",
    "AuthSection",
    "AuthService",
    "BadUsername",
    "LoginLocked",
    "LoginRefused",
    "PasswordHasher",
    "Permission",
    "Role",
    "Session",
    "SignedIn",
    "UnknownRole",
    "UnknownUser",
    "User",
    "UserExists",
    "WeakPassword",
    "add_user",
    "allows",
    "check_new_password",
    "check_username",
    "count_sessions",
    "get_user",
    "list_users",
    "parse_role",
    "permissions_of",
    "set_disabled",
    "set_password",
    "set_role",
]
