"""``fleetctl devices logs|restart|reload|diagnostics|actions``: remote actions on a
device through the fleet server's API (docs/device-logs-and-actions.md).

Each asks the server to sign and send a request, then waits for the device's answer
(``--wait``, default 60 s; a progress line on stderr) and prints it: the log lines, the
restart's or reload's result, the path of the diagnostics archive it saved. A device
that does not answer in time (offline) leaves the request waiting, retained until it
expires: the command says so and exits 1; ``fleetctl devices actions DEVICE [REQUEST]``
shows it later. A refusal or failure prints the device's reason and exits 1.
``--follow`` keeps a logs request going: each runs ``follow_s`` (600 s) on the device,
and the next one starts where it ended, until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from fleet_server import timefmt
from fleet_server.cli.fleet import (
    EXIT_USAGE,
    ApiClient,
    ApiError,
    _common,
    _q,
    _seconds,
    client,
)

FINAL = ("ok", "refused", "failed", "superseded", "expired")
POLL_S = 0.5
FOLLOW_S = 600
DEFAULT_WAIT_S = 60.0
EXIT_NOT_DONE = 1


def _ask(
    api: ApiClient, device: str, action: str, params: dict[str, Any], expires: int
) -> dict[str, Any]:
    body = {"action": action, "params": params, "expires_s": expires}
    answer: dict[str, Any] = api.call("POST", f"/devices/{_q(device)}/actions", body)
    return answer


def _show(api: ApiClient, device: str, request_id: str) -> dict[str, Any]:
    answer: dict[str, Any] = api.call("GET", f"/devices/{_q(device)}/actions/{_q(request_id)}")
    return answer


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{text}\033[K", end="", file=sys.stderr, flush=True)


def _wait(api: ApiClient, device: str, request: dict[str, Any], wait_s: float) -> dict[str, Any]:
    """The request once it is final (or as it is when ``wait_s`` ran out)."""
    rid = request["request_id"]
    deadline = time.monotonic() + wait_s
    started = time.monotonic()
    while request["state"] not in FINAL and time.monotonic() < deadline:
        _progress(f"{rid}: {request['state']} ({time.monotonic() - started:.0f} s)")
        time.sleep(POLL_S)
        request = _show(api, device, rid)
    _progress("")
    if sys.stderr.isatty():
        print("\r", end="", file=sys.stderr)
    return request


def _not_done(args: argparse.Namespace, request: dict[str, Any]) -> int:
    """Print why a request ended without ``ok`` (or is still waiting); its exit code."""
    if args.json:
        print(json.dumps(request, indent=2))
        return EXIT_NOT_DONE
    rid, state = request["request_id"], request["state"]
    if state in FINAL:
        print(f"{rid}: {state}: {request['reason']}", file=sys.stderr)
    else:
        print(
            f"{rid}: {state}: {args.device} has not answered in {args.wait:g} s (offline?); "
            f"the request waits for it until {timefmt.iso(request['expires_at'])}: "
            f"fleetctl devices actions {args.device} {rid}",
            file=sys.stderr,
        )
    return EXIT_NOT_DONE


def _logs_params(args: argparse.Namespace, since_s: int, follow_s: int) -> dict[str, Any]:
    params: dict[str, Any] = {"since_s": since_s, "lines": args.lines, "follow_s": follow_s}
    if args.grep:
        params["grep"] = args.grep
    return params


def cmd_devices_logs(args: argparse.Namespace) -> int:
    api = client(args)
    since_s = args.since or 3600
    if not args.follow:
        request = _ask(api, args.device, "logs", _logs_params(args, since_s, 0), args.expires)
        request = _wait(api, args.device, request, args.wait)
        if request["state"] != "ok":
            return _not_done(args, request)
        text, _ = api.raw(
            "GET", f"/devices/{_q(args.device)}/actions/{_q(request['request_id'])}/logs",
            accept="text/plain",
        )  # fmt: skip
        if args.json:
            print(json.dumps({**request, "text": text.decode("utf-8", "replace")}, indent=2))
        else:
            sys.stdout.write(text.decode("utf-8", "replace"))
            if request["detail"].get("truncated"):
                print(f"({request['reason']})", file=sys.stderr)
        return 0
    return _follow(api, args, since_s)


def _follow(api: ApiClient, args: argparse.Namespace, since_s: int) -> int:
    """Logs requests one after the other, each following for :data:`FOLLOW_S`, printing
    lines as they come; the lines the next one sends again are not printed twice."""
    seen: list[str] = []
    try:
        while True:
            asked_at = time.time()
            request = _ask(
                api, args.device, "logs", _logs_params(args, since_s, FOLLOW_S), args.expires
            )
            rid, after = request["request_id"], -1
            path = f"/devices/{_q(args.device)}/actions/{_q(rid)}/logs"
            state = request["state"]
            waited_since = time.monotonic()
            while True:
                text, headers = api.raw(  # no "after" before a first chunk (-1)
                    "GET",
                    path,
                    query={"after": str(after)} if after >= 0 else None,
                    accept="text/plain",
                )
                after = int(headers.get("X-Edgefleet-Next-Seq", after))
                state = headers.get("X-Edgefleet-Action-Status", state)
                for line in text.decode("utf-8", "replace").splitlines():
                    if line not in seen:
                        print(line, flush=True)
                        seen = [*seen[-999:], line]
                if state in FINAL:
                    break
                if state == "pending" and time.monotonic() - waited_since > args.wait:
                    return _not_done(args, _show(api, args.device, rid))
                time.sleep(1.0)
            if state != "ok":
                return _not_done(args, _show(api, args.device, rid))
            since_s = max(1, math.ceil(time.time() - asked_at) - FOLLOW_S + 2)
    except KeyboardInterrupt:
        return 0


def _action(
    args: argparse.Namespace, action: str, params: dict[str, Any]
) -> tuple[ApiClient, dict[str, Any]]:
    api = client(args)
    request = _ask(api, args.device, action, params, args.expires)
    return api, _wait(api, args.device, request, args.wait)


def cmd_devices_restart(args: argparse.Namespace) -> int:
    _, request = _action(args, "restart", {})
    if request["state"] != "ok":
        return _not_done(args, request)
    print(json.dumps(request, indent=2) if args.json else f"{args.device}: {request['reason']}")
    return 0


def cmd_devices_reload(args: argparse.Namespace) -> int:
    _, request = _action(args, "reload", {})
    if request["state"] != "ok":
        return _not_done(args, request)
    print(json.dumps(request, indent=2) if args.json else f"{args.device}: {request['reason']}")
    return 0


def cmd_devices_diagnostics(args: argparse.Namespace) -> int:
    api, request = _action(args, "diagnostics", {"lines": args.lines})
    if request["state"] != "ok":
        return _not_done(args, request)
    rid = request["request_id"]
    data, headers = api.raw(
        "GET", f"/devices/{_q(args.device)}/actions/{_q(rid)}/archive", accept="application/gzip"
    )
    disposition = headers.get("Content-Disposition", "")
    name = disposition.partition('filename="')[2].rstrip('"') or f"diagnostics-{args.device}.tar.gz"
    out = Path(args.out) if args.out else Path(name)
    try:
        out.write_bytes(data)
    except OSError as exc:
        raise ApiError(0, f"--out {out}: {exc.strerror or exc}", exit_code=EXIT_USAGE) from None
    if args.json:
        print(json.dumps({**request, "saved_to": str(out)}, indent=2))
    else:
        files = ", ".join(sorted(request["detail"].get("files") or {}))
        print(f"{out} ({len(data)} bytes): {files}")
    return 0


def cmd_devices_actions(args: argparse.Namespace) -> int:
    api = client(args)
    if args.request:
        r = _show(api, args.device, args.request)
        lines = [f"{k:<13} {v}" for k, v in r.items() if k not in ("detail", "params")]
        lines += [
            f"{'params':<13} {json.dumps(r['params'])}",
            f"{'detail':<13} {json.dumps(r['detail'])}",
        ]
        print(json.dumps(r, indent=2) if args.json else "\n".join(lines))
        return 0
    rows = api.call("GET", f"/devices/{_q(args.device)}/actions", query={"limit": str(args.limit)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'REQUEST':<25} {'ACTION':<12} {'STATE':<11} {'ASKED':<21} {'BY':<16} REASON")
    for r in rows:
        asked = timefmt.iso(r["requested_at"])
        print(
            f"{r['request_id']:<25} {r['action']:<12} {r['state']:<11} {asked:<21} "
            f"{r['requested_by'][:16]:<16} {r['reason'][:80]}"
        )
    print(f"{len(rows)} request(s)")
    return 0


def add_action_commands(devices: Any) -> None:
    """Add ``logs``, ``restart``, ``reload``, ``diagnostics`` and ``actions`` to
    ``fleetctl devices`` (its sub-parsers, as :func:`add_fleet_commands` returns them)."""
    common = _common()
    asking = argparse.ArgumentParser(add_help=False)
    asking.add_argument("device", help="device id")
    asking.add_argument(
        "--wait", type=float, default=DEFAULT_WAIT_S, metavar="SECONDS",
        help=f"wait this long for the device's answer (default {DEFAULT_WAIT_S:g})",
    )  # fmt: skip
    asking.add_argument(
        "--expires", type=_seconds, default=3600, metavar="DURATION",
        help="the device may carry it out until then, e.g. 1h (default; at most 7d)",
    )  # fmt: skip

    def add(name: str, help_text: str, example: str) -> argparse.ArgumentParser:
        return devices.add_parser(  # type: ignore[no-any-return]
            name, parents=[common, asking], help=help_text, epilog=example,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip

    logs = add(
        "logs",
        "the device's log: its newest lines (secrets taken out), from a time, holding a text",
        "examples:\n  fleetctl devices logs cam-1 --since 1h --grep camera\n"
        "  fleetctl devices logs cam-1 --follow",
    )
    logs.add_argument(
        "--since", type=_seconds, metavar="DURATION", help="from this long ago (default 1h)"
    )
    logs.add_argument(
        "--grep", metavar="TEXT", help="only lines holding TEXT (any case unless it has a capital)"
    )
    logs.add_argument("--lines", type=int, default=500, help="the newest N lines (default 500)")
    logs.add_argument(
        "--follow", action="store_true", help="then print new lines as they come, until Ctrl-C"
    )
    logs.set_defaults(func=cmd_devices_logs)
    restart = add(
        "restart",
        "restart the agent's processes (under systemd, the unit)",
        "example: fleetctl devices restart cam-1",
    )
    restart.set_defaults(func=cmd_devices_restart)
    reload = add(
        "reload",
        "re-read the configuration file (checked first: a broken one changes nothing)",
        "example: fleetctl devices reload cam-1",
    )
    reload.set_defaults(func=cmd_devices_reload)
    diag = add(
        "diagnostics",
        "collect a diagnostics archive (versions, config, health, logs, disk, cameras) and save it",
        "example: fleetctl devices diagnostics cam-1 --out cam-1.tar.gz",
    )
    diag.add_argument("--out", metavar="FILE", help="where to save it (default: its name, here)")
    diag.add_argument("--lines", type=int, default=200, help="log lines in it (default 200)")
    diag.set_defaults(func=cmd_devices_diagnostics)
    listing = devices.add_parser(
        "actions",
        parents=[common],
        help="a device's remote actions, newest first, or one",
        epilog="examples:\n  fleetctl devices actions cam-1\n"
        "  fleetctl devices actions cam-1 act-5f0c2e9a41d7b3860e12",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.add_argument("device", help="device id")
    listing.add_argument("request", nargs="?", help="one request's id")
    listing.add_argument("--limit", type=int, default=20, help="newest N (default 20)")
    listing.set_defaults(func=cmd_devices_actions)
