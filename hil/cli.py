"""``hil``: list the HIL scenarios, run them against simulated or real devices, or run a
bench (``hil bench fleet|drain|ingest|review|restart``, :mod:`hil.bench`).

The library raises; this module turns its errors into one line on stderr and exit code 2.
``hil run`` exits 0 when every invariant held, 1 when one did not (or could not be
judged), 2 when the run could not start.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import time
from pathlib import Path

from hil.bench import BENCHES
from hil.errors import HilError
from hil.report import render_table
from hil.runner import RunOptions, check_names, run
from hil.scenario import Size
from hil.scenarios import SCENARIOS

EXIT_FAILED = 1
EXIT_ERROR = 2

EPILOG = """examples:
  hil list
  hil run ci --short --report .cache/hil/report.json
  hil run plc-link-cut --short
  hil run offline packet-loss --scale 0.5
  hil run all --device 'ssh://nvidia@192.168.55.1?iface=eth0' --fleet-host 10.0.0.5
  hil bench fleet --devices 1000 --duration 30 --json .cache/bench-fleet.json
  hil bench fleet --devices 10000 --replicas 3 --shards 2 --json .cache/bench-fleet-cluster.json
  hil bench drain --help
"""


def cmd_list(args: argparse.Namespace) -> int:
    if args.json:
        items = [
            {
                "name": s.name,
                "title": s.title,
                "invariants": list(s.invariants),
                "in_ci": s.in_ci,
            }
            for s in SCENARIOS.values()
        ]
        print(json.dumps(items, indent=2))
        return 0
    for i, s in enumerate(SCENARIOS.values(), 1):
        ci = "" if s.in_ci else "  (not in ci: run it by name)"
        print(f"{i}. {s.name:<15} {s.title}{ci}")
        for inv in s.invariants:
            print(f"   - {inv}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    names = check_names(args.scenario)
    size = Size.short() if args.short else Size.full()
    if args.scale is not None:
        if args.scale <= 0:
            raise HilError(f"--scale {args.scale}: must be above 0")
        size = size.scaled(args.scale)
    opts = RunOptions(
        scenarios=names,
        device=args.device,
        size=size,
        workdir=Path(args.workdir),
        report=Path(args.report) if args.report else None,
        models=Path(args.models) if args.models else RunOptions.models,
        fleet_host=args.fleet_host,
    )
    start = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {message}", flush=True)

    report = run(opts, say)
    print()
    print(render_table(report))
    if opts.report is not None:
        print(f"report: {opts.report}")
    return 0 if report.passed else EXIT_FAILED


def cmd_bench(args: argparse.Namespace) -> int:
    """Run a bench's own ``main`` with the rest of the command line (its flags, its exit
    code); imported here, so that ``hil list`` and ``hil run`` don't load the benches."""
    bench = importlib.import_module(BENCHES[args.bench])
    return int(bench.main(args.args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hil",
        description="Hardware-in-the-loop scenarios: a real fleet server and real agents "
        "under injected faults, with pass/fail invariants.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    lst = sub.add_parser("list", help="the scenarios and their invariants",
                         epilog="example: hil list --json")  # fmt: skip
    lst.add_argument("--json", action="store_true", help="as JSON")
    lst.set_defaults(func=cmd_list)
    r = sub.add_parser(
        "run",
        help="run scenarios (ci, all, or by name)",
        epilog="example: hil run ci --short --report .cache/hil/report.json",
    )
    r.add_argument(
        "scenario",
        nargs="+",
        help=f"ci (what make hil runs), all, or of: {', '.join(SCENARIOS)}",
    )
    r.add_argument("--device", default="sim", help="sim (default) or ssh://USER@HOST[:PORT]")
    size = r.add_mutually_exclusive_group()
    size.add_argument(
        "--short", action="store_true", help="CI sizes: 60 s offline and loss, not 10 and 5 min"
    )
    size.add_argument("--scale", type=float, help="the full durations times this factor")
    r.add_argument("--report", help="write the JSON report here")
    r.add_argument("--workdir", default=".cache/hil", help="devices, fleet and logs")
    r.add_argument("--models", help="pretrained models (default .cache/models)")
    r.add_argument("--fleet-host", help="with ssh://: this machine's address the device reaches")
    r.set_defaults(func=cmd_run)
    b = sub.add_parser(
        "bench",
        help="run a bench: fleet, drain, ingest, review, restart, retention, decode or line "
        "(its flags follow its name)",
        epilog="example: hil bench review --decisions 100000 --devices 100 --json out.json\n"
        "         hil bench drain --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("bench", choices=list(BENCHES), help="which bench")
    b.add_argument("args", nargs=argparse.REMAINDER, help="the bench's flags (see NAME --help)")
    b.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except HilError as exc:
        print(f"hil: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
