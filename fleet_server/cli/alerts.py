"""``fleetctl alerts``: the fleet's alerts over the API (``fleet:read``).

``fleetctl alerts`` lists the alerts firing now (``--all``: resolved ones too;
``--resolved``), by ``--rule`` and ``--site``; ``fleetctl alerts show ID`` one alert with
its webhook deliveries; ``fleetctl alerts dead-letters`` the deliveries that used up
their tries. ``--json`` prints the API's answer. Server and token as for every fleet
command (:mod:`fleet_server.cli.fleet`).
"""

from __future__ import annotations

import argparse
from typing import Any

from fleet_server import timefmt
from fleet_server.cli.fleet import TOKEN_NAME, _common, _emit, _when, client

RULES = (
    "rollout_gate_stopped", "rollout_rolled_back", "rollout_awaiting_approval",
    "device_stuck_reverting", "device_offline", "drift", "review_backlog",
    "station_deadline_missed", "station_overruns", "disk_over_budget", "certificate_expiry",
    "tuf_expiry",
)  # fmt: skip
"""The rules' names (fleet_server.alerts.config.RULE_NAMES: not imported, fleetctl stays
light; a test holds the two equal)."""


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1]).rstrip()
        for r in rows
    ]


def alert_lines(answer: dict[str, Any]) -> list[str]:
    """The table of ``GET /api/v1/alerts``'s answer, with the firing counts."""
    alerts = answer.get("alerts", [])
    firing = answer.get("firing", {})
    total = sum(int(n) for n in firing.values())
    counts = ", ".join(f"{n} {s}" for s, n in sorted(firing.items()) if n)
    head = f"{total} firing" + (f" ({counts})" if counts else "")
    if not alerts:
        return [head, "no alerts for these filters"]
    rows: list[tuple[str, ...]] = [("ID", "STATE", "SEVERITY", "RULE", "FIRED", "RESOLVED",
                                    "SUMMARY")]  # fmt: skip
    rows += [
        (
            str(a["alert_id"]),
            str(a["state"]).upper() if a["state"] == "firing" else str(a["state"]),
            str(a["severity"]),
            str(a["rule"]),
            timefmt.iso(a["fired_at"]),
            timefmt.iso(a["resolved_at"]) if a.get("resolved_at") else "-",
            str(a["summary"]),
        )
        for a in alerts
    ]
    lines = [head, *_table(rows)]
    if answer.get("next_before"):
        lines.append(f"more: --before {answer['next_before']}")
    return lines


def _delivery_rows(deliveries: list[dict[str, Any]], with_alert: bool) -> list[str]:
    rows: list[tuple[str, ...]] = [
        ("DELIVERY", *(("ALERT",) if with_alert else ()), "EVENT", "WEBHOOK", "STATE", "TRIES",
         "LAST", "ERROR"),
    ]  # fmt: skip
    for d in deliveries:
        status = d.get("last_status")
        rows.append(
            (
                str(d["delivery_id"]),
                *((str(d["alert_id"]),) if with_alert else ()),
                str(d["event"]),
                str(d["webhook"]),
                str(d["state"]),
                str(d["attempts"]),
                str(status) if status is not None else "-",
                str(d.get("last_error") or "-"),
            )
        )
    return _table(rows)


def detail_lines(answer: dict[str, Any]) -> list[str]:
    """``GET /api/v1/alerts/{id}``'s answer for a person."""
    a = answer["alert"]
    lines = [
        f"alert {a['alert_id']}: {a['state']} ({a['severity']}) {a['rule']} {a['key']}",
        f"  {a['summary']}",
        f"  fired {_when(a['fired_at'])}"
        + (f", resolved {_when(a['resolved_at'])}" if a.get("resolved_at") else ""),
        "  labels: " + (", ".join(f"{k}={v}" for k, v in sorted(a["labels"].items())) or "-"),
    ]
    if a.get("detail"):
        lines.append("  detail: " + ", ".join(f"{k}={v}" for k, v in sorted(a["detail"].items())))
    deliveries = answer.get("deliveries", [])
    lines += ["", *(_delivery_rows(deliveries, False) if deliveries else ["no webhook deliveries"])]
    return lines


def dead_letter_lines(answer: dict[str, Any]) -> list[str]:
    """``GET /api/v1/alerts/dead-letters``'s answer for a person."""
    dead = answer.get("dead_letters", [])
    if not dead:
        return ["no dead letters"]
    return [*_delivery_rows(dead, True), f"{len(dead)} dead letters"]


def cmd_alerts_list(args: argparse.Namespace) -> int:
    state = "all" if args.all else "resolved" if args.resolved else "firing"
    query = {"state": state, "limit": str(args.limit)}
    for name in ("rule", "site", "before"):
        value = getattr(args, name, None)
        if value:
            query[name] = str(value)
    answer = client(args).call("GET", "/alerts", query=query)
    return _emit(args, answer, alert_lines(answer))


def cmd_alerts_show(args: argparse.Namespace) -> int:
    answer = client(args).call("GET", f"/alerts/{args.alert_id}")
    return _emit(args, answer, detail_lines(answer))


def cmd_alerts_dead_letters(args: argparse.Namespace) -> int:
    answer = client(args).call("GET", "/alerts/dead-letters", query={"limit": str(args.limit)})
    return _emit(args, answer, dead_letter_lines(answer))


def _list_options(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="resolved alerts too")
    which.add_argument("--resolved", action="store_true", help="only resolved alerts")
    p.add_argument(
        "--rule", choices=RULES, metavar="RULE", help="only this rule's: " + ", ".join(RULES)
    )
    p.add_argument("--site", help="only alerts about this site")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.add_argument("--before", type=int, metavar="ID", help="only alerts older than this id")


def add_alerts(commands: Any) -> None:
    """Add ``alerts`` to fleetctl's sub-parsers."""
    p = commands.add_parser(
        "alerts",
        parents=[_common()],
        help="the fleet's alerts: what fires now, what resolved, dead webhook deliveries",
        description="The alerts the fleet server's rules found (docs/alerts.md), newest "
        f"first; operator token from ${TOKEN_NAME} or $CREDENTIALS_DIRECTORY/{TOKEN_NAME}. "
        "Without a subcommand: the alerts firing now.",
        epilog="examples:\n  fleetctl alerts\n  fleetctl alerts list --all --site plant-a\n"
        "  fleetctl alerts show 42\n  fleetctl alerts dead-letters --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _list_options(p)
    p.set_defaults(func=cmd_alerts_list)
    sub = p.add_subparsers(dest="alerts_command", metavar="COMMAND")
    ls = sub.add_parser(
        "list",
        parents=[_common()],
        help="alerts newest first (firing ones unless --all or --resolved)",
        epilog="example: fleetctl alerts list --resolved --rule device_offline",
    )
    _list_options(ls)
    ls.set_defaults(func=cmd_alerts_list)
    show = sub.add_parser(
        "show",
        parents=[_common()],
        help="one alert with its webhook deliveries",
        epilog="example: fleetctl alerts show 42",
    )
    show.add_argument("alert_id", type=int, help="the alert's id")
    show.set_defaults(func=cmd_alerts_show)
    dead = sub.add_parser(
        "dead-letters",
        parents=[_common()],
        help="webhook deliveries that used up their tries",
        epilog="example: fleetctl alerts dead-letters --json",
    )
    dead.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    dead.set_defaults(func=cmd_alerts_dead_letters)
