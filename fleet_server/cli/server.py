"""``fleet-server``: run the fleet server, or check its configuration.

The library raises; this module turns its errors into one line on stderr and exit code 2.
``serve`` runs until SIGTERM or SIGINT (exit 0), or until a part dies (exit 1); SIGUSR1
writes every thread's stack to stderr.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agent.kernel.cliversion import add_version
from agent.kernel.errors import EdgefleetError
from agent.kernel.sdnotify import Notifier, forget
from agent.kernel.signals import SignalRelay
from fleet_server.cli import logs
from fleet_server.cli.defaults import DEFAULT_CONFIG
from fleet_server.cli.setup import add_parser as add_setup_parser

if TYPE_CHECKING:
    from fleet_server.config import FleetServerConfig
    from fleet_server.serve import ServiceFactory

EXIT_ERROR = 2
EXIT_PART_DIED = 1
WATCH_S = 1.0

EPILOG = """examples:
  fleet-server serve --config /etc/edgefleet/fleet.toml
  fleet-server check-config --config fleet.toml --json
  fleet-server status --config fleet.toml --json
  fleet-server setup --admin alice --advertise-host fleet.example.com
"""

log = logging.getLogger(__name__)


def services_for(config: FleetServerConfig) -> list[ServiceFactory]:
    """The services ``serve`` starts with the server: the ingest workers, the file
    server, the rollout service (which also answers the API's rollout endpoints), the
    remote actions service, the drift job, retention, and alerts."""
    from fleet_server.actions.service import ActionService  # noqa: PLC0415 - each command imports its own
    from fleet_server.alerts.runner import AlertRunner  # noqa: PLC0415
    from fleet_server.jobs import (  # noqa: PLC0415
        DriftRunner,
        RolloutRunner,
    )
    from fleet_server.retention.runner import RetentionRunner  # noqa: PLC0415
    from fleet_server.services import FileService, IngestService  # noqa: PLC0415

    del config
    return [
        IngestService, FileService, RolloutRunner, ActionService, DriftRunner, RetentionRunner,
        AlertRunner,
    ]  # fmt: skip


def cmd_serve(args: argparse.Namespace) -> int:
    from fleet_server.config import load_config  # noqa: PLC0415 - each command imports its own
    from fleet_server.serve import FleetServer  # noqa: PLC0415

    cfg = load_config(Path(args.config))
    logging.getLogger().setLevel(cfg.server.log_level.upper())
    stop = threading.Event()
    relay = SignalRelay()
    for signum in (signal.SIGTERM, signal.SIGINT):
        relay.on(signum, functools.partial(log.info, "signal %d: stopping", signum), stop.set)
    # kill -USR1 writes every thread's stack to stderr (the journal): where a stop hangs
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    notifier = Notifier()
    forget(os.environ)  # the managed Mosquitto must not notify as this service
    notifier.status("starting: database, CA, broker, services, API")
    server = FleetServer(cfg, services=services_for(cfg))
    server.start()
    print(f"fleet-server: serving {server.url}", flush=True)
    # systemd (Type=notify): READY=1 now that the API and the broker are up; WATCHDOG=1
    # from this loop, which watches the parts, while none has died
    notifier.ready(f"serving {server.url}")
    pet_s = notifier.pet_interval_s
    watch_s = WATCH_S if pet_s is None else min(WATCH_S, pet_s / 2)
    next_pet = 0.0
    code = 0
    try:
        while not stop.wait(watch_s):
            problem = server.problem()
            if problem is not None:
                log.error("stopping: %s", problem)
                print(f"fleet-server: error: {problem}", file=sys.stderr)
                notifier.status(f"a part died: {problem}")
                code = EXIT_PART_DIED
                break
            now = time.monotonic()
            if pet_s is not None and now >= next_pet:
                notifier.watchdog()
                next_pet = now + pet_s
    finally:
        notifier.stopping("stopping: API, services, broker, database")
        server.stop()
    return code


def cmd_check_config(args: argparse.Namespace) -> int:
    from sqlalchemy.engine import make_url  # noqa: PLC0415 - each command imports its own

    from fleet_server.alerts.secrets import secrets_of  # noqa: PLC0415
    from fleet_server.broker.fleet import shard_addresses  # noqa: PLC0415
    from fleet_server.config import load_config  # noqa: PLC0415

    cfg = load_config(Path(args.config))
    secrets_of(cfg.alerts)  # a webhook's secret missing or short is an error here as at start
    report = {
        "config": args.config,
        "state_dir": str(cfg.state_dir),
        "database": make_url(cfg.database_url).render_as_string(hide_password=True),
        "api": f"{cfg.http.host}:{cfg.http.port}",
        "operator_token_env": cfg.http.operator_token_env,
        "broker": {
            "managed": cfg.broker.managed,
            "host": cfg.broker.listen_host(),
            "port": cfg.broker.listen_port(),
        },
        "shards": [
            {
                "name": a.name,
                "managed": a.managed,
                "address": f"{a.host}:{a.port}",
                "devices_told": f"{a.advertise_host}:{a.advertise_port}",
                "sites": list(a.sites),
            }
            for a in shard_addresses(cfg).values()
        ],
        "ca": str(cfg.ca_path),
        "repository": str(cfg.repository_path),
        "keystore": str(cfg.keystore_path),
        "alerts": {
            "enabled": cfg.alerts.enabled,
            "rules": [n for n, r in cfg.alerts.rules.by_name().items() if r.enabled],
            "webhooks": [
                {"name": w.name, "url": w.url, "secret_env": w.secret_env}
                for w in cfg.alerts.webhooks
            ],
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        kind = "managed" if cfg.broker.managed else "external"
        print(
            f"{args.config}: ok (API {report['api']}, {kind} broker "
            f"{cfg.broker.listen_host()}:{cfg.broker.listen_port()}, state {cfg.state_dir})"
        )
        for hook in cfg.alerts.webhooks:
            print(f"  alerts webhook {hook.name}: {hook.url} (secret ${hook.secret_env} set)")
        if cfg.broker.shards:
            for shard in report["shards"]:
                sites = f", sites {', '.join(shard['sites'])}" if shard["sites"] else ""
                print(
                    f"  shard {shard['name']}: {shard['address']}, devices told "
                    f"{shard['devices_told']}{sites}"
                )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from fleet_server.cluster.status import (  # noqa: PLC0415 - each command imports its own
        cluster_status,
        render,
    )
    from fleet_server.config import load_config  # noqa: PLC0415
    from fleet_server.db import make_engine  # noqa: PLC0415

    cfg = load_config(Path(args.config))
    engine = make_engine(cfg.database_url)
    try:
        status = cluster_status(engine, cfg.cluster.report_s)
    finally:
        engine.dispose()
    print(json.dumps(status.to_json(), indent=2) if args.json else render(status))
    return 0


def cmd_brokers(args: argparse.Namespace) -> int:
    from fleet_server.broker.runner import open_brokers, run_brokers  # noqa: PLC0415
    from fleet_server.config import load_config  # noqa: PLC0415

    cfg = load_config(Path(args.config))
    logging.getLogger().setLevel(cfg.server.log_level.upper())
    stop = threading.Event()
    SignalRelay().on(signal.SIGTERM, stop.set).on(signal.SIGINT, stop.set)
    notifier = Notifier()
    forget(os.environ)  # the Mosquittos must not notify as this service
    brokers = open_brokers(cfg, args.shard or None)
    ports = ", ".join(f"{n} :{b.config.port}" for n, b in brokers.brokers.items())

    def _ready() -> None:
        print(f"fleet-server: brokers {ports}", flush=True)
        notifier.ready(f"brokers {ports}")  # systemd (Type=notify): every Mosquitto runs

    try:
        return run_brokers(brokers, stop, _ready)
    finally:
        notifier.stopping("stopping the brokers")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleet-server",
        description="The edgefleet fleet server: HTTP API, MQTT broker and ingest, rollouts.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", default=DEFAULT_CONFIG, help=f"(default {DEFAULT_CONFIG})")

    serve = sub.add_parser(
        "serve",
        help="run the fleet server until SIGTERM",
        epilog="example: fleet-server serve --config fleet.toml",
    )
    with_config(serve)
    serve.set_defaults(func=cmd_serve)
    check = sub.add_parser(
        "check-config",
        help="validate the configuration without running",
        epilog="example: fleet-server check-config --config fleet.toml --json",
    )
    with_config(check)
    check.add_argument("--json", action="store_true", help="print a JSON report")
    check.set_defaults(func=cmd_check_config)
    status = sub.add_parser(
        "status",
        help="the replicas, which one leads, and each one's ingest rate (from the database)",
        epilog="example: fleet-server status --config fleet.toml --json",
    )
    with_config(status)
    status.add_argument("--json", action="store_true", help="print a JSON report")
    status.set_defaults(func=cmd_status)
    brokers = sub.add_parser(
        "brokers",
        help="run the managed Mosquittos (every shard) for replicas with [broker] run = false",
        epilog="example: fleet-server brokers --config fleet.toml --shard eu",
    )
    with_config(brokers)
    brokers.add_argument("--shard", action="append", help="only this shard (repeatable)")
    brokers.set_defaults(func=cmd_brokers)
    add_setup_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logs.configure(logging.INFO)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except EdgefleetError as exc:
        print(f"fleet-server: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
