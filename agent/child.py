"""The two processes of ``edge-agent run``, as the supervisor starts them
(:mod:`agent.supervisor`): ``python -m agent.child hotpath|companion --config F``.

- ``hotpath``: :class:`agent.hotpath.HotPath` and the control channel's server. SIGHUP
  reloads the pipelines (after a side-load), SIGTERM stops it in order.
- ``companion``: :class:`agent.companion.Companion`, reaching the hot path through the
  control channel's client. SIGTERM stops it.
- ``hotpath --standby``: a hot path started ahead (its interpreter and imports done)
  that waits on stdin until the supervisor tells it to take over from one that died.

Each takes its scheduling from the firmware profile's ``[processes]`` table: the hot path
at its niceness, the companion below it (a higher niceness and SCHED_BATCH by default).
Both die with the supervisor (the kernel's parent-death signal). What the supervisor says
of earlier starts comes in the environment (:data:`ENV_SOCKET`, :data:`ENV_STARTS`,
:data:`ENV_LAST_EXIT`, :data:`ENV_RECOVER`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from agent.config import AgentConfig, load_config
from agent.echo import echo_decision
from agent.kernel import secrets
from agent.kernel.errors import EdgefleetError
from agent.kernel.signals import SignalRelay
from agent.remote import logfile

log = logging.getLogger(__name__)

ENV_SOCKET = "EDGEFLEET_CONTROL_SOCKET"
ENV_STARTS = "EDGEFLEET_HOTPATH_STARTS"
ENV_LAST_EXIT = "EDGEFLEET_HOTPATH_LAST_EXIT"
ENV_RECOVER = "EDGEFLEET_RECOVER"
EXIT_ERROR = 2
_PR_SET_PDEATHSIG = 1

_POLICIES = {"other": "SCHED_OTHER", "batch": "SCHED_BATCH", "idle": "SCHED_IDLE"}


def die_with_parent() -> None:
    """Ask the kernel for SIGTERM when the supervisor dies (Linux; elsewhere nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        log.debug("no parent-death signal on this system")


def schedule(role: str, config: AgentConfig) -> str:
    """Apply the profile's niceness and policy to this process; what was applied (a
    setting the system refuses, such as a negative niceness without CAP_SYS_NICE, is
    logged and left)."""
    from runtime.profiles import load_profile  # noqa: PLC0415 - only the children need it
    from runtime.profiles.schema import keep_cores_for_workers  # noqa: PLC0415

    procs = load_profile(config.agent.profile).processes
    nice = procs.hotpath_nice if role == "hotpath" else procs.companion_nice
    applied = []
    try:
        current = os.nice(0)
        if nice != current:
            os.nice(nice - current)
        applied.append(f"nice {nice}")
    except OSError as exc:
        log.warning("%s: niceness %d not applied: %s", role, nice, exc)
    if role == "hotpath":
        profile = load_profile(config.agent.profile)
        cores = profile.hotpath_cpus()
        if cores and hasattr(os, "sched_setaffinity"):
            try:  # before any thread starts: they all inherit it; workers pin themselves
                keep_cores_for_workers(set(os.sched_getaffinity(0)))
                os.sched_setaffinity(0, cores)
                applied.append(f"cores {','.join(map(str, sorted(cores)))}")
            except OSError as exc:
                log.warning("hotpath: cores %s not reserved: %s", sorted(cores), exc)
    if role == "companion":
        name = _POLICIES[procs.companion_sched]
        policy = getattr(os, name, None)
        if policy is not None:
            try:
                os.sched_setscheduler(0, policy, os.sched_param(0))
                applied.append(name)
            except OSError as exc:
                log.warning("companion: %s not applied: %s", name, exc)
    return ", ".join(applied)


class _Signals:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self.reload = threading.Event()
        relay = SignalRelay().on(signal.SIGTERM, self.stop.set)
        relay.on(signal.SIGHUP, self.reload.set, self.stop.set)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides


def run_hotpath(config: AgentConfig, socket_path: Path, *, echo: bool) -> int:
    from agent.control.server import ControlServer  # noqa: PLC0415
    from agent.hotpath import HotPath  # noqa: PLC0415

    signals = _Signals()
    hot = HotPath(
        config,
        on_decision=echo_decision if echo else None,
        recover=os.environ.get(ENV_RECOVER) == "1",
        starts=int(os.environ.get(ENV_STARTS, "1") or 1),
        last_exit=os.environ.get(ENV_LAST_EXIT, ""),
    )
    hot.start()
    for p in hot.problems:
        print(f"edge-agent: not started: {p.part}: {p.reason}", file=sys.stderr, flush=True)
    server = ControlServer(socket_path, hot.handle).start()
    try:
        while True:
            signals.stop.wait()
            if signals.reload.is_set():
                signals.reload.clear()
                signals.stop.clear()
                hot.reload()
                log.info("SIGHUP: the pipelines are loaded again")
                continue
            break
    finally:
        server.stop()
        hot.stop()
    return 0


def run_companion(config: AgentConfig, socket_path: Path, config_path: Path | None = None) -> int:
    from agent.companion import Companion  # noqa: PLC0415
    from agent.control.client import ControlClient  # noqa: PLC0415
    from agent.control.link import HotPathLink  # noqa: PLC0415
    from agent.installer import Installer  # noqa: PLC0415
    from runtime.profiles import load_profile  # noqa: PLC0415

    signals = _Signals()
    client = ControlClient(socket_path)
    long_client = ControlClient(socket_path)  # reloads and trials: the polls don't wait
    link = HotPathLink(
        client.call,
        long_call=long_client.call,
        device_id=config.agent.device_id,
        state_dir=config.agent.state_dir,
    )
    installer = None
    if config.uses_installer():
        installer = Installer(
            config.agent.state_dir,
            profile_name=load_profile(config.agent.profile).name,
            config=config.bundles.installer,
            measure=link.trial,
        )
    companion = Companion(
        config,
        link,
        installer=installer,
        split=True,
        config_path=config_path,
        supervisor_pid=os.getppid(),  # a remote restart or reload asks it
    ).start()
    for p in companion.problems:
        print(f"edge-agent: not started: {p.part}: {p.reason}", file=sys.stderr, flush=True)
    try:
        signals.stop.wait()
    finally:
        companion.stop()
        client.close()
        long_client.close()
    return 0


def name_process(role: str) -> None:
    """``edgefleet-<role>`` as the process's name (``ps -o comm``, ``/proc/<pid>/comm``;
    the runtime's workers are ``edgefleet-w<N>``): a standby that took over is then told
    from the next standby, whose command lines are the same."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as f:
        f.write(f"ef-{role}")


def wait_as_standby() -> bool:
    """A standby hot path: do the imports now, then wait for the supervisor's one line
    on stdin (``{"starts": N, "last_exit": "..."}``) and take over; False at the end of
    stdin (the supervisor stopped or no longer needs a standby)."""
    import agent.control.server  # noqa: PLC0415 - the point: imported before it is needed
    import agent.hotpath  # noqa: F401, PLC0415

    line = sys.stdin.buffer.readline(4096)
    if not line.strip():
        return False
    try:
        go = json.loads(line)
        starts, last_exit = int(go["starts"]), str(go["last_exit"])
    except (ValueError, KeyError, TypeError) as exc:
        print(f"edge-agent hotpath: bad take-over line from the supervisor: {exc}", file=sys.stderr)
        return False
    os.environ[ENV_STARTS] = str(starts)
    os.environ[ENV_LAST_EXIT] = last_exit
    os.environ[ENV_RECOVER] = "0"
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.child")
    parser.add_argument("role", choices=("hotpath", "companion"))
    parser.add_argument("--config", required=True)
    parser.add_argument("--echo", action="store_true")
    parser.add_argument(
        "--standby", action="store_true", help="hotpath: wait on stdin to take over"
    )
    args = parser.parse_args(argv)
    secrets.receive_handoff()  # before anything starts a process of its own
    die_with_parent()
    if args.standby:
        name_process("standby")
        if not wait_as_standby():
            return 0
    name_process(args.role)
    try:
        config = load_config(Path(args.config))
    except EdgefleetError as exc:
        print(f"edge-agent {args.role}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    logging.basicConfig(
        level=config.agent.log_level.upper(),
        format=f"%(asctime)s {args.role} %(levelname)s %(name)s: %(message)s",
    )
    logfile.install(config.logs, config.agent.state_dir, args.role)
    default_socket = config.agent.state_dir / "run" / "control.sock"
    socket_path = Path(os.environ.get(ENV_SOCKET) or default_socket)
    applied = schedule(args.role, config)
    log.info("%s: pid %d, %s", args.role, os.getpid(), applied or "default scheduling")
    runner: dict[str, Any] = {
        "hotpath": lambda: run_hotpath(config, socket_path, echo=args.echo),
        "companion": lambda: run_companion(config, socket_path, Path(args.config).resolve()),
    }
    try:
        return int(runner[args.role]())
    except EdgefleetError as exc:
        print(f"edge-agent {args.role}: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
