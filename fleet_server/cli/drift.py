"""``fleetctl drift``: drift per (model version, line) from the fleet server's
``GET /api/v1/drift``, as a table or ``--json`` (the API's answer as it came).

Server and token as for every fleet command (:mod:`fleet_server.cli.fleet`).
"""

from __future__ import annotations

import argparse
from typing import Any

from fleet_server.cli.fleet import DEFAULT_SERVER, SERVER_ENV, client
from fleet_server.cli.fleet import _emit as emit
from fleet_server.cli.fleet import _when as when

HEADER = ("MODEL", "VERSION", "LINE", "STATE", "REF N", "CUR N", "TOP PSI", "TOP JS", "REASON")


def _top(item: dict[str, Any], metric: str) -> str:
    values = [(h.get(metric), name) for name, h in item.get("histograms", {}).items()]
    scored = [(v, name) for v, name in values if isinstance(v, (int, float))]
    if not scored:
        return "-"
    value, name = max(scored)
    return f"{value:.3f} {name}"


def _state(item: dict[str, Any]) -> str:
    if item.get("drifted"):
        return "DRIFTED"
    if item.get("flagged"):
        return "flagged"  # the job's last judged verdict, not judged now
    return "ok" if item.get("judged") else "not judged"


def drift_lines(answer: dict[str, Any]) -> list[str]:
    """The table of ``GET /api/v1/drift``'s answer."""
    items = answer.get("items", [])
    rows = [HEADER]
    rows += [
        (
            str(item["model_name"]),
            str(item["model_version"]),
            str(item["line"]),
            _state(item),
            str(item["reference"]["n"]),
            str(item["current"]["n"]),
            _top(item, "psi"),
            _top(item, "js"),
            str(item["reason"]),
        )
        for item in items
    ]
    if len(rows) == 1:
        return ["no drift buckets stored (yet) for these filters"]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1]
             for r in rows]  # fmt: skip
    lines += [
        f"flagged since {when(item.get('flagged_since'))}: {item['model_name']} "
        f"{item['model_version']} line {item['line']}"
        for item in items
        if item.get("flagged")
    ]
    return [line.rstrip() for line in lines]


def cmd_drift(args: argparse.Namespace) -> int:
    query = {k: v for k, v in (("line", args.line), ("model", args.model),
                               ("version", args.version)) if v}  # fmt: skip
    answer = client(args).call("GET", "/drift", query=query)
    return emit(args, answer, drift_lines(answer))


def add_drift(commands: Any) -> None:
    """Add ``drift`` to fleetctl's sub-parsers."""
    p = commands.add_parser(
        "drift",
        help="drift per model version and line (PSI / JS against the reference window)",
        description="Drift per (model version, line): the current window's histograms "
        "against the reference window's, judged now by the server ([drift] in fleet.toml). "
        "STATE is DRIFTED, ok, not judged (too few decisions), or flagged (the drift job's "
        "last judged verdict).",
        epilog="examples:\n  fleetctl drift\n  fleetctl drift --line 3 --model detector --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--server",
        metavar="URL",
        help=f"fleet server API (default ${SERVER_ENV}, else {DEFAULT_SERVER})",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--line", help="only this line")
    p.add_argument("--model", help="only this model (bundle name)")
    p.add_argument("--version", help="only this version")
    p.set_defaults(func=cmd_drift)
