"""``edge-agent install | bundles | rollback``: the installer for people and scripts.

The ``cmd_*`` functions print and return an exit code (0 ok, 2 refused or failed);
:func:`add_parsers` adds the three subcommands to the agent's argument parser, reading
the state directory and firmware profile from the agent config.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.installer.config import InstallerConfig
from agent.installer.errors import InstallError
from agent.installer.installer import Installer
from agent.installer.result import Report
from runtime import PoolConfig
from runtime.profiles import load_profile

EXIT_OK = 0
EXIT_FAILED = 2
_STEP_POINTS = ("stage", "load", "benchmark", "switch", "health", "commit", "rollback")


def _installer(
    state_dir: Path,
    profile: str,
    *,
    config: InstallerConfig | None = None,
    progress: bool = False,
    on_report: Callable[[Report], None] | None = None,
) -> Installer:
    prof = load_profile(profile)

    def show(point: str) -> None:
        if point in _STEP_POINTS:
            print(f"  {point} ...", file=sys.stderr, flush=True)

    return Installer(
        state_dir,
        profile_name=prof.name,
        on_report=on_report,
        config=config,
        pool_config=PoolConfig.from_profile(prof, workers=1, pin=False),
        checkpoint=show if progress else None,
    )


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def cmd_install(
    bundle: Path,
    *,
    state_dir: Path,
    profile: str = "auto",
    source: str = "side-load",
    health_window_s: float | None = None,
    config: InstallerConfig | None = None,
    as_json: bool = False,
) -> int:
    """Install a verified bundle directory; print the result (or the failure's step and
    reason) and return the exit code."""
    reports: list[Report] = []
    inst = _installer(
        state_dir, profile, config=config, progress=not as_json, on_report=reports.append
    )
    try:
        result = inst.install(Path(bundle), source=source, health_window_s=health_window_s)
    except InstallError as exc:
        if as_json:
            _print_json(
                {"outcome": "failed", "step": exc.step, "reason": exc.reason, "reports": reports}
            )
        else:
            active = inst.active_bundle(exc.name) if exc.name else None
            print(f"edge-agent: install failed at {exc.step}: {exc.reason}", file=sys.stderr)
            print(f"edge-agent: running {active or 'no installed bundle'}", file=sys.stderr)
        return EXIT_FAILED
    if as_json:
        _print_json({**result.as_dict(), "reports": reports})
        return EXIT_OK
    b = result.bundle
    if result.outcome == "noop":
        print(f"{b.name} {b.version} (release {b.release}) is already installed: nothing to do")
    else:
        p95 = f", p95 {result.benchmark.p95_ms:.2f} ms" if result.benchmark else ""
        print(f"{b.name} {b.version} (release {b.release}) committed in slot-{result.slot}{p95}")
    return EXIT_OK


def cmd_bundles(*, state_dir: Path, as_json: bool = False) -> int:
    """List every slot of every installed bundle (the shadow slot too, while it holds a
    candidate)."""
    rows = Installer(state_dir, profile_name="").status()
    if as_json:
        _print_json([r.as_dict() for r in rows])
        return EXIT_OK
    if not rows:
        print("no bundles installed")
        return EXIT_OK
    print(f"{'bundle':<20} {'slot':<7} {'state':<10} {'version':<14} {'release':>7}  last")
    for r in rows:
        version = r.bundle.version if r.bundle else "-"
        release = str(r.bundle.release) if r.bundle else "-"
        mark = "*" if r.active else " "
        last = f"{r.last.get('status', '?')} at {r.last.get('step', '?')}"
        if r.last.get("reason"):
            last += f": {r.last['reason']}"
        print(f"{r.name:<20} {mark}{r.slot:<6} {r.state:<10} {version:<14} {release:>7}  {last}")
    return EXIT_OK


def cmd_rollback(
    name: str | None, *, state_dir: Path, profile: str = "auto", as_json: bool = False
) -> int:
    """Return ``name`` (or the only installed bundle) to its previous slot."""
    inst = _installer(state_dir, profile)
    try:
        result = inst.rollback(name)
    except InstallError as exc:
        if as_json:
            _print_json({"outcome": "failed", "step": exc.step, "reason": exc.reason})
        else:
            print(f"edge-agent: rollback refused: {exc.reason}", file=sys.stderr)
        return EXIT_FAILED
    if as_json:
        _print_json(result.as_dict())
    else:
        b = result.bundle
        print(f"{b.name}: back on {b.version} (release {b.release}) in slot-{result.slot}")
    return EXIT_OK


def add_parsers(
    sub: Any, with_config: Callable[[argparse.ArgumentParser], None], *, install: bool = True
) -> None:
    """Add ``install`` (unless ``install`` is false: the agent's CLI has its own, signed
    one), ``bundles`` and ``rollback`` to the agent's subparsers; each sets
    ``func(args)``, which loads the agent config named by ``--config``."""

    def state(args: argparse.Namespace) -> tuple[Path, str]:
        from agent.config import load_config  # noqa: PLC0415 - only when a command runs

        cfg = load_config(Path(args.config))
        return cfg.agent.state_dir, cfg.agent.profile

    if install:
        _add_install(sub, with_config, state)
    _add_listing(sub, with_config, state)


def _add_install(
    sub: Any,
    with_config: Callable[[argparse.ArgumentParser], None],
    state: Callable[[argparse.Namespace], tuple[Path, str]],
) -> None:
    inst = sub.add_parser(
        "install",
        help="install a verified bundle directory (side-load): checks, switch, health, commit",
        epilog="example: edge-agent install /media/usb/bundles/cls --config agent.toml",
    )
    inst.add_argument("bundle", help="bundle directory")
    with_config(inst)
    inst.add_argument("--source", default="side-load", help="where it came from (recorded)")
    inst.add_argument("--health-window", type=float, default=None, help="seconds on trial")
    inst.add_argument("--json", action="store_true", help="print the result as JSON")

    def run_install(a: argparse.Namespace) -> int:
        sd, prof = state(a)
        return cmd_install(
            Path(a.bundle),
            state_dir=sd,
            profile=prof,
            source=a.source,
            health_window_s=a.health_window,
            as_json=a.json,
        )

    inst.set_defaults(func=run_install)


def _add_listing(
    sub: Any,
    with_config: Callable[[argparse.ArgumentParser], None],
    state: Callable[[argparse.Namespace], tuple[Path, str]],
) -> None:
    lst = sub.add_parser(
        "bundles",
        help="list installed bundles, their slots (the shadow slot too) and last results",
        epilog="example: edge-agent bundles --config agent.toml --json",
    )
    with_config(lst)
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(func=lambda a: cmd_bundles(state_dir=state(a)[0], as_json=a.json))

    rb = sub.add_parser(
        "rollback",
        help="return a bundle to its previous slot",
        epilog="example: edge-agent rollback cls --config agent.toml",
    )
    rb.add_argument("name", nargs="?", help="bundle name (default: the only one)")
    with_config(rb)
    rb.add_argument("--json", action="store_true", help="print JSON")

    def run_rollback(a: argparse.Namespace) -> int:
        sd, prof = state(a)
        return cmd_rollback(a.name, state_dir=sd, profile=prof, as_json=a.json)

    rb.set_defaults(func=run_rollback)
