"""Commands and processes: run one to completion, or keep one running and stop it.

Every command has a timeout; a failure raises :class:`~hil.errors.CommandFailed` with
what the command printed. :class:`Proc` is a process the harness started and owns: it is
signalled by its own id (or its own process group), never by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hil.errors import CommandFailed, HilError

DEFAULT_TIMEOUT_S = 30.0
_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def which(name: str) -> str | None:
    """The executable ``name`` on PATH or in the sbin directories, or None."""
    path = os.pathsep.join([os.environ.get("PATH", os.defpath), *_SBIN])
    return shutil.which(name, path=path)


def run(
    argv: Sequence[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    check: bool = True,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to completion and return it (stdout and stderr captured as text).

    Raises:
        CommandFailed: it could not start, timed out, or (with ``check``) exited non-zero.
    """
    args = list(argv)
    try:
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            input=input_text,
            env=None if env is None else dict(env),
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stderr or exc.stdout or b""
        text = out.decode(errors="replace") if isinstance(out, bytes) else out
        raise CommandFailed(args, None, text) from None
    except OSError as exc:
        raise CommandFailed(args, None, str(exc)) from None
    if check and done.returncode != 0:
        raise CommandFailed(args, done.returncode, done.stderr or done.stdout)
    return done


def wait_for(
    cond: Callable[[], bool], timeout_s: float, what: str, *, poll_s: float = 0.25
) -> float:
    """Poll ``cond`` until it is true; return the seconds it took.

    Raises:
        HilError: not true within ``timeout_s`` (the message names ``what``).
    """
    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        if cond():
            return time.monotonic() - start
        if time.monotonic() >= deadline:
            raise HilError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


class Proc:
    """A long-running process this harness started (its own session and group).

    Args:
        argv: the command.
        log: file that receives stdout and stderr (appended).
        env: the environment (default: this process's).
        name: what it is, for messages.

    Raises:
        CommandFailed: it could not be started.
    """

    def __init__(
        self,
        argv: Sequence[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        name: str = "",
    ) -> None:
        self.argv = list(argv)
        self.log = log
        self.name = name or Path(self.argv[0]).name
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            try:
                self.popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=None if env is None else dict(env),
                    start_new_session=True,
                )
            except OSError as exc:
                raise CommandFailed(self.argv, None, str(exc)) from None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process (not its group); nothing if it has ended."""
        if self.alive():
            self.popen.send_signal(sig)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL to its whole group after ``timeout_s``; reap it and any
        child left in its group. Idempotent; returns the exit status."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._kill_group()
                self.popen.wait(10.0)
        self._kill_group()  # children that outlived their parent (pool workers)
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL the process only (a crash: its children are left to notice)."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10.0)

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def tail(self, lines: int = 20) -> str:
        """The last lines of its log."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
