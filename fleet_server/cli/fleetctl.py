"""``fleetctl``: the operator's command line, its parser and ``main``.

Commands are grouped (``fleetctl bundle init``); each group lives in its own module of
this package (:mod:`~fleet_server.cli.bundle`, :mod:`~fleet_server.cli.repo` for keys,
repo and directive, :mod:`~fleet_server.cli.fleet` for devices, telemetry and rollouts,
:mod:`~fleet_server.cli.users`), which adds its sub-parsers with an ``add_<group>``
function; each command is a ``cmd_<group>_<action>`` function taking the parsed arguments
and returning an exit code. The library raises; ``main`` turns any
:class:`agent.kernel.errors.EdgefleetError` into one line on stderr and exit code 2.
Passphrases never come from arguments: see docs/keys-and-repository.md.
"""

from __future__ import annotations

import argparse
import logging
import sys

from agent.kernel.cliversion import add_version
from agent.kernel.errors import EdgefleetError
from fleet_server.cli import logs
from fleet_server.cli.actions import add_action_commands
from fleet_server.cli.alerts import add_alerts
from fleet_server.cli.audit import add_audit
from fleet_server.cli.bundle import add_bundle
from fleet_server.cli.drift import add_drift
from fleet_server.cli.fleet import EXIT_CODES, ApiError, add_fleet_commands
from fleet_server.cli.repo import add_directive, add_keys, add_repo
from fleet_server.cli.users import add_users_commands

EXIT_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetctl",
        description="Operate an edgefleet fleet: signing keys, the bundle repository, "
        "model bundles, directives, devices, rollouts and users.",
        epilog="example:\n  fleetctl bundle init model.onnx --out bundles/my-model\n"
        "  fleetctl bundle publish bundles/my-model --repo repo --keystore keys\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_keys(commands)
    add_repo(commands)
    add_bundle(commands)
    add_directive(commands)
    add_action_commands(add_fleet_commands(commands))
    add_drift(commands)
    add_users_commands(commands)
    add_audit(commands)
    add_alerts(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(logging.INFO if args.verbose else logging.WARNING)
    try:
        code: int = args.func(args)
    except ApiError as exc:  # the fleet server's answer, or none: a code each (EXIT_CODES)
        print(f"fleetctl: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    except EdgefleetError as exc:
        message = " ".join(str(exc).split())
        print(f"fleetctl: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
