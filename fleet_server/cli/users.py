"""``fleetctl users add|passwd|list|role|disable|enable``: users of the web console and API.

These work on the fleet database directly (``--config`` names fleet.toml, or
``--db-url`` the database), not over the API: the first operator is added before anyone
can sign in. Passwords never come from arguments: ``--password-stdin`` reads one line
from standard input, ``--password-env NAME`` reads a variable, and on a terminal
fleetctl asks twice.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_server import timefmt
from fleet_server.cli.defaults import DEFAULT_CONFIG, USER_ROLES

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

EXAMPLES = """\
examples:
  fleetctl users add alice --role operator --config /etc/edgefleet/fleet.toml
  printf '%s\\n' "$NEW_PASSWORD" | fleetctl users passwd bob --password-stdin --config fleet.toml
  fleetctl users list --json --db-url postgresql+psycopg://fleet@db/fleet

Roles: operator (everything), line-manager (review and export decisions, read the
fleet), viewer (read the fleet). Passwords: at least 12 characters. The commands open
the fleet database directly (and bring its schema up to date).
"""


def _database_url(args: argparse.Namespace) -> str:
    if args.db_url:
        return str(args.db_url)
    from fleet_server.config import load_config  # noqa: PLC0415 - fleetctl starts light

    return load_config(Path(args.config or DEFAULT_CONFIG)).database_url


@contextmanager
def _database(args: argparse.Namespace) -> Iterator[Engine]:
    from fleet_server.db import open_database  # noqa: PLC0415 - fleetctl starts light

    engine = open_database(_database_url(args))
    try:
        yield engine
    finally:
        engine.dispose()


def read_password(args: argparse.Namespace, username: str) -> str:
    """The new password of ``username`` from stdin, a variable, or the terminal.

    Raises:
        AuthError: none given, the variable is unset, or the two entries differ.
    """
    from fleet_server.auth import AuthError  # noqa: PLC0415 - fleetctl starts light
    from fleet_server.auth.passwords import MAX_PASSWORD  # noqa: PLC0415

    if args.password_stdin:
        line = sys.stdin.readline(MAX_PASSWORD + 2)
        return line.removesuffix("\n").removesuffix("\r")
    if args.password_env:
        value = os.environ.get(args.password_env)
        if value is None:
            raise AuthError("--password-env", f"${args.password_env} is not set")
        return value
    if not sys.stdin.isatty():
        raise AuthError(
            "password", "not on a terminal: give --password-stdin or --password-env NAME"
        )
    first = getpass.getpass(f"new password for {username}: ")
    if getpass.getpass("again: ") != first:
        raise AuthError("password", "the two entries differ")
    return first


def _emit(args: argparse.Namespace, data: Any, text: str) -> int:
    print(json.dumps(data, indent=2) if args.json else text)
    return 0


def _audit(engine: Engine, action: str, name: str, detail: dict[str, Any] | None = None) -> None:
    """The change in the audit trail (the system user that ran fleetctl, source cli)."""
    from fleet_server.audit import record_local  # noqa: PLC0415 - fleetctl starts light

    record_local(engine, action, f"user:{name}", detail=detail)


def cmd_users_add(args: argparse.Namespace) -> int:
    from fleet_server.auth import (  # noqa: PLC0415 - fleetctl starts light
        PasswordHasher,
        UserExists,
        add_user,
        check_username,
        get_user,
    )

    check_username(args.name)
    with _database(args) as engine:
        if get_user(engine, args.name) is not None:
            raise UserExists(args.name)
        password = read_password(args, args.name)
        user = add_user(engine, PasswordHasher(), args.name, args.role, password)
        _audit(engine, "user.add", args.name, {"role": user.role})
    data = {"username": user.username, "role": user.role}
    return _emit(args, data, f"added user {user.username} ({user.role})")


def cmd_users_passwd(args: argparse.Namespace) -> int:
    from fleet_server.auth import (  # noqa: PLC0415 - fleetctl starts light
        PasswordHasher,
        UnknownUser,
        get_user,
        set_password,
    )

    with _database(args) as engine:
        if get_user(engine, args.name) is None:
            raise UnknownUser(args.name)
        password = read_password(args, args.name)
        set_password(engine, PasswordHasher(), args.name, password)
        _audit(engine, "user.password", args.name)
    text = f"password of {args.name} changed; its sessions ended"
    return _emit(args, {"username": args.name, "password_changed": True}, text)


def cmd_users_role(args: argparse.Namespace) -> int:
    from fleet_server.auth import set_role  # noqa: PLC0415 - fleetctl starts light

    with _database(args) as engine:
        set_role(engine, args.name, args.role)
        _audit(engine, "user.role", args.name, {"role": args.role})
    return _emit(args, {"username": args.name, "role": args.role}, f"{args.name} is {args.role}")


def cmd_users_disable(args: argparse.Namespace) -> int:
    from fleet_server.auth import set_disabled  # noqa: PLC0415 - fleetctl starts light

    disabled = args.action == "disable"
    with _database(args) as engine:
        set_disabled(engine, args.name, disabled)
        _audit(engine, f"user.{args.action}", args.name)
    state = "disabled; its sessions ended" if disabled else "enabled"
    return _emit(args, {"username": args.name, "disabled": disabled}, f"{args.name} {state}")


def _stamp(ts: float) -> str:
    return timefmt.iso(ts)


def cmd_users_list(args: argparse.Namespace) -> int:
    from fleet_server.auth import (  # noqa: PLC0415 - fleetctl starts light
        count_sessions,
        list_users,
    )

    with _database(args) as engine:
        users = list_users(engine)
        sessions = count_sessions(engine)
    data = [
        {
            "username": u.username,
            "role": u.role,
            "disabled": u.disabled,
            "created_at": u.created_at,
            "password_changed_at": u.password_changed_at,
            "sessions": sessions.get(u.username, 0),
        }
        for u in users
    ]
    lines = [f"{'USER':<24} {'ROLE':<13} {'STATE':<9} {'PASSWORD SET':<21} SESSIONS"]
    lines += [
        f"{u.username:<24} {u.role:<13} {'disabled' if u.disabled else 'active':<9} "
        f"{_stamp(u.password_changed_at):<21} {sessions.get(u.username, 0)}"
        for u in users
    ]
    lines.append(f"{len(data)} user(s)")
    return _emit(args, data, "\n".join(lines))


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_mutually_exclusive_group()
    where.add_argument(
        "--config",
        metavar="FILE",
        help=f"fleet.toml naming the database (default {DEFAULT_CONFIG})",
    )
    where.add_argument("--db-url", metavar="URL", help="the fleet database's SQLAlchemy URL")
    common.add_argument("--json", action="store_true", help="print the result as JSON")
    return common


def _password_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    source = options.add_mutually_exclusive_group()
    source.add_argument(
        "--password-stdin", action="store_true", help="read the password from standard input"
    )
    source.add_argument(
        "--password-env", metavar="NAME", help="read the password from this environment variable"
    )
    return options


def add_users_commands(commands: Any) -> None:
    """Add ``users`` to fleetctl's sub-parsers."""
    group = commands.add_parser(
        "users",
        help="users of the web console and API: add, passwd, list, role, disable, enable",
        description="Users of the fleet server's web console and API, in the fleet database.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    common, secret = _common(), _password_options()

    def action(name: str, help_text: str, example: str, *parents: Any) -> Any:
        return actions.add_parser(
            name,
            parents=[common, *parents],
            help=help_text,
            description=f"{help_text[0].upper()}{help_text[1:]}.",
            epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    add = action(
        "add",
        "add a user",
        "fleetctl users add alice --role operator --config /etc/edgefleet/fleet.toml",
        secret,
    )
    add.add_argument("name", help="user name: 1-64 of a-z 0-9 . _ -")
    add.add_argument("--role", required=True, choices=USER_ROLES, help="what the user may do")
    add.set_defaults(func=cmd_users_add)
    passwd = action(
        "passwd",
        "set a user's password (ends their sessions)",
        "fleetctl users passwd bob --password-env NEW_PASSWORD --config fleet.toml",
        secret,
    )
    passwd.add_argument("name", help="user name")
    passwd.set_defaults(func=cmd_users_passwd)
    listing = action("list", "list users", "fleetctl users list --json --config fleet.toml")
    listing.set_defaults(func=cmd_users_list)
    role = action(
        "role",
        "give a user another role",
        "fleetctl users role bob line-manager --config fleet.toml",
    )
    role.add_argument("name", help="user name")
    role.add_argument("role", choices=USER_ROLES, help="the new role")
    role.set_defaults(func=cmd_users_role)
    for name, text in (
        ("disable", "stop a user signing in (ends their sessions)"),
        ("enable", "let a disabled user sign in again"),
    ):
        p = action(name, text, f"fleetctl users {name} bob --config fleet.toml")
        p.add_argument("name", help="user name")
        p.set_defaults(func=cmd_users_disable)
