"""``fleetctl db stats|prune``: the fleet database's tables and their retention.

Like ``fleetctl users``, these work on the database directly (``--config`` names
fleet.toml: its database, ``[retention]`` budgets and repository; ``--db-url`` names
the database alone, with the default budgets), not over the API. ``prune`` runs one
retention pass by hand, the same the leader runs every ``[retention] interval_s``
(docs/retention.md); running it beside the servers is safe (deletes are idempotent).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_server import timefmt
from fleet_server.cli.defaults import DEFAULT_CONFIG

if TYPE_CHECKING:
    from fleet_server.config import FleetServerConfig

EXAMPLES = """\
examples:
  fleetctl db stats --config /etc/edgefleet/fleet.toml
  fleetctl db stats --json --db-url postgresql+psycopg://fleet@db/fleet
  fleetctl db prune --dry-run --config fleet.toml
"""


def _config(args: argparse.Namespace) -> FleetServerConfig:
    from fleet_server.config import (  # noqa: PLC0415 - fleetctl starts light
        FleetServerConfig,
        load_config,
    )

    if args.config is None and args.db_url:
        return FleetServerConfig()
    return load_config(Path(args.config or DEFAULT_CONFIG))


def _size(n: int | None) -> str:
    if n is None:
        return "n/a"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _time(ts: float | None) -> str:
    return "-" if ts is None else timefmt.iso(ts)


def stats_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The table ``fleetctl db stats`` prints."""
    header = ("TABLE", "ROWS", "SIZE", "OLDEST", "NEWEST", "BUDGET", "PAST BUDGET")
    table = [header]
    for r in rows:
        past = r["past_budget"]
        table.append(
            (
                r["table"],
                f"{r['rows']:,}",
                _size(r["size_bytes"]),
                _time(r["oldest"]),
                _time(r["newest"]),
                r["budget"],
                "-" if past is None else f"{past:,}",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in table]  # fmt: skip
    total = sum(r["size_bytes"] or 0 for r in rows)
    lines.append(f"{len(rows)} tables, {sum(r['rows'] for r in rows):,} rows, {_size(total)}")
    return lines


def cmd_db_stats(args: argparse.Namespace) -> int:
    from fleet_server.db import open_database  # noqa: PLC0415 - fleetctl starts light
    from fleet_server.retention.stats import table_stats  # noqa: PLC0415

    config = _config(args)
    engine = open_database(args.db_url or config.database_url)
    try:
        rows = [
            s.to_dict()
            for s in table_stats(
                engine,
                config.retention,
                drift_reference_s=config.drift.reference_hours * 3600.0,
                session_idle_s=float(config.auth.session_idle_s),
            )
        ]
    finally:
        engine.dispose()
    print(json.dumps(rows, indent=2) if args.json else "\n".join(stats_lines(rows)))
    return 0


def prune_lines(report: dict[str, Any]) -> list[str]:
    """What ``fleetctl db prune`` prints."""
    dry = report["dry_run"]
    lines = [f"{'TABLE':<20} {'PAST BUDGET' if dry else 'DELETED':>12} {'BATCHES':>8} LONGEST"]
    for r in report["tables"]:
        n = r["past_budget"] if dry else r["deleted"]
        longest = f"{r['longest_batch_s'] * 1000:.1f} ms"
        lines.append(f"{r['table']:<20} {n or 0:>12,} {r['batches']:>8} {longest}")
        if r["error"]:
            lines.append(f"  error: {r['error']}")
    repo = report["repository"]
    if repo is not None:
        verb = "would remove" if dry else "removed"
        lines.append(
            f"repository: {verb} {len(repo['metadata_removed'])} metadata and "
            f"{len(repo['targets_removed'])} target file(s), {_size(repo['bytes_freed'])}"
        )
    what = "dry run" if dry else f"{report['deleted_total']:,} row(s) deleted"
    lines.append(f"{what} in {report['duration_s']:.2f} s")
    return lines


def cmd_db_prune(args: argparse.Namespace) -> int:
    from fleet_server.db import open_database  # noqa: PLC0415 - fleetctl starts light
    from fleet_server.repository import Repository  # noqa: PLC0415
    from fleet_server.retention.prune import prune  # noqa: PLC0415

    config = _config(args)
    engine = open_database(args.db_url or config.database_url)
    repo = Repository(config.repository_path) if args.config or not args.db_url else None
    try:
        report = prune(
            engine,
            config.retention,
            repository=repo,
            dry_run=args.dry_run,
            drift_reference_s=config.drift.reference_hours * 3600.0,
            session_idle_s=float(config.auth.session_idle_s),
        ).to_dict()
    finally:
        engine.dispose()
    print(json.dumps(report, indent=2) if args.json else "\n".join(prune_lines(report)))
    return 1 if report["errors"] else 0


def add_db(commands: Any) -> None:
    """Add ``db stats`` and ``db prune`` to fleetctl's sub-parsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help=f"fleet.toml (default {DEFAULT_CONFIG})")
    common.add_argument("--db-url", metavar="URL", help="the database (default: the config's)")
    common.add_argument("--json", action="store_true", help="print the result as JSON")
    group = commands.add_parser(
        "db",
        help="the fleet database: table sizes, retention",
        description="The fleet database's tables and retention (works on the database directly).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    stats = actions.add_parser(
        "stats",
        parents=[common],
        help="rows, size, oldest and newest, budget and rows past it, per table",
        epilog="example: fleetctl db stats --config fleet.toml",
    )
    stats.set_defaults(func=cmd_db_stats)
    run = actions.add_parser(
        "prune",
        parents=[common],
        help="run one retention pass now",
        epilog="example: fleetctl db prune --dry-run --config fleet.toml",
    )
    run.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")
    run.set_defaults(func=cmd_db_prune)
