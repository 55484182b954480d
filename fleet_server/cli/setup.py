"""``fleet-server setup``: the fleet server's first start in one command.

It makes what ``fleet-server serve`` needs and can't make alone: the secrets (the key
passphrase and the operator API token, generated, written as files 0600 in the
credentials directory, where the unit's ``LoadCredential=`` reads them; the config only
names them), the signing keystore and the bundle repository (what ``fleetctl keys init``
and ``fleetctl repo init`` do), the fleet CA and its first CRL (what ``serve`` does at its
first start), the database with its first user (role ``operator``: every permission,
users included), and ``fleet.toml``. The broker's certificate and the server's MQTT
identities are issued by ``serve`` at its start (it renews them there too).

Every check comes before the first write: bad input changes nothing. An existing config
is refused without ``--force``; with it the config is written again and what exists is
kept (keys, CA, repository, secrets and users are never made twice). What setup makes in
the state directory is given to ``--owner`` (the ``edgefleet-server`` user when it
exists), the config is ``root:<owner's group>`` 0640, the credentials stay root's.

Example::

    fleet-server setup --admin alice --advertise-host fleet.example.com
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import secrets
import socket
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.kernel.durable import make_dirs, write_durable
from agent.kernel.errors import ConfigError, EdgefleetError
from fleet_server.cli.defaults import DEFAULT_CONFIG, PASSPHRASE_NAME
from fleet_server.errors import FleetError

if TYPE_CHECKING:
    from fleet_server.config import FleetServerConfig
    from fleet_server.repository import Passphrases

EXIT_ERROR = 2
DEFAULT_STATE_DIR = "/var/lib/edgefleet/server"
DEFAULT_CREDENTIALS = "/etc/edgefleet/credentials/server"
SERVICE_USER = "edgefleet-server"
TOKEN_NAME = "EDGEFLEET_API_TOKEN"  # noqa: S105 - a credential's name
SECRET_BYTES = 32
CONFIG_MODE = 0o640
SECRET_MODE = 0o600
ROOT_KEYS, ROOT_THRESHOLD = 3, 2
"""``fleetctl keys init``'s defaults."""
ADMIN_ROLE = "operator"
"""The role with every permission (users:admin included)."""

_OPTION_OF = {
    "http.port": "--api-port",
    "http.host": "--listen",
    "broker.mosquitto.port": "--mqtt-port",
    "broker.mosquitto.host": "--listen",
    "broker": "--advertise-host",
    "database.url": "--database",
}
"""Which option gave a config field (an error names the option, not the file's key)."""

EPILOG = """examples:
  fleet-server setup --admin alice --advertise-host fleet.example.com
  printf '%s\\n' "$PASSWORD" | fleet-server setup --admin alice --password-stdin
  fleet-server setup --config fleet.toml --state-dir state --credentials-dir creds \\
      --listen 127.0.0.1 --api-port 8080 --mqtt-port 8883 --admin alice --force

The secrets go to the credentials directory as files (0600): EDGEFLEET_KEY_PASSPHRASE
(the CA's and the signing keys' passphrase) and EDGEFLEET_API_TOKEN (the operator token
for fleetctl and scripts); the unit passes them with LoadCredential=. Without
--password-stdin the admin's password is generated and printed once.
"""


class SetupError(FleetError):
    """Setup refused its input or could not finish; ``what`` names the input at fault."""

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")


@dataclass
class Report:
    """What setup did (``--json`` prints it)."""

    config: str
    state_dir: str
    credentials_dir: str
    api: str
    broker: str
    owner: str
    done: list[str] = field(default_factory=list)
    admin: str | None = None
    admin_added: bool = False
    admin_password: str | None = None
    next_steps: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Owner:
    name: str
    uid: int
    gid: int


def _owner(name: str | None) -> _Owner:
    try:
        if name is not None:
            pw = pwd.getpwnam(name)
        else:
            try:
                pw = pwd.getpwnam(SERVICE_USER)
            except KeyError:
                pw = pwd.getpwuid(os.getuid())
    except KeyError:
        raise SetupError(f"--owner {name}", "no such user") from None
    return _Owner(pw.pw_name, pw.pw_uid, pw.pw_gid)


def _local(host: str) -> str:
    """How this host reaches a listener bound to ``host``."""
    return "127.0.0.1" if host == "0.0.0.0" else "[::1]" if host == "::" else host  # noqa: S104


def _s(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def render(args: argparse.Namespace, state_dir: Path) -> str:
    """fleet.toml's text for these options."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        f"# Written by `fleet-server setup` on {when}; `fleet-server setup --force` writes it",
        "# again. Secrets are named here, never given: they are files in the credentials",
        "# directory, passed to the service by LoadCredential=.",
        "",
        "[server]",
        f"state_dir = {_s(str(state_dir))}",
        f"passphrase_name = {_s(PASSPHRASE_NAME)}",
        "",
        "[http]",
        f"host = {_s(args.listen)}",
        f"port = {args.api_port}",
        f"operator_token_env = {_s(TOKEN_NAME)}",
    ]
    if args.database:
        out += ["", "[database]", f"url = {_s(args.database)}"]
    if args.advertise_host:
        out += ["", "[broker]", f"advertise_host = {_s(args.advertise_host)}  # devices use it"]
    out += [
        "",
        "[broker.mosquitto]",
        f"host = {_s(args.listen)}",
        f"port = {args.mqtt_port}",
    ]
    return "\n".join(out) + "\n"


def _check_database(url: str | None) -> None:
    if not url:
        return
    from sqlalchemy.engine import make_url  # noqa: PLC0415 - fleet-server starts light

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - sqlalchemy raises several kinds; the config names it
        return
    if parsed.password:
        raise SetupError(
            "--database",
            "holds a password, which would be in the config: give it to libpq another way "
            "(a password file, PGPASSFILE) and leave it out of the URL",
        )


def _read_password(args: argparse.Namespace) -> tuple[str | None, bool]:
    """The admin's password and whether it was generated."""
    if args.admin is None:
        return None, False
    if args.password_stdin:
        from fleet_server.auth.passwords import (  # noqa: PLC0415 - fleet-server starts light
            MAX_PASSWORD,
        )

        line = sys.stdin.readline(MAX_PASSWORD + 2)
        return line.removesuffix("\n").removesuffix("\r"), False
    return secrets.token_urlsafe(18), True


def _secret(creds: Path, name: str) -> tuple[str, bool]:
    """The secret in ``creds/name`` when there is one, else a new one; and whether new."""
    path = creds / name
    try:
        value = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return secrets.token_urlsafe(SECRET_BYTES), True
    except OSError as exc:
        raise SetupError(str(path), f"cannot read: {exc.strerror}") from None
    if not value:
        raise SetupError(str(path), "is empty: remove it, or put the secret back")
    return value, False


def _plan(args: argparse.Namespace) -> tuple[Path, Path, Path, FleetServerConfig, str]:
    """Every check before a write: the paths, the parsed config and its text.

    Raises:
        SetupError: the input is bad (nothing written).
    """
    from agent.kernel.toml import parse_toml  # noqa: PLC0415 - fleet-server starts light
    from fleet_server.auth import check_username  # noqa: PLC0415
    from fleet_server.config import parse_config  # noqa: PLC0415

    config = Path(args.config)
    if config.exists() and not args.force:
        raise SetupError(str(config), "exists; nothing changed (give --force to write it again)")
    state_dir = Path(args.state_dir).absolute()
    creds = Path(args.credentials_dir).absolute()
    _check_database(args.database)
    if args.admin is not None:
        try:
            check_username(args.admin)
        except EdgefleetError as exc:
            raise SetupError(f"--admin {args.admin}", str(exc)) from None
    text = render(args, state_dir)
    try:
        cfg = parse_config(parse_toml(text, str(config)), str(config), config.absolute().parent)
    except ConfigError as exc:
        option = _OPTION_OF.get(exc.field)
        reason = " ".join(exc.reason.removeprefix("Value error, ").split())
        raise SetupError(option or f"config {exc.field}", reason) from None
    return config, state_dir, creds, cfg, text


def _chown_tree(path: Path, owner: _Owner) -> None:
    if os.geteuid() != 0 or not path.exists():
        return
    os.chown(path, owner.uid, owner.gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(Path(dirpath) / name, owner.uid, owner.gid, follow_symlinks=False)


def _make_state(cfg: FleetServerConfig, passphrases: Passphrases, report: Report) -> None:
    from fleet_server.ca import FleetCA  # noqa: PLC0415 - fleet-server starts light
    from fleet_server.repository import KeyStore, Repository  # noqa: PLC0415

    make_dirs(cfg.state_dir.parent, mode=0o755)  # the service user passes through
    make_dirs(cfg.state_dir, mode=0o700)
    store = KeyStore(cfg.keystore_path, passphrases)
    if store.exists():
        report.done.append(f"kept the keystore {store.path}")
    else:
        store = KeyStore.create(
            cfg.keystore_path,
            root_keys=ROOT_KEYS,
            root_threshold=ROOT_THRESHOLD,
            passphrases=passphrases,
        )
        report.done.append(f"created the keystore {store.path}")
    repo = Repository(cfg.repository_path)
    if repo.initialized():
        report.done.append(f"kept the repository {repo.path}")
    else:
        repo.init(store)
        report.done.append(f"created the repository {repo.path}")
    ca = FleetCA(cfg.ca_path, passphrases)
    if ca.exists():
        report.done.append(f"kept the fleet CA {ca.path}")
    else:
        ca = FleetCA.create(cfg.ca_path, passphrases=passphrases)
        report.done.append(f"created the fleet CA {ca.path}")
    ca.write_crl()  # also proves the passphrase opens the CA key


def _add_admin(
    cfg: FleetServerConfig, args: argparse.Namespace, password: str | None, report: Report
) -> None:
    from fleet_server.auth import (  # noqa: PLC0415 - fleet-server starts light
        PasswordHasher,
        add_user,
        get_user,
    )
    from fleet_server.db import open_database  # noqa: PLC0415

    engine = open_database(cfg.database_url)
    try:
        if args.admin is None or password is None:
            report.done.append("database ready (no --admin: add users with fleetctl users add)")
            return
        if get_user(engine, args.admin) is not None:
            report.done.append(f"kept the user {args.admin} (its password unchanged)")
            report.admin = args.admin
            return
        add_user(engine, PasswordHasher(), args.admin, ADMIN_ROLE, password)
        report.admin = args.admin
        report.admin_added = True
        report.done.append(f"added the user {args.admin} (role {ADMIN_ROLE})")
    finally:
        engine.dispose()


def setup_server(args: argparse.Namespace) -> Report:
    """Do what the module docstring says.

    Raises:
        SetupError: bad input (nothing written) or a step that failed.
        FleetError: the keystore, repository, CA or database refused (named).
    """
    from fleet_server.auth.passwords import (  # noqa: PLC0415 - fleet-server starts light
        check_new_password,
    )
    from fleet_server.ca import FleetCA  # noqa: PLC0415
    from fleet_server.config import load_config  # noqa: PLC0415
    from fleet_server.repository import KeyStore, Passphrases  # noqa: PLC0415

    config, state_dir, creds, cfg, text = _plan(args)
    owner = _owner(args.owner)
    password, generated = _read_password(args)
    if args.admin is not None and password is not None:
        try:
            check_new_password(args.admin, password)
        except EdgefleetError as exc:
            raise SetupError("--password-stdin", str(exc)) from None
    passphrase, new_passphrase = _secret(creds, PASSPHRASE_NAME)
    token, new_token = _secret(creds, TOKEN_NAME)
    keys_exist = KeyStore(cfg.keystore_path).exists() or FleetCA(cfg.ca_path).exists()
    if new_passphrase and keys_exist:
        raise SetupError(
            str(creds / PASSPHRASE_NAME),
            "missing, but keys exist in the state directory that need their passphrase",
        )
    report = Report(
        str(config),
        str(state_dir),
        str(creds),
        f"http://{_local(cfg.http.host)}:{cfg.http.port}",
        f"{cfg.broker.advertise_host or cfg.broker.listen_host()}:{cfg.broker.listen_port()}",
        owner.name,
    )
    try:
        make_dirs(creds.parent, mode=0o755)
        make_dirs(creds, mode=0o700)
        for name, value, new in (
            (PASSPHRASE_NAME, passphrase, new_passphrase),
            (TOKEN_NAME, token, new_token),
        ):
            if new:
                write_durable(creds / name, value.encode() + b"\n", mode=SECRET_MODE)
                report.done.append(f"wrote the secret {creds / name} (0600)")
            else:
                report.done.append(f"kept the secret {creds / name}")
        passphrases = Passphrases(PASSPHRASE_NAME, environ={"CREDENTIALS_DIRECTORY": str(creds)})
        _make_state(cfg, passphrases, report)
        _add_admin(cfg, args, password, report)
        _chown_tree(cfg.state_dir, owner)
        make_dirs(config.parent, mode=0o755)
        write_durable(config, text.encode(), mode=CONFIG_MODE)
        if os.geteuid() == 0:
            os.chown(config, 0, owner.gid)
        report.done.append(f"wrote {config} (0640)")
    except OSError as exc:
        raise SetupError("write", f"{exc.filename or ''}: {exc.strerror or exc}") from exc
    load_config(config)  # check-config's check, on the file as written
    if generated and report.admin_added:
        report.admin_password = password
    report.next_steps += [
        "systemctl restart edgefleet-fleet-server",
        f"CREDENTIALS_DIRECTORY={creds} fleetctl devices enroll DEVICE --server {report.api}",
    ]
    return report


def _print(report: Report) -> None:
    for line in report.done:
        print(line)
    print(f"check-config: {report.config}: ok (API {report.api}, broker {report.broker})")
    if report.admin_password:
        print(f"password of {report.admin} (shown once): {report.admin_password}")
    for step in report.next_steps:
        print(f"next: {step}")


def cmd_setup(args: argparse.Namespace) -> int:
    report = setup_server(args)
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        _print(report)
    return 0


def add_parser(sub: Any) -> None:
    """Add ``setup`` to ``fleet-server``'s subcommands."""
    p = sub.add_parser(
        "setup",
        help="first start: secrets, keys, repository, CA, database and admin, fleet.toml",
        description="Make what the fleet server needs at its first start and write "
        "fleet.toml; secrets go to the credentials directory, never the config.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"(default {DEFAULT_CONFIG})")
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help=f"(default {DEFAULT_STATE_DIR})")
    p.add_argument(
        "--credentials-dir",
        default=DEFAULT_CREDENTIALS,
        help=f"where the secrets go, 0700 (default {DEFAULT_CREDENTIALS})",
    )
    p.add_argument("--admin", metavar="USER", help="add this first user (role operator)")
    p.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the admin's password from stdin (default: generate and print it once)",
    )
    p.add_argument("--api-port", type=int, default=8080, help="HTTP API port (default 8080)")
    p.add_argument("--mqtt-port", type=int, default=8883, help="broker TLS port (default 8883)")
    p.add_argument(
        "--listen",
        default="0.0.0.0",  # noqa: S104 - a fleet server is reached by devices
        help="address the API and broker bind (default 0.0.0.0)",
    )
    p.add_argument(
        "--advertise-host",
        default=None,
        help="the name devices reach this server by (default: this host's FQDN when "
        "--listen is 0.0.0.0)",
    )
    p.add_argument(
        "--database",
        metavar="URL",
        help="postgresql+psycopg://HOST/DB (default: SQLite in the state directory)",
    )
    p.add_argument(
        "--owner", help=f"the service's user (default: {SERVICE_USER} if it exists, else yours)"
    )
    p.add_argument("--force", action="store_true", help="write over an existing config")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.set_defaults(func=_with_defaults)


def _with_defaults(args: argparse.Namespace) -> int:
    if args.advertise_host is None and args.listen in ("0.0.0.0", "::"):  # noqa: S104
        args.advertise_host = socket.getfqdn()
    return cmd_setup(args)
