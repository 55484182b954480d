"""``edge-agent``: run the device agent, check its config, read its decision log, bench it.

The library raises; this module turns its errors into one line and exit code 2.
"""

from __future__ import annotations

import argparse
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

from agent.discovery.cli import add_parser as add_cameras_parser
from agent.echo import echo_decision
from agent.errors import AgentError
from agent.installer.cli import add_parsers as add_installer_parsers
from agent.kernel import secrets
from agent.kernel.cliversion import add_version
from agent.kernel.errors import EdgefleetError
from agent.kernel.sdnotify import Notifier, forget
from agent.kernel.signals import SignalRelay
from agent.setup.cli import add_parser as add_setup_parser
from agent.watchdog import HotPathWatch

if TYPE_CHECKING:
    from agent.config import AgentConfig

log = logging.getLogger(__name__)

EXIT_ERROR = 2
DEFAULT_CONFIG = "/etc/edgefleet/agent.toml"

EPILOG_RUN = """example:
  edge-agent run --config agent.toml --echo
  edge-agent check-config --config agent.toml
  edge-agent decisions --config agent.toml --since 1h --outcome reject --format csv
  edge-agent decisions show 0192f3c4-... --config agent.toml
  edge-agent bench --bundle bundles/cls --source line.avi --duration 10 --json bench.json
  edge-agent install /media/usb/edgefleet --config agent.toml
  edge-agent bundles --config agent.toml
  edge-agent rollback text-cls --config agent.toml
  edge-agent enroll http://127.0.0.1:8080 --token - --config agent.toml
  edge-agent outbox --config agent.toml
  edge-agent setup --camera /dev/video0 --bundle /media/usb/cls
"""


def _config(args: argparse.Namespace) -> AgentConfig:
    from agent.config import load_config  # noqa: PLC0415 - edge-agent starts light

    return load_config(Path(args.config))


def _reported_errors() -> tuple[type[Exception], ...]:
    """The errors ``main`` reports in one line: the library's, and the runtime's when a
    command imported the runtime (one that did not can't have raised its errors, and
    importing them for every command would cost each start NumPy and OpenCV)."""
    runtime_errors = sys.modules.get("runtime.errors")
    if runtime_errors is None:
        return (EdgefleetError,)
    return (EdgefleetError, runtime_errors.EdgeRuntimeError)


def cmd_run(args: argparse.Namespace) -> int:
    from agent.remote import logfile  # noqa: PLC0415 - commands stay light

    cfg = _config(args)
    logging.getLogger().setLevel(cfg.agent.log_level.upper())
    logfile.install(cfg.logs, cfg.agent.state_dir, "agent" if args.single_process else "supervisor")
    # No process started from here on inherits a secret in its environment.
    secrets.hold_from_environment(secrets.secret_names(cfg))
    if not args.single_process:
        from agent.supervisor import run_supervised  # noqa: PLC0415 - commands stay light

        return run_supervised(
            Path(args.config), cfg, echo=args.echo, duration_s=args.duration, stats=args.stats
        )
    return _run_single_process(cfg, args)


def _run_single_process(cfg: AgentConfig, args: argparse.Namespace) -> int:
    from agent.app import Agent  # noqa: PLC0415 - check-config and decisions stay light

    stop, reload = threading.Event(), threading.Event()
    relay = SignalRelay()
    for signum in (signal.SIGTERM, signal.SIGINT):
        relay.on(signum, functools.partial(log.info, "signal %d: stopping", signum), stop.set)
    relay.on(signal.SIGHUP, reload.set, stop.set)  # after a side-load: take the installed bundles
    agent = Agent(cfg, on_decision=echo_decision if args.echo else None)
    notifier = Notifier()
    forget(os.environ)  # the runtime's workers must not notify as this service
    notifier.status("starting the pipelines")
    agent.start()
    for p in agent.problems:
        print(f"edge-agent: not started: {p.part}: {p.reason}", file=sys.stderr)
    # systemd (Type=notify): READY=1 now, WATCHDOG=1 from this loop while no pipeline's
    # loop is wedged (agent.watchdog); the health is asked on the watch's thread
    watch = HotPathWatch(notifier, lambda _timeout_s: agent.hotpath.health()).start()
    deadline = time.monotonic() + args.duration if args.duration else None
    try:
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            watch.tick()
            if stop.wait(watch.tick_s if left is None else min(left, watch.tick_s)):
                if reload.is_set():
                    reload.clear()
                    stop.clear()
                    agent.reload()
                    log.info("SIGHUP: the pipelines are loaded again")
                    continue
                break
            if left is not None and left <= 0:
                break
    finally:
        watch.stop()
        agent.stop()
    if args.stats:
        print(json.dumps(agent.stats(), indent=2, default=str))
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from agent.planning import plan_pipelines  # noqa: PLC0415 - keep other commands light

    cfg = _config(args)
    _, problems = plan_pipelines(cfg)
    report = {
        "config": args.config,
        "device_id": cfg.agent.device_id,
        "state_dir": str(cfg.agent.state_dir),
        "cameras": [c.name for c in cfg.cameras],
        "sensors": [s.name for s in cfg.sensors],
        "pipelines": [p.name for p in cfg.pipelines],
        "problems": [f"{p.part}: {p.reason}" for p in problems],
        "config_hash": cfg.digest(),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for p in problems:
            print(f"edge-agent: {p.part}: {p.reason}", file=sys.stderr)
        if not problems:
            print(
                f"{args.config}: ok ({len(cfg.cameras)} camera(s), {len(cfg.sensors)} "
                f"sensor(s), {len(cfg.pipelines)} pipeline(s))"
            )
    return EXIT_ERROR if problems else 0


def _db_path(args: argparse.Namespace) -> tuple[Path, Path]:
    """The decision log database and the state directory its thumbnails are under."""
    if args.db:
        return Path(args.db), Path(args.db).parent
    cfg = _config(args)
    return cfg.agent.state_dir / cfg.decision_log.path, cfg.agent.state_dir


def cmd_decisions(args: argparse.Namespace) -> int:
    from agent.decisionlog.query import format_rows, get, parse_time, query  # noqa: PLC0415 - keep other commands light

    db, state_dir = _db_path(args)
    if not db.exists():
        raise AgentError(f"no decision log at {db}")
    if args.show:
        row = get(db, args.show)
        if row is None:
            raise AgentError(f"no decision with id {args.show} in {db}")
        thumb = row.get("thumbnail")
        row["thumbnail_path"] = str(state_dir / thumb) if thumb else None
        print(json.dumps(row, indent=2, default=str))
        return 0
    try:
        since = parse_time(args.since) if args.since else None
        until = parse_time(args.until) if args.until else None
    except ValueError as e:
        raise AgentError(str(e)) from None
    rows = query(
        db,
        since=since,
        until=until,
        source=args.source,
        outcome=args.outcome,
        model_version=args.model_version,
        station=args.station,
        part_id=args.part_id,
        limit=args.limit,
    )
    sys.stdout.write(format_rows(rows, args.format))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from agent.bench import run_agent_bench  # noqa: PLC0415 - keep other commands light
    from agent.benchreport import format_report  # noqa: PLC0415

    report = run_agent_bench(
        Path(args.bundle),
        args.source,
        duration_s=args.duration,
        load=args.load,
        workers=args.workers,
        state_dir=Path(args.state_dir) if args.state_dir else None,
        progress=not args.quiet,
        cameras=args.cameras,
        shadow=Path(args.shadow) if args.shadow else None,
        shadow_sample=args.shadow_sample,
        shadow_max_fps=args.shadow_max_fps,
        transport=args.transport,
        username=args.username or "",
        password_env=args.password_env or "",
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(format_report(report))
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    from agent.directives.sideload import sideload  # noqa: PLC0415

    report = sideload(Path(args.medium), _config(args))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    elif report["outcome"] in ("committed", "noop"):
        what = f"{report['bundle']} {report.get('version', '')} (release {report['release']})"
        done = "already installed" if report["outcome"] == "noop" else "installed and committed"
        if report.get("mode") == "shadow" and report["outcome"] == "committed":
            done = "installed as shadow (runs beside the active bundle, never acts)"
        print(f"{what}: {done}; a running agent takes it on SIGHUP (systemctl reload)")
    else:
        print(
            f"edge-agent: install {report['outcome']} at {report['step']}: {report['reason']}",
            file=sys.stderr,
        )
    return 0 if report["outcome"] in ("committed", "noop") else EXIT_ERROR


def cmd_enroll(args: argparse.Namespace) -> int:
    from agent.enrollment.cli import cmd_enroll as enroll  # noqa: PLC0415

    return enroll(args.server_url, args.token, args.config, replace=args.replace)


def cmd_outbox(args: argparse.Namespace) -> int:
    from agent.uplink.cli import cmd_outbox as outbox  # noqa: PLC0415

    return outbox(Path(args.config), args.json)


def cmd_bench_log(args: argparse.Namespace) -> int:
    import tempfile  # noqa: PLC0415

    from agent.decisionlog.bench import bench_writer  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="edge-agent-bench-log-") as tmp:
        report = bench_writer(Path(tmp), rows=args.rows)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    w, raw = report["writer_rows_per_s"], report["raw_executemany_rows_per_s"]
    ok_rate = "met" if w >= 20_000 else "NOT met"
    ok_ratio = "met" if report["ratio"] >= 0.5 else "NOT met"
    print(
        f"decision-log writer {w:,.0f} rows/s (target >= 20,000: {ok_rate}); raw executemany "
        f"{raw:,.0f} rows/s; ratio {report['ratio']:.2f} (target >= 0.5: {ok_ratio})"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-agent",
        description="The edgefleet device agent.",
        epilog=EPILOG_RUN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", default=DEFAULT_CONFIG, help=f"(default {DEFAULT_CONFIG})")

    run = sub.add_parser(
        "run",
        help="run the agent until SIGTERM (a supervisor, the hot path, the companion)",
        epilog="example: edge-agent run --config agent.toml --echo",
    )
    with_config(run)
    run.add_argument("--echo", action="store_true", help="print each decision as it is made")
    run.add_argument("--duration", type=float, default=0, help="stop after S seconds (0: never)")
    run.add_argument("--stats", action="store_true", help="print counters as JSON at exit")
    run.add_argument(
        "--single-process",
        action="store_true",
        help="run the hot path and the companion in this one process (debugging; the "
        "default is a supervisor with the two as separate processes)",
    )
    run.set_defaults(func=cmd_run)

    check = sub.add_parser(
        "check-config",
        help="validate the config and its bundles without running",
        epilog="example: edge-agent check-config --config agent.toml --json",
    )
    with_config(check)
    check.add_argument("--json", action="store_true", help="print a JSON report")
    check.set_defaults(func=cmd_check_config)

    dec = sub.add_parser(
        "decisions",
        help="list decisions from the log (newest first), or show one",
        epilog="examples:\n  edge-agent decisions --since 2h --outcome reject\n"
        "  edge-agent decisions --part-id P-20261121-0042\n"
        "  edge-agent decisions show ID",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dec.add_argument("show_word", nargs="?", choices=["show"], help=argparse.SUPPRESS)
    dec.add_argument("show", nargs="?", help="with 'show': the decision id")
    with_config(dec)
    dec.add_argument("--db", help="read this database instead of the config's")
    dec.add_argument("--since", help="ISO time or age like 15m, 2h, 1d")
    dec.add_argument("--until", help="ISO time or age like 15m, 2h, 1d")
    dec.add_argument("--source", help="camera or sensor name")
    dec.add_argument("--outcome", help="pass, reject, review, ...")
    dec.add_argument("--model-version", help="model version")
    dec.add_argument("--station", help="the station whose PLC trigger it answers")
    dec.add_argument("--part-id", help="the part id the PLC passed (every decision on a part)")
    dec.add_argument("--limit", type=int, default=50)
    dec.add_argument("--format", choices=["table", "csv", "jsonl"], default="table")
    dec.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="jsonl",
        help="same as --format jsonl (one JSON object a line), as fleetctl's --json",
    )
    dec.set_defaults(func=cmd_decisions)

    bench = sub.add_parser(
        "bench",
        help="the whole hot path on the real pool vs the bare runtime",
        epilog="examples:\n"
        "  edge-agent bench --bundle bundles/cls --source line.avi --json b.json\n"
        "  edge-agent bench --bundle bundles/cls --source rtsp://10.0.0.21:554/stream1 "
        "--username bench --password-env CAM_PASSWORD --cameras 4 --json rtsp.json\n"
        "  edge-agent bench --bundle bundles/cls --source line.avi --shadow bundles/cls-v2 "
        "--shadow-sample 0.2 --json shadow.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("--bundle", required=True, help="bundle directory")
    bench.add_argument(
        "--source",
        required=True,
        help="video file, rtsp:// or http:// (MJPEG) URL to capture from (no password in it); "
        "the report gives its decode_ms_p50, decode_cpu_per_frame_ms and "
        "cameras_full_at_stream_fps",
    )
    bench.add_argument(
        "--transport",
        choices=["tcp", "udp", "auto"],
        default="tcp",
        help="RTSP transport (default tcp)",
    )
    bench.add_argument("--username", help="stream user name")
    bench.add_argument(
        "--password-env",
        metavar="SECRET",
        help="name of the secret holding the stream's password ($CREDENTIALS_DIRECTORY file "
        "or environment variable)",
    )
    bench.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    bench.add_argument("--load", type=float, default=0.6, help="fraction of capacity offered")
    bench.add_argument("--workers", type=int, default=None, help="pool workers")
    bench.add_argument(
        "--cameras",
        type=int,
        default=1,
        help="also spread the load over N cameras (a stream: N sessions on the same URL, "
        "and whether decoding them kept up)",
    )
    bench.add_argument("--state-dir", help="where the bench's decision log goes (default: temp)")
    bench.add_argument(
        "--shadow",
        metavar="BUNDLE_DIR",
        help="also run the load with this bundle as every pipeline's shadow candidate and "
        "report e2e_p99_ms with it, e2e_p99_ms_baseline without, p99_ratio, shadow_frames, "
        "shadow_skipped",
    )
    bench.add_argument(
        "--shadow-sample", type=float, default=0.2, help="share of frames the shadow gets (0..1)"
    )
    bench.add_argument(
        "--shadow-max-fps",
        type=float,
        default=1000.0,
        help="cap on shadow frames a second per pipeline (default: no cap to speak of; "
        "the agent's [shadow] max_fps defaults to 5)",
    )
    bench.add_argument("--json", help="write the report here")
    bench.add_argument("--quiet", action="store_true", help="no progress display")
    bench.set_defaults(func=cmd_bench)

    inst = sub.add_parser(
        "install",
        help="side-load a signed bundle from removable media (same checks as the fleet's)",
        epilog="example: edge-agent install /media/usb/edgefleet --config agent.toml",
    )
    inst.add_argument(
        "medium", help="directory with metadata/, targets/ and directives/<device>.json"
    )
    with_config(inst)
    inst.add_argument("--json", action="store_true", help="print the report as JSON")
    inst.set_defaults(func=cmd_install)
    add_installer_parsers(sub, with_config, install=False)  # bundles, rollback
    add_setup_parser(sub)

    enr = sub.add_parser(
        "enroll",
        help="trade a one-time token for this device's certificate (key made here)",
        epilog="example: edge-agent enroll https://fleet.example:8080 --token - --config a.toml",
    )
    enr.add_argument("server_url", help="the fleet server's URL")
    enr.add_argument("--token", required=True, help="the one-time token, or - to read stdin")
    with_config(enr)
    enr.add_argument("--replace", action="store_true", help="enroll again over an identity")
    enr.set_defaults(func=cmd_enroll)

    box = sub.add_parser(
        "outbox",
        help="what waits to go to the fleet: outbox records by kind, decisions by upload state",
        epilog="example: edge-agent outbox --config agent.toml --json",
    )
    with_config(box)
    box.add_argument("--json", action="store_true", help="print JSON")
    box.set_defaults(func=cmd_outbox)

    blog = sub.add_parser(
        "bench-log",
        help="decision-log writer rows/s vs raw executemany, same pragmas",
        epilog="example: edge-agent bench-log --rows 200000 --json log.json",
    )
    blog.add_argument("--rows", type=int, default=200_000, help="rows to write")
    blog.add_argument("--json", help="write the report here")
    blog.set_defaults(func=cmd_bench_log)

    add_cameras_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "decisions" and args.show_word is None and args.show is not None:
        parser.error(f"decisions: unexpected argument {args.show!r} (did you mean 'show ID'?)")
    if args.command == "decisions" and args.show_word == "show" and not args.show:
        parser.error("decisions show: give a decision id")
    try:
        return int(args.func(args))
    except _reported_errors() as e:
        print(f"edge-agent: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
