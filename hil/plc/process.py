"""A simulated PLC that runs as a subprocess of the tests (cpppo's Logix simulator,
python-snap7's S7 server): start it and wait until it listens, pause it (SIGSTOP: a
stalled controller whose connections stay open), resume it, kill it.

A subclass says what it is (:attr:`WHAT`, for messages) and how it is run
(:meth:`ProcessPlc.argv`).
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import ClassVar, TypeVar

from hil.loopback import free_port
from hil.procs import wait_stopped

ROOT = Path(__file__).resolve().parents[2]
P = TypeVar("P", bound="ProcessPlc")


class ProcessPlc(abc.ABC):
    """One simulator process on ``host:port`` (a free port), its output in ``log``."""

    WHAT: ClassVar[str] = "the PLC simulator"

    def __init__(self, log: Path, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_port(host)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @abc.abstractmethod
    def argv(self) -> list[str]:
        """The command line that runs the simulator on ``host:port``."""

    def start(self, timeout_s: float = 20.0) -> None:
        """Run the simulator and return once it accepts connections.

        Raises:
            RuntimeError: it exited or did not listen within ``timeout_s``.
        """
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log, cwd=ROOT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.WHAT} exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.WHAT} did not listen on {self.host}:{self.port}")

    def pause(self) -> None:
        """SIGSTOP it: connections stay open and nothing answers (a stalled controller).
        Returns once the kernel shows it stopped (a signal is delivered asynchronously: on
        a busy machine the process could still answer a request just after ``kill``)."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)
            wait_stopped(self.proc.pid)

    def resume(self) -> None:
        """SIGCONT it after :meth:`pause`."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Kill it and reap it (bounded); :meth:`start` may run it again on the same port."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        self.proc = None

    def __enter__(self: P) -> P:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
