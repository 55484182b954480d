"""``edge-runtime``: bench and model tools for the inference runtime.

The library raises; this module turns its errors into one line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from runtime.backends import BackendOptions, available_backends, open_model
from runtime.bench import measure_bare, run_closed_loop, run_open_loop, sample_input
from runtime.config import ModelConfig, PoolConfig
from runtime.errors import EdgeRuntimeError
from runtime.pool import WorkerPool
from runtime.profiles import load_profile
from runtime.targets import format_targets, run_targets

EXIT_ERROR = 2
EXIT_TARGETS_MISSED = 3


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (e.g. 1x3x224x224)") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (e.g. 1x3x224x224)")
    return dims


def _rate(text: str) -> float | None:
    if text == "max":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"rate must be a number or 'max', got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"rate must be > 0, got {text!r}")
    return value


def _input_shapes(path: str, shape: tuple[int, ...] | None) -> dict[str, tuple[int, ...]]:
    if shape is None:
        return {}
    model = open_model(path, BackendOptions())
    try:
        return {model.inputs[0].name: shape}
    finally:
        model.close()


def _write_json(path: str, data: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def cmd_bench(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    overrides: dict[str, object] = {}
    if args.workers:
        overrides["workers"] = args.workers
    if args.threads:
        overrides["threads_per_worker"] = args.threads
    config = PoolConfig.from_profile(profile, **overrides)
    shapes = _input_shapes(args.model, args.input_shape)
    model = ModelConfig("model", args.model, input_shapes=shapes, queue_bound=args.queue_bound)
    progress = not args.quiet
    with WorkerPool([model], config) as pool:
        info = pool.models[0]
        inputs = sample_input(list(info.inputs))
        bare = measure_bare(
            args.model,
            inputs,
            backend=info.backend,
            threads=config.threads_per_worker,
            providers=config.providers,
            delegates=config.delegates,
            duration_s=min(args.duration, 5.0),
            progress=progress,
        )
        if args.rate is None:
            run = run_closed_loop(
                pool, "model", inputs, duration_s=args.duration, progress=progress
            )
        else:
            run = run_open_loop(
                pool, "model", inputs, args.rate, duration_s=args.duration, progress=progress
            )
        stages = pool.stats()["models"]["model"]["stages"]
    result = {
        "model": args.model,
        "backend": info.backend,
        "providers": list(info.providers),
        "profile": profile.name,
        "input_shape": list(info.inputs[0].concrete_shape()),
        "input_dtype": str(info.inputs[0].dtype),
        "workers": config.workers,
        "threads_per_worker": config.threads_per_worker,
        "mode": "closed-loop" if args.rate is None else "open-loop",
        "rate_rps": args.rate,
        "duration_s": args.duration,
        "bare_p50_ms": bare.latency["p50_ms"],
        "bare_p99_ms": bare.latency["p99_ms"],
        "bare_p999_ms": bare.latency["p999_ms"],
        "bare_throughput_rps": bare.throughput_rps,
        "pool_p50_ms": run.latency["p50_ms"],
        "pool_p95_ms": run.latency["p95_ms"],
        "pool_p99_ms": run.latency["p99_ms"],
        "pool_p999_ms": run.latency["p999_ms"],
        "pool_max_ms": run.latency["max_ms"],
        "throughput_rps": run.throughput_rps,
        "sent": run.sent,
        "completed": run.completed,
        "refused": run.refused,
        "expired": run.expired,
        "failed": run.failed,
        "unfinished": run.unfinished,
        "stages": stages,
    }
    print(format_bench(result))
    if args.json:
        _write_json(args.json, result)
    return 0


def format_bench(r: dict[str, Any]) -> str:
    mode = r["mode"] + (f" at {r['rate_rps']:.0f} rps" if r["rate_rps"] else "")
    shape = "x".join(str(d) for d in r["input_shape"])
    head = (
        f"model {r['model']}  backend {r['backend']} ({', '.join(r['providers'])})\n"
        f"input {shape} {r['input_dtype']}  workers {r['workers']}  "
        f"threads/worker {r['threads_per_worker']}  profile {r['profile']}  {mode}\n"
    )
    rows = [f"{'':22}{'bare':>10}{'pool':>10}{'ratio':>8}"]
    for label, b, p in (
        ("p50 ms", "bare_p50_ms", "pool_p50_ms"),
        ("p99 ms", "bare_p99_ms", "pool_p99_ms"),
        ("p99.9 ms", "bare_p999_ms", "pool_p999_ms"),
        ("throughput rps", "bare_throughput_rps", "throughput_rps"),
    ):
        ratio = r[p] / r[b] if r[b] else 0.0
        fmt = ".0f" if "rps" in label else ".3f"
        rows.append(f"{label:22}{r[b]:10{fmt}}{r[p]:10{fmt}}{ratio:8.2f}")
    stage_rows = ["", f"{'pool stage':22}{'p50':>10}{'p99':>10}{'p99.9':>10}{'max':>10}"]
    for stage, s in r["stages"].items():
        if s["count"]:
            stage_rows.append(
                f"{stage:22}{s['p50_ms']:10.3f}{s['p99_ms']:10.3f}{s['p999_ms']:10.3f}"
                f"{s['max_ms']:10.3f}"
            )
    counts = (
        f"\nsent {r['sent']}  completed {r['completed']}  refused {r['refused']}  "
        f"expired {r['expired']}  failed {r['failed']}  unfinished {r['unfinished']}"
    )
    return head + "\n".join(rows + stage_rows) + counts


def cmd_targets(args: argparse.Namespace) -> int:
    shapes = _input_shapes(args.model, args.input_shape)
    overrides: dict[str, object] = {}
    if args.spin_us is not None:
        overrides["spin_us"] = args.spin_us
    if args.pipelining is not None:
        overrides["pipelining"] = args.pipelining == "on"
    config = PoolConfig.from_profile(load_profile(args.profile), **overrides)
    report = run_targets(
        args.model,
        shapes,
        rounds=args.rounds,
        duration_s=args.duration,
        queue_bound=args.queue_bound,
        progress=not args.quiet,
        on_round=lambda i, _fig: print(f"round {i + 1}/{args.rounds} done", file=sys.stderr),
        config=config,
    )
    print(format_targets(report))
    if args.json:
        _write_json(args.json, report)
    if args.strict and not report["all_met"]:
        return EXIT_TARGETS_MISSED
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    infos = available_backends()
    if args.json:
        print(json.dumps([i.__dict__ for i in infos], indent=2))
    else:
        for i in infos:
            state = "available" if i.available else f"unavailable: {i.reason}"
            print(f"{i.key:8} {state}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    model = open_model(args.model, BackendOptions())
    try:
        data = {
            "model": args.model,
            "backend": model.key,
            "providers": model.active_providers,
            "inputs": [
                {"name": s.name, "shape": list(s.shape), "dtype": str(s.dtype)}
                for s in model.inputs
            ],
            "outputs": [
                {"name": s.name, "shape": list(s.shape), "dtype": str(s.dtype)}
                for s in model.outputs
            ],
        }
    finally:
        model.close()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(f"{data['model']}  ({data['backend']})")
        for kind in ("inputs", "outputs"):
            for t in data[kind]:
                shape = "x".join("?" if d is None else str(d) for d in t["shape"])
                print(f"  {kind[:-1]:7} {t['name']:32} {shape:20} {t['dtype']}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    profile = load_profile(args.name)
    data = profile.model_dump(mode="json")
    data["resolved_cores"] = profile.resolve_cores()
    data["resolved_workers"] = profile.resolve_workers()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        for key, value in data.items():
            print(f"{key:22} {value}")
    return 0


class _Version(argparse.Action):
    """``--version``: the installed edgefleet's version, read only when asked (the
    runtime is a library of its own: agent.kernel.cliversion is the agent's copy)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kw: Any) -> None:
        from importlib import metadata  # noqa: PLC0415 - only when asked

        try:
            version = metadata.version("edgefleet")
        except metadata.PackageNotFoundError:
            version = "unknown"
        print(f"{parser.prog} {version}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="edge-runtime",
        description="edgefleet inference runtime: bench and model tools.",
        formatter_class=fmt,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser(
        "bench",
        help="the worker pool against the bare runtime, side by side",
        formatter_class=fmt,
        description="Measure the bare runtime (one session, tight loop) and the worker pool "
        "on the same input, in the same run.\n\n"
        "example:\n  edge-runtime bench model.onnx --workers 2 --rate 500 --duration 10 "
        "--json out.json\n  edge-runtime bench det.onnx --input-shape 1x3x64x64 --rate max",
    )
    b.add_argument("model", help="an .onnx or .tflite model with one image input")
    b.add_argument("--workers", type=int, help="worker processes (default: from the profile)")
    b.add_argument("--threads", type=int, help="intra-op threads per worker (default: profile)")
    b.add_argument(
        "--rate",
        type=_rate,
        default=None,
        help="open-loop requests per second, or 'max' for closed loop (default max)",
    )
    b.add_argument("--duration", type=float, default=5.0, help="seconds of load (default 5)")
    b.add_argument("--queue-bound", type=int, default=8, help="requests that may wait (default 8)")
    b.add_argument(
        "--input-shape", type=parse_shape, help="shape for dynamic inputs, e.g. 1x3x64x64"
    )
    b.add_argument("--profile", default="auto", help="firmware profile name or path (auto)")
    b.add_argument("--json", metavar="PATH", help="write the results as JSON")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    b.set_defaults(func=cmd_bench)

    t = sub.add_parser(
        "targets",
        help="measure the runtime's targets (median of several rounds)",
        formatter_class=fmt,
        description="Bare vs pool latency at half capacity, scaling 1 -> 2 workers, and "
        "overload at 1.2 x capacity; the median of several rounds against the targets.\n\n"
        "example:\n  edge-runtime targets cls.onnx --input-shape 1x3x48x192 --rounds 5",
    )
    t.add_argument("model")
    t.add_argument("--input-shape", type=parse_shape, help="shape for dynamic inputs")
    t.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported")
    t.add_argument("--duration", type=float, default=3.0, help="seconds per phase (default 3)")
    t.add_argument("--queue-bound", type=int, default=4, help="queue bound B (default 4)")
    t.add_argument("--json", metavar="PATH", help="write every round and the medians as JSON")
    t.add_argument(
        "--profile", default="auto", help="firmware profile for pipelining and spin (auto)"
    )
    t.add_argument("--spin-us", type=int, help="override the profile's worker spin (µs)")
    t.add_argument("--pipelining", choices=("on", "off"), help="override the profile's")
    t.add_argument("--strict", action="store_true", help="exit 3 if a target is missed")
    t.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    t.set_defaults(func=cmd_targets)

    k = sub.add_parser(
        "backends",
        help="which backends import on this device, and why not",
        description="example:\n  edge-runtime backends --json",
        formatter_class=fmt,
    )
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=cmd_backends)

    i = sub.add_parser(
        "inspect",
        help="a model's inputs and outputs as read from the file",
        description="example:\n  edge-runtime inspect model.tflite --json",
        formatter_class=fmt,
    )
    i.add_argument("model")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "profile",
        help="show the firmware profile this device gets (or a named one)",
        description=(
            "example:\n  edge-runtime profile auto\n  edge-runtime profile jetson-orin --json"
        ),
        formatter_class=fmt,
    )
    p.add_argument("name", nargs="?", default="auto")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profile)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.func(args)
    except (EdgeRuntimeError, KeyError, ValueError) as exc:
        print(f"edge-runtime: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
