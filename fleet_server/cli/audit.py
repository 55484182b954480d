"""``fleetctl audit``: the audit trail over the API (``audit:read``), newest first.

Filters: ``--actor``, ``--action`` and ``--target`` (a trailing ``*`` matches a prefix:
``--action 'rollout.*'``), ``--result``, ``--since`` (a span back from now: ``1h``, ``7d``),
``--limit``; ``--all`` follows the pages to the end. ``--json`` prints the entries.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from fleet_server import timefmt
from fleet_server.cli.fleet import TOKEN_NAME, _common, _seconds, client

RESULTS = ("ok", "refused", "failed")
PAGE = 1000
MAX_ALL = 100_000
"""``--all`` stops after this many entries (say a narrower filter)."""


def _query(args: argparse.Namespace) -> dict[str, str]:
    query: dict[str, str] = {}
    for name in ("actor", "action", "target", "result"):
        value = getattr(args, name)
        if value:
            query[name] = value
    if args.since:
        query["since"] = f"{time.time() - args.since:.3f}"
    return query


def _line(e: dict[str, Any]) -> str:
    detail = dict(e.get("detail") or {})
    why = detail.get("reason")
    status = detail.get("status")
    result = e["result"] if e["result"] == "ok" else f"{e['result'].upper()} {status or ''}".strip()
    text = (
        f"{timefmt.iso(e['ts'])}  {e['actor']:<20} {e['role'] or '-':<12} {e['source']:<15} "
        f"{e['action']:<22} {e['target'] or '-':<28} {result}"
    )
    return f"{text}  ({why})" if why else text


def cmd_audit(args: argparse.Namespace) -> int:
    api = client(args)
    query = _query(args)
    entries: list[dict[str, Any]] = []
    before: int | None = None
    while True:
        page = dict(query, limit=str(PAGE if args.all else args.limit))
        if before is not None:
            page["before"] = str(before)
        answer = api.call("GET", "/audit", query=page)
        entries += answer["entries"]
        before = answer.get("next_before")
        if not args.all or before is None or len(entries) >= MAX_ALL:
            break
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    header = (
        f"{'TIME':<20}  {'ACTOR':<20} {'ROLE':<12} {'SOURCE':<15} {'ACTION':<22} "
        f"{'TARGET':<28} RESULT"
    )
    print("\n".join([header, *(_line(e) for e in entries), f"{len(entries)} entries"]))
    return 0


def add_audit(commands: Any) -> None:
    """Add ``audit`` to fleetctl's sub-parsers."""
    p = commands.add_parser(
        "audit",
        parents=[_common()],
        help="the audit trail: who changed what, when, from where",
        description="The audit trail, newest first (the audit:read permission); operator "
        f"token from ${TOKEN_NAME} or $CREDENTIALS_DIRECTORY/{TOKEN_NAME}.",
        epilog="examples:\n  fleetctl audit --since 1d\n  fleetctl audit --action 'rollout.*' "
        "--result refused\n  fleetctl audit --actor olga --target device:cam-07 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--actor", help="only this actor (a user name, @operator-token, ...)")
    p.add_argument("--action", help="only this action; a trailing * matches a prefix")
    p.add_argument("--target", help="only this target (device:cam-07); a trailing * too")
    p.add_argument("--result", choices=RESULTS, help="only this result")
    p.add_argument("--since", type=_seconds, metavar="SPAN", help="only the last SPAN (1h, 7d)")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.add_argument("--all", action="store_true", help="every matching entry, page by page")
    p.set_defaults(func=cmd_audit)
