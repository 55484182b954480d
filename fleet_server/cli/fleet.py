"""``fleetctl devices|telemetry|rollouts``: the fleet server's operator API over HTTP.

The server is ``--server`` (default ``$EDGEFLEET_SERVER``, else http://127.0.0.1:8080);
the operator token is ``EDGEFLEET_API_TOKEN`` (a file in ``$CREDENTIALS_DIRECTORY`` first,
then the environment), never an argument. Errors are :class:`ApiError` (a
:class:`FleetError`): fleetctl prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from agent.kernel.secrets import read_secret
from fleet_server import timefmt
from fleet_server.cli.db import add_db
from fleet_server.errors import FleetError

DEFAULT_SERVER = "http://127.0.0.1:8080"
SERVER_ENV = "EDGEFLEET_SERVER"
TOKEN_NAME = "EDGEFLEET_API_TOKEN"  # noqa: S105 (the name of a secret, not one)
TIMEOUT_S = 30.0
MAX_RESPONSE = 16 * 1024 * 1024
ACTIONS = ("pause", "resume", "approve", "cancel", "rollback")


EXIT_USAGE = 2
"""A command line fleetctl can't take (argparse's own code too)."""
EXIT_UNREACHABLE = 3
EXIT_UNAUTHORIZED = 4
EXIT_NOT_FOUND = 5
EXIT_CONFLICT = 6
EXIT_REFUSED = 7
EXIT_SERVER = 8
EXIT_CODES = (
    "exit codes: 0 done; 1 another answer; 2 usage, or the command's own error (a file,\n"
    "  key or database it can't use);\n"
    "  3 the server can't be reached; 4 not signed in or not allowed (401, 403: set\n"
    f"  ${TOKEN_NAME}); 5 not found (404); 6 conflict (409: the state does not allow it);\n"
    "  7 refused as asked (400, 413, 415, 422); 8 the server failed (5xx, or a bad answer)"
)


class ApiError(FleetError):
    """The fleet server can't be reached or refused a request.

    Attributes:
        status: the HTTP status (0 when there was no answer).
        detail: the server's reason, or what failed.
        exit_code: fleetctl's exit status for it (:data:`EXIT_CODES`).
    """

    def __init__(self, status: int, detail: str, *, exit_code: int | None = None) -> None:
        self.status = status
        self.detail = detail
        self.exit_code = exit_code if exit_code is not None else _exit_code(status)
        if status == 401:
            detail += f" (set ${TOKEN_NAME}, or the file {TOKEN_NAME} in $CREDENTIALS_DIRECTORY)"
        super().__init__(f"fleet server: {status} {detail}" if status else detail)


_BY_STATUS = {0: EXIT_UNREACHABLE, 401: EXIT_UNAUTHORIZED, 403: EXIT_UNAUTHORIZED,
              404: EXIT_NOT_FOUND, 409: EXIT_CONFLICT}  # fmt: skip


def _exit_code(status: int) -> int:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status >= 500:
        return EXIT_SERVER
    return EXIT_REFUSED if 400 <= status < 500 else 1


class ApiClient:
    """JSON over HTTP(S) to the fleet server's ``/api/v1``; every call has a timeout."""

    def __init__(self, server: str, token: str | None, timeout_s: float = TIMEOUT_S) -> None:
        parsed = urllib.parse.urlsplit(server)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ApiError(
                0, f"--server {server!r} is not an http:// or https:// URL", exit_code=EXIT_USAGE
            )
        self.base = server.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def call(
        self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None
    ) -> Any:
        """The decoded JSON answer of ``method /api/v1<path>``.

        Raises:
            ApiError: no answer, an error status (with the server's detail), or not JSON.
        """
        raw, _ = self.raw(method, path, body, query)
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(0, f"{path}: the answer is not JSON", exit_code=EXIT_SERVER) from None

    def raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        accept: str = "application/json",
    ) -> tuple[bytes, dict[str, str]]:
        """The body and headers of ``method /api/v1<path>`` (a log's text, an archive).

        Raises:
            ApiError: no answer, an error status (with the server's detail), or too large.
        """
        url = f"{self.base}/api/v1{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Accept": accept}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                raw = resp.read(MAX_RESPONSE + 1)
                answer_headers = dict(resp.headers)
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, _detail(exc)) from None
        except urllib.error.URLError as exc:
            raise ApiError(0, f"cannot reach {self.base}: {exc.reason}") from None
        except TimeoutError:
            raise ApiError(0, f"{self.base}: no answer within {self.timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError(0, f"{self.base}: {type(exc).__name__}: {exc}") from None
        if len(raw) > MAX_RESPONSE:
            raise ApiError(0, f"{url}: answer over {MAX_RESPONSE} bytes", exit_code=EXIT_SERVER)
        return raw, answer_headers


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(exc.read(64 * 1024)).get("detail")
    except (ValueError, AttributeError, OSError):
        detail = None
    return str(detail) if detail else str(exc.reason)


def client(args: argparse.Namespace) -> ApiClient:
    """The client for ``--server`` and the operator token."""
    server = args.server or os.environ.get(SERVER_ENV) or DEFAULT_SERVER
    return ApiClient(server, read_secret(TOKEN_NAME))


def _when(ts: object) -> str:
    """``2026-11-24T05:03:41Z (7m ago)``; ``invalid time (...)`` for a device time no
    calendar holds (fleet_server.timefmt)."""
    if ts is None:
        return "never"
    value = timefmt.epoch(ts)
    if value is None:
        return timefmt.invalid(ts)
    return f"{timefmt.iso(ts)} ({_span(time.time() - value)} ago)"


def _span(seconds: float) -> str:
    """``42s``, ``7m``, ``3h``, ``2d``."""
    age = max(0.0, seconds)
    for limit, unit, size in ((120, "s", 1), (7200, "m", 60), (172_800, "h", 3600)):
        if age < limit:
            return f"{age / size:.0f}{unit}"
    return f"{age / 86_400:.0f}d"


def _expiry(ts: float) -> str:
    """A pending device's token: ``token expires 2026-11-24T05:03:41Z (in 23h)``, or
    ``token expired 2026-11-24T05:03:41Z (2h ago): make a new one ...``."""
    left = ts - time.time()
    if left <= 0:
        return f"token expired {_when(ts)}: make a new one with fleetctl devices enroll"
    return f"token expires {timefmt.iso(ts)} (in {_span(left)})"


def _bundle(d: dict[str, Any], slot: str) -> str:
    """A device's bundle in a slot as people name it: ``detector 1.4.0 (release 3)``;
    the release alone when the device did not report the version."""
    name, release = d.get(f"{slot}_bundle"), d.get(f"{slot}_release")
    if name is None:
        return "-"
    version = d.get(f"{slot}_version")
    return f"{name} {version} (release {release})" if version else f"{name} release {release}"


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


def _emit(args: argparse.Namespace, data: Any, lines: list[str]) -> int:
    print(json.dumps(data, indent=2) if args.json else "\n".join(lines))
    return 0


def _selector(text: str) -> dict[str, str]:
    from fleet_server.rollout.spec import parse_selector  # noqa: PLC0415 - only when given

    try:
        return parse_selector(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def _seconds(text: str) -> int:
    from fleet_server.rollout.spec import parse_duration  # noqa: PLC0415 - only when given

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- devices ------------------------------------------------------------------------


def cmd_devices_enroll(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"labels": args.labels or {}, "profile": args.profile}
    if args.ttl:
        body["ttl_s"] = args.ttl
    t = client(args).call("POST", f"/devices/{_q(args.device)}/tokens", body)
    lines = [
        f"token    {t['token']}",
        f"device   {t['device_id']}",
        f"labels   {_labels(t['labels'])}",
        f"profile  {t['profile'] or '-'}",
        f"expires  {timefmt.iso(t['expires_at'])}",
        "shown once: the server keeps only its hash. On the device: edge-agent enroll",
    ]
    return _emit(args, t, lines)


def _pending_lines(d: dict[str, Any]) -> list[str]:
    return [
        f"device    {d['device_id']}  PENDING",
        "state     enrolled, never connected (its token is unused: no certificate yet)",
        f"token     {_expiry(d['token_expires_at'])}",
        f"profile   {d['profile'] or '-'}",
        f"labels    {_labels(d['labels'])}",
        f"enrolled  {_when(d['enrolled_at'])} (token made)",
    ]


def _device_lines(d: dict[str, Any]) -> list[str]:
    if d.get("pending"):
        return _pending_lines(d)
    health = d.get("health") or {}
    lines = [
        f"device    {d['device_id']}{'  REVOKED' if d.get('revoked') else ''}",
        f"online    {'yes' if d['online'] else 'no'}",
        f"seen      {_when(d['last_seen'])}",
        f"agent     {d['agent_version'] or '-'}",
        f"profile   {d['profile'] or '-'}",
        f"labels    {_labels(d['labels'])}",
        f"active    {_bundle(d, 'active')}",
        f"previous  {_bundle(d, 'previous')}",
        f"enrolled  {_when(d['enrolled_at'])}  certificate {d['cert_serial'] or '-'}",
    ]
    if health:
        lines += _health_lines(health)
    return lines


def _number(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def _health_lines(h: dict[str, Any]) -> list[str]:
    """A device's latest health report as lines people read (the report's JSON is in
    ``--json``)."""
    out = [f"health    reported {_when(h.get('ts'))}"]
    per = (("fps", "fps", "{}"), ("queue_depth", "queue", "{}"), ("drops", "drops", "{}"),
           ("temperature_c", "temp", "{} °C"))  # fmt: skip
    for key, title, unit in per:
        items = h.get(key) or {}
        if items:
            shown = ", ".join(f"{k} {unit.format(_number(v))}" for k, v in sorted(items.items()))
            out.append(f"  {title:<8}{shown}")
    for model, p in sorted((h.get("latency_ms") or {}).items()):
        if isinstance(p, dict):
            out.append(
                f"  {'latency':<8}{model}: p50 {_number(p.get('p50'))} / p95 "
                f"{_number(p.get('p95'))} / p99 {_number(p.get('p99'))} ms "
                f"({p.get('count', 0)} inferences)"
            )
    machine = []
    if h.get("cpu_percent") is not None:
        machine.append(f"CPU {_number(h['cpu_percent'])} %")
    if h.get("memory_mb") is not None:
        machine.append(f"memory {_number(h['memory_mb'])} MB")
    if h.get("disk_free_mb") is not None:
        machine.append(f"disk free {_number(h['disk_free_mb'])} MB")
    if machine:
        out.append(f"  {'device':<8}" + ", ".join(machine))
    for name, c in sorted((h.get("stations") or {}).items()):
        if isinstance(c, dict):
            out.append(
                f"  {'station':<8}{name}: {c.get('triggers', 0)} triggers, "
                f"{c.get('deadline_missed', 0)} deadlines missed, {c.get('overruns', 0)} overruns"
            )
    return out


def _seen(d: dict[str, Any]) -> str:
    return "never connected (pending)" if d.get("pending") else _when(d["last_seen"])


def _flag(d: dict[str, Any]) -> str:
    if d.get("pending"):
        return f" ({_expiry(d['token_expires_at'])})"
    return " (revoked)" if d.get("revoked") else ""


def cmd_devices_list(args: argparse.Namespace) -> int:
    query = {"selector": _labels(args.select)} if args.select else None
    devices = client(args).call("GET", "/devices", query=query)
    lines = [f"{'DEVICE':<24} {'ONLINE':<6} {'LAST SEEN':<34} {'AGENT':<10} {'BUNDLE':<32} LABELS"]
    lines += [
        f"{d['device_id']:<24} {'yes' if d['online'] else 'no':<6} {_seen(d):<34} "
        f"{d['agent_version'] or '-':<10} {_bundle(d, 'active'):<32} "
        f"{_labels(d['labels'])}{_flag(d)}"
        for d in devices
    ]
    pending = sum(1 for d in devices if d.get("pending"))
    lines.append(f"{len(devices)} device(s)" + (f", {pending} pending" if pending else ""))
    return _emit(args, devices, lines)


def cmd_devices_show(args: argparse.Namespace) -> int:
    d = client(args).call("GET", f"/devices/{_q(args.device)}")
    return _emit(args, d, _device_lines(d))


def cmd_devices_revoke(args: argparse.Namespace) -> int:
    r = client(args).call("POST", f"/devices/{_q(args.device)}/revoke")
    serials = ", ".join(r["revoked_serials"]) or "none newly"
    reload = "broker reloaded its CRL" if r["broker_reloaded"] else "no managed broker reloaded"
    return _emit(args, r, [f"revoked {r['device_id']}: certificate(s) {serials}; {reload}"])


def cmd_telemetry(args: argparse.Namespace) -> int:
    t = client(args).call(
        "GET", f"/devices/{_q(args.device)}/telemetry", query={"limit": str(args.limit)}
    )
    lines = [
        f"device    {t['device_id']}  online {'yes' if t['online'] else 'no'}  "
        f"seen {_when(t['last_seen'])}  agent {t['agent_version'] or '-'}",
        "health    " + (json.dumps(t["health"], sort_keys=True) if t["health"] else "-"),
        f"heartbeats ({len(t['heartbeats'])}, newest first):",
        *(f"  {_when(h['ts'])}  {h['record_id']}" for h in t["heartbeats"]),
        f"samples ({len(t['samples'])}, newest first):",
        *(f"  {_when(s['ts'])}  {json.dumps(s['payload'], sort_keys=True)}" for s in t["samples"]),
    ]
    return _emit(args, t, lines)


# -- rollouts -----------------------------------------------------------------------


def cmd_rollouts_create(args: argparse.Namespace) -> int:
    spec: dict[str, Any] = {
        "bundle": args.bundle,
        "selector": args.select,
        "waves": args.waves,
        "soak_s": args.soak,
    }
    policy: dict[str, Any] = {}
    if args.policy:
        try:
            policy = json.loads(Path(args.policy).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ApiError(0, f"--policy {args.policy}: {exc}", exit_code=EXIT_USAGE) from None
    if args.approval:
        policy["approval_between_waves"] = True
    shadow = {"shadow_s": args.shadow, "shadow_min": args.shadow_min,
              "min_agreement": args.min_agreement}  # fmt: skip
    spec |= {k: v for k, v in shadow.items() if v is not None}
    accuracy = {"min_accuracy": args.min_accuracy, "min_labels": args.min_labels,
                "accuracy_drop": args.accuracy_drop}  # fmt: skip
    gates = {k: v for k, v in accuracy.items() if v is not None}
    if gates:
        policy["gates"] = {**policy.get("gates", {}), **gates}
    if policy:
        spec["policy"] = policy
    r = client(args).call("POST", "/rollouts", spec)
    return _emit(args, r, [f"created rollout {r['rollout_id']}", *_rollout_lines(r)])


def _done(r: dict[str, Any]) -> str:
    counts = r.get("counts") or {}
    total = r.get("total", sum(counts.values()))
    return f"{counts.get('done', 0)}/{total}"


def _rollout_lines(r: dict[str, Any]) -> list[str]:
    counts = r.get("counts") or {}
    lines = [
        f"rollout   {r['rollout_id']}  {r['bundle']}@{r['version']} (release {r.get('release')})",
        f"phase     {r['phase']}  wave {r.get('wave', 0)}/{r.get('waves', 0)}"
        + (f"  ({r['reason']})" if r.get("reason") else ""),
        f"selector  {_labels(r.get('selector') or {}) if r.get('selector') else '*'}",
        f"devices   {_done(r)} done; "
        + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"),
    ]
    gate = r.get("gate") or {}
    if "shadow_n" in gate:
        lines.append(
            f"shadow    agreement {gate.get('shadow_agreement')} (Wilson "
            f"{gate.get('shadow_lower')}..{gate.get('shadow_upper')}, n={gate['shadow_n']}), "
            f"p99 {gate.get('shadow_p99_ms')} ms"
        )
    if "accuracy_status" in gate:
        lines.append(
            f"accuracy  {gate.get('accuracy', '-')} (Wilson {gate.get('accuracy_lower', '-')}.."
            f"{gate.get('accuracy_upper', '-')}, {gate.get('accuracy_labels', 0)} labels): "
            f"{gate['accuracy_status']}"
        )
    lines += [f"stuck     {s['device_id']}: {s['why']}" for s in r.get("stuck") or []]
    devices = r.get("devices") or []
    if devices:
        lines.append(f"  {'DEVICE':<24} {'WAVE':<5} STATUS")
        lines += [
            f"  {d['device_id']:<24} {d.get('wave') or '-'!s:<5} {d['status']}"
            + (f"  ({d['why']})" if d.get("why") else "")
            for d in devices
        ]
    return lines


TERMINAL_PHASES = frozenset({"completed", "completed_partial", "cancelled", "rolled_back"})
"""Phases a rollout does not leave on its own (``--watch`` stops there)."""


def cmd_rollouts_status(args: argparse.Namespace) -> int:
    api = client(args)
    if args.rollout:
        while True:
            r = api.call("GET", f"/rollouts/{_q(args.rollout)}")
            _emit(args, r, _rollout_lines(r))
            if not args.watch or r["phase"] in TERMINAL_PHASES:
                return 0
            sys.stdout.flush()
            time.sleep(args.watch)
            print()
    rollouts = api.call("GET", "/rollouts")
    lines = [f"{'ROLLOUT':<28} {'BUNDLE':<28} {'PHASE':<18} {'WAVE':<6} DONE"]
    lines += [
        f"{r['rollout_id']:<28} {r['bundle'] + '@' + r['version']:<28} {r['phase']:<18} "
        f"{r.get('wave', 0)}/{r.get('waves', 0):<4} {_done(r)}"
        for r in rollouts
    ]
    lines.append(f"{len(rollouts)} rollout(s)")
    return _emit(args, rollouts, lines)


def cmd_rollouts_act(args: argparse.Namespace) -> int:
    path = f"/rollouts/{_q(args.rollout)}/{args.action}"
    r = client(args).call("POST", path, {"reason": args.reason})
    return _emit(args, r, [f"{args.action}: rollout {r['rollout_id']} is {r['phase']}"])


def cmd_rollouts_resolve(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"reason": args.reason}
    if args.assign is not None:
        body |= {"how": "assign", "release": args.assign}
    else:
        body["how"] = "retry" if args.retry else "accept"
    path = f"/rollouts/{_q(args.rollout)}/devices/{_q(args.device)}/resolve"
    r = client(args).call("POST", path, body)
    (d,) = [x for x in r.get("devices") or [] if x["device_id"] == args.device] or [{}]
    status = d.get("status", "?") + (f" ({d['why']})" if d.get("why") else "")
    return _emit(
        args,
        r,
        [f"{body['how']}: {args.device} is {status}; rollout {r['rollout_id']} is {r['phase']}"],
    )


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


# -- parsers ------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        metavar="URL",
        help=f"fleet server API (default ${SERVER_ENV}, else {DEFAULT_SERVER})",
    )
    common.add_argument("--json", action="store_true", help="print the result as JSON")
    return common


def _group(commands: Any, name: str, help_text: str, example: str) -> Any:
    group = commands.add_parser(
        name,
        help=help_text,
        description=f"{help_text[0].upper()}{help_text[1:]}; operator token from "
        f"${TOKEN_NAME} or $CREDENTIALS_DIRECTORY/{TOKEN_NAME}.",
        epilog=example,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return group.add_subparsers(dest="action", required=True, metavar="ACTION")


def add_fleet_commands(commands: Any) -> Any:
    """Add ``devices``, ``telemetry``, ``rollouts`` and ``db`` (:mod:`fleet_server.cli.db`,
    on the database directly) to fleetctl's sub-parsers; returns the ``devices`` group's
    sub-parsers (:mod:`fleet_server.cli.actions` adds the remote actions there)."""
    common = _common()
    devices = _group(
        commands,
        "devices",
        "devices of the fleet: enroll, list, show, revoke; logs, restart, reload, diagnostics",
        "examples:\n  fleetctl devices enroll cam-07 --labels line=3 --profile x86-gateway\n"
        "  fleetctl devices list --select line=3\n"
        "  fleetctl devices logs cam-07 --since 1h --grep camera\n"
        "  fleetctl devices diagnostics cam-07",
    )
    enroll = devices.add_parser("enroll", parents=[common], help="issue a one-time token")
    enroll.add_argument("device", help="device id (the CN of its certificate)")
    enroll.add_argument("--labels", type=_selector, metavar="K=V,...", help="e.g. line=3,cell=a")
    enroll.add_argument("--profile", default="", help="hardware profile, e.g. jetson-orin")
    enroll.add_argument("--ttl", type=_seconds, help="token lifetime, e.g. 24h (default server's)")
    enroll.set_defaults(func=cmd_devices_enroll)
    listing = devices.add_parser(
        "list", parents=[common], help="list devices (pending ones too: enrolled, never connected)"
    )
    listing.add_argument("--select", type=_selector, metavar="K=V,...", help="e.g. line=3")
    listing.set_defaults(func=cmd_devices_list)
    for name, func, text in (
        ("show", cmd_devices_show, "one device's state, bundles and health"),
        ("revoke", cmd_devices_revoke, "revoke the device's certificates"),
    ):
        p = devices.add_parser(name, parents=[common], help=text)
        p.add_argument("device", help="device id")
        p.set_defaults(func=func)

    tele = commands.add_parser(
        "telemetry",
        parents=[common],
        help="a device's latest health and recent heartbeats",
        epilog="example: fleetctl telemetry cam-07 --limit 5",
    )
    tele.add_argument("device", help="device id")
    tele.add_argument("--limit", type=int, default=10, help="records of each kind (default 10)")
    tele.set_defaults(func=cmd_telemetry)

    rollouts = _group(
        commands,
        "rollouts",
        "staged rollouts: create, list, status, pause, resume, approve, cancel, rollback, resolve",
        "examples:\n  fleetctl rollouts create --bundle detector@1.4.0 "
        "--select 'line=3,profile=jetson-orin' --waves 1,10%,50%,100% --soak 10m\n"
        "  fleetctl rollouts create --bundle detector@1.4.0 --select line=3 --shadow 2h "
        "--shadow-min 500 --min-agreement 0.97 --min-accuracy 0.9 --min-labels 100\n"
        "  fleetctl rollouts list\n  fleetctl rollouts status ID --watch 5\n"
        "  fleetctl rollouts pause ID --reason 'line stop'\n"
        "  fleetctl rollouts resolve ID cam-07 --assign 3 --reason 'known good'",
    )
    create = rollouts.add_parser("create", parents=[common], help="start a rollout")
    create.add_argument("--bundle", required=True, metavar="NAME@VERSION")
    create.add_argument("--select", required=True, metavar="K=V,...", help="or '*' for all")
    create.add_argument("--waves", default="1,10%,50%,100%", help="default 1,10%%,50%%,100%%")
    create.add_argument("--soak", default="10m", help="watch each wave this long (default 10m)")
    create.add_argument("--approval", action="store_true", help="wait for approve between waves")
    create.add_argument("--policy", metavar="FILE", help="JSON rollout policy (docs/rollouts.md)")
    create.add_argument(
        "--shadow", metavar="DURATION", help="run each wave as shadow first, at most this long"
    )
    create.add_argument("--shadow-min", type=int, help="sampled frames before judging (500)")
    create.add_argument("--min-agreement", type=float, help="Wilson lower bound needed (0.97)")
    create.add_argument("--min-accuracy", type=float, help="labelled accuracy lower bound")
    create.add_argument("--min-labels", type=int, help="review labels before judging (100)")
    create.add_argument("--accuracy-drop", type=float, help="max significant accuracy drop")
    create.set_defaults(func=cmd_rollouts_create)
    status = rollouts.add_parser("status", parents=[common], help="all rollouts, or one")
    status.add_argument("rollout", nargs="?", help="rollout id")
    status.add_argument(
        "--watch",
        type=_positive,
        metavar="SECONDS",
        help="print the rollout again every SECONDS until it ends (completed, cancelled, "
        "rolled back); Ctrl-C stops",
    )
    status.set_defaults(func=cmd_rollouts_status)
    listing = rollouts.add_parser("list", parents=[common], help="every rollout, a line each")
    listing.set_defaults(func=cmd_rollouts_status, rollout=None, watch=None)
    for action in ACTIONS:
        p = rollouts.add_parser(action, parents=[common], help=f"{action} a rollout")
        p.add_argument("rollout", help="rollout id")
        p.add_argument("--reason", default="", help="why (kept in the rollout's history)")
        p.set_defaults(func=cmd_rollouts_act, action=action)
    resolve = rollouts.add_parser(
        "resolve",
        parents=[common],
        help="resolve a stuck device of a rollout that is rolling back",
        epilog="examples:\n  fleetctl rollouts resolve ID cam-07 --retry\n"
        "  fleetctl rollouts resolve ID cam-07 --assign 3\n"
        "  fleetctl rollouts resolve ID cam-07 --accept --reason 'checked on site'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    resolve.add_argument("rollout", help="rollout id")
    resolve.add_argument("device", help="the stuck (or still reverting) device")
    how = resolve.add_mutually_exclusive_group(required=True)
    how.add_argument("--retry", action="store_true", help="send its revert again")
    how.add_argument(
        "--assign", type=int, metavar="RELEASE", help="send it to this release of the bundle"
    )
    how.add_argument("--accept", action="store_true", help="accept what it runs as it is")
    resolve.add_argument("--reason", default="", help="why (kept in the rollout's events)")
    resolve.set_defaults(func=cmd_rollouts_resolve)
    add_db(commands)
    return devices
