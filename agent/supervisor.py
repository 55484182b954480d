"""``edge-agent run``: one service, two processes. The supervisor starts the hot path
(:func:`agent.child.run_hotpath`), waits until it answers on the control channel, starts
the companion (:func:`agent.child.run_companion`), and restarts either when it dies:

- the hot path at once (after :data:`HOTPATH_BACKOFF_S` only while it keeps dying within
  :data:`CRASH_LOOP_S` of its start), telling the new one how the last one ended; the
  companion reports that to the fleet as a ``crash`` event. With the profile's
  ``standby_hotpath``, a second hot path waits ready (interpreter and imports done) and
  takes over, so a restart costs the pool's and the cameras' start only;
- the companion with a backoff from 1 s doubling to :data:`COMPANION_BACKOFF_MAX_S`; the
  line keeps deciding while it is down.

SIGTERM and SIGINT stop both (companion first, then the hot path, which flushes the
decision log); SIGHUP is passed to the hot path (reload after a side-load). The
companion asks for a remote action's restart with :data:`agent.kernel.signals.RESTART`
(SIGUSR1): under systemd the supervisor stops both and exits with
:data:`EXIT_RESTART`, on which the unit restarts the service; elsewhere it restarts
both itself. :data:`agent.kernel.signals.RECONFIGURE` (SIGUSR2, a remote reload)
restarts both in place, and they read the configuration file again.

Under systemd (``Type=notify``) the supervisor is the main process and the only one that
notifies (:mod:`agent.watchdog`): ``READY=1`` once the hot path answers with its pipelines
started, ``WATCHDOG=1`` from this module's loop only while the hot path answers and no
pipeline's loop is wedged (and while the supervisor itself brings up a restarted hot
path), ``STATUS=`` lines, ``STOPPING=1`` on SIGTERM. The children get no
``$NOTIFY_SOCKET``. The control
socket lives in a private directory under the state directory, or in a private temporary
directory when that path would be too long for a Unix socket.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.child import ENV_LAST_EXIT, ENV_RECOVER, ENV_SOCKET, ENV_STARTS
from agent.config import AgentConfig
from agent.control.client import ControlClient
from agent.control.protocol import ControlError
from agent.kernel import sdnotify, secrets, signals
from agent.kernel.signals import SignalRelay
from agent.watchdog import HotPathWatch
from runtime.profiles import load_profile

log = logging.getLogger(__name__)

POLL_S = 0.05
HOTPATH_READY_S = 60.0
"""How long the companion waits for the hot path's first answer before it starts anyway."""
CRASH_LOOP_S = 10.0
HOTPATH_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0)
COMPANION_BACKOFF_MAX_S = 30.0
STANDBY_DELAY_S = 5.0
"""A standby hot path is started this long after the hot path (or after it took over)."""
STOP_S = 6.0
"""How long a child gets after SIGTERM before SIGKILL."""
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux
EXIT_RESTART = 75
"""The exit status asking systemd to start the service again (the unit's
``RestartForceExitStatus=`` and ``SuccessExitStatus=``): a remote restart."""


def describe_exit(code: int) -> str:
    """``exit code 3`` or ``killed by signal 9 (SIGKILL)``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "?"
        return f"killed by signal {-code} ({name})"
    return f"exit code {code}"


@dataclass
class _Child:
    role: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    started_at: float = 0.0
    quick_deaths: int = 0
    restart_at: float = 0.0
    last_exit: str = ""
    exits: list[str] = field(default_factory=list)


class Supervisor:
    """Runs the hot path and the companion of the agent configured in ``config_path``.

    Args:
        config_path: the agent's TOML file (both children load it).
        config: the same, loaded (the state directory, the device id).
        echo: the hot path prints each decision.
    """

    def __init__(self, config_path: Path, config: AgentConfig, *, echo: bool = False) -> None:
        self.config = config
        self._tempdir: str | None = None
        self.socket_path = self._socket_path(config.agent.state_dir)
        base = [sys.executable, "-m", "agent.child"]
        cfg = ["--config", str(Path(config_path).resolve())]
        hot = [*base, "hotpath", *cfg, *(["--echo"] if echo else [])]
        self.hotpath = _Child("hotpath", hot)
        self.companion = _Child("companion", [*base, "companion", *cfg])
        self.standby = _Child("standby", [*hot, "--standby"])
        self.use_standby = load_profile(config.agent.profile).processes.standby_hotpath
        self.standby.restart_at = float("inf")
        self.client = ControlClient(self.socket_path)
        self.stop_event = threading.Event()
        self.reload_event = threading.Event()
        self.restart_event = threading.Event()
        self.reconfigure_event = threading.Event()
        self.exit_code = 0
        """What ``edge-agent run`` exits with: :data:`EXIT_RESTART` after a restart
        asked for under systemd."""
        self.restarts_in_place = 0
        self._asked_restart_at: float | None = None
        self.notifier = sdnotify.Notifier()
        self._watch_client = ControlClient(self.socket_path)  # the watch's own connection
        self.watch = HotPathWatch(
            self.notifier,
            lambda timeout_s: self._watch_client.call("health", timeout_s=timeout_s),
            grace=self._restarting_hotpath,
        )

    def _socket_path(self, state_dir: Path) -> Path:
        path = Path(state_dir).resolve() / "run" / "control.sock"
        if len(str(path)) <= _SOCKET_PATH_MAX:
            return path
        self._tempdir = tempfile.mkdtemp(prefix="edgefleet-")  # mode 0700
        return Path(self._tempdir) / "control.sock"

    # -- the children -----------------------------------------------------------------
    def _env(self, child: _Child) -> dict[str, str]:
        env = dict(os.environ)
        sdnotify.forget(env)  # only the supervisor (systemd's main process) notifies
        env[ENV_SOCKET] = str(self.socket_path)
        if child is self.hotpath:
            env[ENV_STARTS] = str(child.starts)
            env[ENV_LAST_EXIT] = child.last_exit
            env[ENV_RECOVER] = "1" if child.starts == 1 else "0"
        return env

    def _spawn(self, child: _Child) -> None:
        child.starts += 1
        child.started_at = time.monotonic()
        stdin = subprocess.PIPE if child is self.standby else None
        env, fds = self._env(child), list[int]()
        env.update(secrets.handoff(fds))  # secrets through a pipe, never the environment
        try:
            child.proc = subprocess.Popen(child.argv, env=env, stdin=stdin, pass_fds=fds)
        finally:
            secrets.close_handoff(fds)
        log.info("%s started (pid %d, start %d)", child.role, child.proc.pid, child.starts)

    def _start_hotpath(self, now: float) -> None:
        """Hand over to the standby when one waits (its imports are done), else start a
        new process; a new standby follows after :data:`STANDBY_DELAY_S`, so that its
        start does not compete with the new hot path's."""
        standby, hot = self.standby, self.hotpath
        proc = standby.proc
        if proc is not None and proc.poll() is None and proc.stdin is not None:
            go = {"starts": hot.starts + 1, "last_exit": hot.last_exit}
            try:
                proc.stdin.write(json.dumps(go).encode() + b"\n")
                proc.stdin.flush()
            except OSError as exc:
                log.error("the standby hot path did not take over: %s", exc)  # noqa: TRY400
            else:
                hot.starts += 1
                hot.started_at = now
                hot.proc, standby.proc = proc, None
                standby.restart_at = now + STANDBY_DELAY_S
                log.info(
                    "the standby took over as hot path (pid %d, start %d)", proc.pid, hot.starts
                )
                return
        self._spawn(hot)
        if self.use_standby:
            standby.restart_at = now + STANDBY_DELAY_S

    def _reap(self, child: _Child, now: float, restart_in: float | None = None) -> None:
        """Note a child that exited and when it is started again."""
        proc = child.proc
        if proc is None or proc.poll() is None:
            return
        child.proc = None
        if restart_in is not None:
            child.restart_at = now + restart_in
            log.error("%s %s", child.role, describe_exit(int(proc.returncode)))
            return
        child.last_exit = describe_exit(int(proc.returncode))
        child.exits.append(child.last_exit)
        quick = now - child.started_at < CRASH_LOOP_S
        child.quick_deaths = child.quick_deaths + 1 if quick else 0
        if child is self.hotpath:
            delay = HOTPATH_BACKOFF_S[min(child.quick_deaths, len(HOTPATH_BACKOFF_S) - 1)]
        else:
            delay = min(COMPANION_BACKOFF_MAX_S, 2.0 ** max(0, child.quick_deaths))
        child.restart_at = now + delay
        log.error("%s %s; restarting in %.1f s", child.role, child.last_exit, delay)

    def wait_hotpath(self, timeout_s: float) -> bool:
        """Whether the hot path answered ``hello`` within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stop_event.is_set():
            proc = self.hotpath.proc
            if proc is None or proc.poll() is not None:
                return False
            try:
                self.client.call("hello", timeout_s=1.0)
            except ControlError:
                self.stop_event.wait(0.1)
            else:
                return True
        return False

    def _restarting_hotpath(self) -> bool:
        """True while this loop brings a hot path up after one ended (dead and waiting for
        its restart, or started and not yet answering, within :data:`HOTPATH_READY_S`),
        unless it keeps dying: then systemd's watchdog decides. A hot path that is
        alive but does not answer (stopped, stuck) gets no grace."""
        hot = self.hotpath
        asked = self._asked_restart_at
        if (  # a restart asked for: until the new hot path answers
            asked is not None
            and time.monotonic() - asked < HOTPATH_READY_S
            and self.watch.last_alive_at < asked
        ):
            return True
        if hot.starts <= 1 or hot.quick_deaths >= len(HOTPATH_BACKOFF_S):
            return False
        proc = hot.proc
        if proc is None or proc.poll() is not None:
            return True
        fresh = time.monotonic() - hot.started_at < HOTPATH_READY_S
        return fresh and hot.started_at > self.watch.last_alive_at

    # -- the loop ---------------------------------------------------------------------
    def run(self, duration_s: float = 0.0) -> None:
        """Start both, keep them running until :attr:`stop_event`, or for ``duration_s``
        once the hot path answers."""
        self.notifier.status("starting the hot path")
        self._spawn(self.hotpath)
        self.watch.start()
        if not self.wait_hotpath(HOTPATH_READY_S):
            log.error("the hot path did not answer within %.0f s", HOTPATH_READY_S)
        deadline = time.monotonic() + duration_s if duration_s else None
        self._spawn(self.companion)
        if self.use_standby:
            self.standby.restart_at = time.monotonic() + STANDBY_DELAY_S
        while not self.stop_event.wait(POLL_S):
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            self.watch.tick(now)
            if self.reload_event.is_set():
                self.reload_event.clear()
                self._signal(self.hotpath, signal.SIGHUP)
            if self.restart_event.is_set() and self.notifier.enabled:
                log.warning("restart asked for: exiting %d for systemd to restart", EXIT_RESTART)
                self.exit_code = EXIT_RESTART
                break
            if self.restart_event.is_set() or self.reconfigure_event.is_set():
                self.restart_event.clear()
                self.reconfigure_event.clear()
                self._restart_in_place(now)
            self._reap(self.hotpath, now)
            if self.hotpath.proc is None and now >= self.hotpath.restart_at:
                self._start_hotpath(now)
            self._reap(self.companion, now)
            if self.companion.proc is None and now >= self.companion.restart_at:
                self._spawn(self.companion)
            if self.use_standby:
                self._reap(self.standby, now, restart_in=STANDBY_DELAY_S)
                if self.standby.proc is None and now >= self.standby.restart_at:
                    self._spawn(self.standby)

    def _restart_in_place(self, now: float) -> None:
        """Stop the companion and the hot path; the loop starts them again at once, as
        at the start: they read the configuration file again, and the new hot path
        counts as a first start (no crash is reported for it). The watchdog is petted
        while the new hot path comes up (:meth:`_restarting_hotpath`)."""
        self.restarts_in_place += 1
        self._asked_restart_at = now
        log.warning("restarting the hot path and the companion (asked for)")
        self.notifier.status("restarting the hot path and the companion")
        for child in (self.companion, self.hotpath):
            self._signal(child, signal.SIGTERM)
            proc = child.proc
            if proc is None:
                continue
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                log.error("%s did not stop within %.0f s: killed", child.role, STOP_S)  # noqa: TRY400
                proc.kill()
                proc.wait(STOP_S)
            child.proc = None
            child.restart_at = now
            child.quick_deaths = 0
        self.hotpath.starts = 0
        self.hotpath.last_exit = ""

    def stats(self) -> dict[str, Any] | None:
        """The hot path's counters (``--stats``), or None when it does not answer."""
        try:
            answer = self.client.call("stats", timeout_s=5.0)
        except ControlError as exc:
            log.error("no stats from the hot path: %s", exc.reason)  # noqa: TRY400
            return None
        return answer if isinstance(answer, dict) else None

    def stop(self) -> None:
        """Companion first, then the hot path; SIGKILL after :data:`STOP_S`."""
        self.watch.stop("stopping: companion, then the hot path")
        self._watch_client.close()
        self.client.close()
        standby = self.standby.proc
        if standby is not None and standby.stdin is not None:
            with contextlib.suppress(OSError):
                standby.stdin.close()  # the end of stdin: a standby exits
        for child in (self.companion, self.hotpath, self.standby):
            self._signal(child, signal.SIGTERM)
            proc = child.proc
            if proc is None:
                continue
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                log.error("%s did not stop within %.0f s: killed", child.role, STOP_S)  # noqa: TRY400
                proc.kill()
                proc.wait(STOP_S)
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)

    def _signal(self, child: _Child, signum: int) -> None:
        proc = child.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)


def run_supervised(
    config_path: Path, config: AgentConfig, *, echo: bool, duration_s: float, stats: bool
) -> int:
    """``edge-agent run``: the two processes until SIGTERM/SIGINT (or ``duration_s``)."""
    sup = Supervisor(config_path, config, echo=echo)

    relay = SignalRelay().on(signal.SIGTERM, sup.stop_event.set)
    relay.on(signal.SIGINT, sup.stop_event.set).on(signal.SIGHUP, sup.reload_event.set)
    relay.on(signals.RESTART, sup.restart_event.set)
    relay.on(signals.RECONFIGURE, sup.reconfigure_event.set)
    counters = None
    try:
        sup.run(duration_s)
        if stats:
            counters = sup.stats()
    finally:
        sup.stop()
    if stats:
        print(json.dumps(counters or {}, indent=2, default=str))
    return sup.exit_code
