"""``fleetctl keys|repo|directive``: the signing keys, the TUF repository and directives
(see docs/keys-and-repository.md), and the options the repository commands share (also
used by :mod:`fleet_server.cli.bundle`). Passphrases never come from arguments."""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.kernel.durable import write_durable
from fleet_server.cli.defaults import KEY_ROLES, PASSPHRASE_NAME
from fleet_server.errors import FleetError

if TYPE_CHECKING:
    from fleet_server.repository import KeyStore

_PASSPHRASE_HELP = (
    "passphrases are read from $NAME_<ROLE> or $NAME (NAME: --passphrase-name, default "
    f"{PASSPHRASE_NAME}), each first as a file in $CREDENTIALS_DIRECTORY, then "
    "from the environment; never from the command line"
)
_DURATION = re.compile(r"^([1-9][0-9]*)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str) -> timedelta:
    """``"7d"``, ``"12h"``, ``"30m"`` or ``"90s"`` as a timedelta (argparse type)."""
    m = _DURATION.match(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 7d, 12h, 30m or 90s")
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def open_keystore(args: argparse.Namespace) -> KeyStore:
    """The keystore of ``--keystore``, its passphrases named by ``--passphrase-name``."""
    from fleet_server.repository import (  # noqa: PLC0415 - fleetctl starts light
        KeyStore,
        Passphrases,
    )

    return KeyStore(args.keystore, Passphrases(args.passphrase_name))


def emit(args: argparse.Namespace, data: Any, lines: list[str]) -> int:
    """Print ``data`` as JSON with ``--json``, else ``lines``; exit code 0."""
    print(json.dumps(data, indent=2) if args.json else "\n".join(lines))
    return 0


def cmd_keys_init(args: argparse.Namespace) -> int:
    from fleet_server.repository import (  # noqa: PLC0415 - fleetctl starts light
        KeyStore,
        Passphrases,
    )

    store = KeyStore.create(
        args.keystore,
        root_keys=args.root_keys,
        root_threshold=args.root_threshold,
        passphrases=Passphrases(args.passphrase_name),
    )
    return _emit_keys(args, store, f"created keystore {store.path}")


def _emit_keys(args: argparse.Namespace, store: KeyStore, title: str = "") -> int:
    keys = store.list_keys(include_retired=getattr(args, "all", False))
    lines = [title] if title else []
    lines.append(f"root threshold {store.root_threshold}")
    lines += [
        f"  {k.role:<9} {k.keyid}  {k.path.name}" + (f"  retired {k.retired}" if k.retired else "")
        for k in keys
    ]
    data = {"root_threshold": store.root_threshold, "keys": [k.to_dict() for k in keys]}
    return emit(args, data, lines)


def cmd_keys_list(args: argparse.Namespace) -> int:
    return _emit_keys(args, open_keystore(args))


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    from fleet_server.repository import Repository  # noqa: PLC0415 - fleetctl starts light

    repo = Repository(args.repo)
    new = repo.rotate(args.role, open_keystore(args))
    root = repo.root().signed.version
    lines = [f"rotated {args.role}: new key(s) {', '.join(new)}; root is now v{root}"]
    return emit(args, {"role": args.role, "keyids": new, "root_version": root}, lines)


def cmd_repo_init(args: argparse.Namespace) -> int:
    from fleet_server.repository import Repository  # noqa: PLC0415 - fleetctl starts light

    repo = Repository(args.repo)
    repo.init(open_keystore(args))
    lines = [f"created repository {repo.path} (root v1, targets v1, snapshot v1, timestamp v1)"]
    return emit(args, {"repo": str(repo.path), "root_version": 1}, lines)


def cmd_repo_refresh(args: argparse.Namespace) -> int:
    from fleet_server.repository import Repository  # noqa: PLC0415 - fleetctl starts light

    repo = Repository(args.repo)
    store = open_keystore(args)
    if args.timestamp_only:
        repo.refresh_timestamp(store)
        renewed = ["timestamp"]
    else:
        renewed = repo.refresh(store)
    expiries = {
        role: md.signed.expires.isoformat()
        for role, md in (
            ("root", repo.root()),
            ("targets", repo.targets()),
            ("snapshot", repo.snapshot()),
            ("timestamp", repo.timestamp()),
        )
    }
    lines = [f"re-signed {', '.join(renewed)}"] + [
        f"  {r:<9} expires {e}" for r, e in expiries.items()
    ]
    return emit(args, {"renewed": renewed, "expires": expiries}, lines)


def cmd_directive_issue(args: argparse.Namespace) -> int:
    from fleet_server.repository import (  # noqa: PLC0415 - fleetctl starts light
        Repository,
        issue_directive,
    )

    data = issue_directive(
        Repository(args.repo),
        open_keystore(args),
        args.device,
        args.hardware_class,
        args.bundle,
        args.release,
        counter=args.counter,
        expires_in=args.expires_in,
    )
    if args.out is None:
        sys.stdout.write(data.decode() + "\n")
        return 0
    try:
        write_durable(args.out, data)
    except OSError as exc:
        raise FleetError(f"cannot write {args.out}: {exc}") from exc
    print(f"wrote {args.out}")
    return 0


def add_command(actions: Any, name: str, help_: str, example: str, func: Any) -> Any:
    """A sub-command running ``func``: its help, a description from it and an example."""
    parser = actions.add_parser(
        name,
        help=help_,
        description=help_[0].upper() + help_[1:] + ".",
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=func)
    return parser


def add_options(
    parser: Any, *, repo: bool = False, keystore: bool = False, json_: bool = True
) -> None:
    """``--repo``, ``--keystore`` with ``--passphrase-name``, and ``--json``."""
    if repo:
        parser.add_argument("--repo", required=True, type=Path, metavar="DIR", help="repository")
    if keystore:
        parser.add_argument("--keystore", required=True, type=Path, metavar="DIR", help="keys")
        parser.add_argument(
            "--passphrase-name",
            default=PASSPHRASE_NAME,
            metavar="NAME",
            help=_PASSPHRASE_HELP,
        )
    if json_:
        parser.add_argument("--json", action="store_true", help="print the result as JSON")


def add_keys(commands: Any) -> None:
    group = commands.add_parser("keys", help="signing keys", description="Manage signing keys.")
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = add_command(
        actions, "init", "generate a keystore: root keys and one key per other role",
        "EDGEFLEET_KEY_PASSPHRASE_ROOT=... EDGEFLEET_KEY_PASSPHRASE=... "
        "fleetctl keys init --keystore keys --root-keys 3 --root-threshold 2",
        cmd_keys_init,
    )  # fmt: skip
    add_options(init, keystore=True)
    init.add_argument("--root-keys", type=int, default=3, metavar="N", help="default: 3")
    init.add_argument("--root-threshold", type=int, default=2, metavar="T", help="default: 2")
    listing = add_command(
        actions, "list", "list keys: role, key id, file (no passphrase needed)",
        "fleetctl keys list --keystore keys --json", cmd_keys_list,
    )  # fmt: skip
    add_options(listing, keystore=True)
    listing.add_argument("--all", action="store_true", help="include retired keys")
    rotate = add_command(
        actions, "rotate", "replace a role's keys and publish a new root (or targets)",
        "fleetctl keys rotate root --keystore keys --repo repo", cmd_keys_rotate,
    )  # fmt: skip
    rotate.add_argument("role", choices=KEY_ROLES, help="the role whose keys are replaced")
    add_options(rotate, repo=True, keystore=True)


def add_repo(commands: Any) -> None:
    group = commands.add_parser(
        "repo", help="bundle repository", description="Create and maintain the repository."
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = add_command(
        actions, "init", "create the repository's first signed metadata from a keystore",
        "fleetctl repo init --repo repo --keystore keys", cmd_repo_init,
    )  # fmt: skip
    add_options(init, repo=True, keystore=True)
    refresh = add_command(
        actions, "refresh",
        "re-sign the timestamp, and targets/snapshot when half their validity is gone",
        "fleetctl repo refresh --repo repo --keystore keys   # daily, from a timer",
        cmd_repo_refresh,
    )  # fmt: skip
    add_options(refresh, repo=True, keystore=True)
    refresh.add_argument("--timestamp-only", action="store_true", help="only the timestamp")


def add_directive(commands: Any) -> None:
    group = commands.add_parser(
        "directive", help="signed directives", description="Assign bundles to devices."
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    issue = add_command(
        actions, "issue", "sign a directive assigning a published release to one device",
        "fleetctl directive issue --repo repo --keystore keys --device cam-07 \\\n"
        "      --hardware-class jetson-orin --bundle text-cls --release 2 --out d.json",
        cmd_directive_issue,
    )  # fmt: skip
    add_options(issue, repo=True, keystore=True, json_=False)
    issue.add_argument("--device", required=True, metavar="ID", help="device id")
    issue.add_argument("--hardware-class", required=True, metavar="PROFILE", help="profile name")
    issue.add_argument("--bundle", required=True, metavar="NAME", help="bundle name")
    issue.add_argument("--release", required=True, type=int, metavar="N", help="release")
    issue.add_argument("--counter", type=int, metavar="N", help="default: the next one")
    issue.add_argument(
        "--expires-in", type=parse_duration, default=timedelta(days=7), metavar="DURATION",
        help="validity, e.g. 7d, 12h (default: 7d)",
    )  # fmt: skip
    issue.add_argument("--out", type=Path, metavar="FILE", help="write here (default: stdout)")
