"""Users in the fleet database: name, role, argon2id password hash, disabled flag.

The password itself is never stored or logged; :class:`User` keeps the hash out of its
``repr``. Changing a password or disabling a user ends that user's sessions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import sqlalchemy as sa

from fleet_server.auth.errors import UnknownUser, UserExists
from fleet_server.auth.passwords import PasswordHasher, check_new_password, check_username
from fleet_server.auth.roles import Role, parse_role
from fleet_server.db._tx import Bind, reading, upsert, writing
from fleet_server.db.tables import user_sessions, users


@dataclass(frozen=True)
class User:
    """A user as stored (times in Unix seconds)."""

    username: str
    role: Role
    disabled: bool
    created_at: float
    password_changed_at: float
    password_hash: str = field(repr=False)


def _user(row: sa.Row[tuple[object, ...]]) -> User:
    m = row._mapping
    return User(
        username=str(m["username"]),
        role=parse_role(str(m["role"])),
        disabled=bool(m["disabled"]),
        created_at=float(m["created_at"]),
        password_changed_at=float(m["password_changed_at"]),
        password_hash=str(m["password_hash"]),
    )


def get_user(bind: Bind, username: str) -> User | None:
    """The user called ``username``, or None.

    Raises:
        UnknownRole: the stored role is not one of the roles (the row was edited by hand).
    """
    with reading(bind) as conn:
        row = conn.execute(sa.select(users).where(users.c.username == username)).first()
    return None if row is None else _user(row)


def list_users(bind: Bind) -> list[User]:
    """Every user, by name."""
    with reading(bind) as conn:
        rows = conn.execute(sa.select(users).order_by(users.c.username)).all()
    return [_user(r) for r in rows]


def add_user(
    bind: Bind,
    hasher: PasswordHasher,
    username: str,
    role: str,
    password: str,
    *,
    now: float | None = None,
) -> User:
    """Store a new user with an argon2id hash of ``password``.

    Raises:
        BadUsername: the name breaks the rules.
        UnknownRole: ``role`` is not a role.
        WeakPassword: the password breaks the rules.
        UserExists: a user of that name exists.
    """
    check_username(username)
    checked_role = parse_role(role)
    check_new_password(username, password)
    created = time.time() if now is None else now
    digest = hasher.hash(password)
    with writing(bind) as conn:
        stmt = (
            upsert(conn, users)
            .values(
                username=username,
                role=checked_role,
                password_hash=digest,
                disabled=False,
                created_at=created,
                password_changed_at=created,
            )
            .on_conflict_do_nothing(index_elements=["username"])
            .returning(users.c.username)
        )
        if conn.execute(stmt).first() is None:
            raise UserExists(username)
    return User(username, checked_role, False, created, created, digest)


def _update(bind: Bind, username: str, **values: object) -> None:
    with writing(bind) as conn:
        done = conn.execute(
            users.update()
            .where(users.c.username == username)
            .values(**values)
            .returning(users.c.username)
        ).first()
        if done is None:
            raise UnknownUser(username)
        if values.get("disabled") is True or "password_changed_at" in values:
            conn.execute(user_sessions.delete().where(user_sessions.c.username == username))


def set_password(
    bind: Bind, hasher: PasswordHasher, username: str, password: str, *, now: float | None = None
) -> None:
    """Give ``username`` a new password; the user's sessions end.

    Raises:
        WeakPassword: the password breaks the rules.
        UnknownUser: no such user.
    """
    check_new_password(username, password)
    digest = hasher.hash(password)
    changed = time.time() if now is None else now
    _update(bind, username, password_hash=digest, password_changed_at=changed)


def replace_hash(bind: Bind, username: str, old_hash: str, new_hash: str) -> bool:
    """Store a rehash of the same password (new parameters) unless the hash changed
    meanwhile; sessions stay. Whether it was stored."""
    with writing(bind) as conn:
        done = conn.execute(
            users.update()
            .where(users.c.username == username, users.c.password_hash == old_hash)
            .values(password_hash=new_hash)
        )
    return bool(done.rowcount)


def set_disabled(bind: Bind, username: str, disabled: bool) -> None:
    """Disable (its sessions end, it can't sign in) or enable ``username``.

    Raises:
        UnknownUser: no such user.
    """
    _update(bind, username, disabled=disabled)


def set_role(bind: Bind, username: str, role: str) -> None:
    """Give ``username`` another role (open sessions get it at their next request).

    Raises:
        UnknownRole: ``role`` is not a role.
        UnknownUser: no such user.
    """
    _update(bind, username, role=parse_role(role))


def count_sessions(bind: Bind, *, now: float | None = None) -> dict[str, int]:
    """Unexpired sessions per user name (idle ones not yet removed included)."""
    at = time.time() if now is None else now
    s = user_sessions
    stmt = (
        sa.select(s.c.username, sa.func.count()).where(s.c.expires_at > at).group_by(s.c.username)
    )
    with reading(bind) as conn:
        return {str(name): int(n) for name, n in conn.execute(stmt)}
