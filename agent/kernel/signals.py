"""Signals that stop or reload a service, handled off the main thread.

Python runs a signal handler on the main thread between two bytecodes: possibly while
that thread is inside ``threading.Event.wait()`` and holds the event's internal lock (a
plain, non-reentrant lock), or inside any other ``with lock:``. A handler that calls
``Event.set()`` then waits for a lock its own thread holds, forever: the service ignores
SIGTERM until systemd kills it (CPython issue #126434 is the ``multiprocessing`` twin).

:class:`SignalRelay` installs handlers that only write the signal's number to a pipe, which
takes no Python lock; a daemon thread reads the pipe and runs the callbacks, where
``Event.set()`` and logging are safe. Install it on the main thread (``signal.signal``
must be called there).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

RESTART = signal.SIGUSR1
"""The companion asks the supervisor (``edge-agent run``) to restart the agent's
processes (a remote ``restart``; under systemd the supervisor exits for the unit to
restart it)."""
RECONFIGURE = signal.SIGUSR2
"""The companion asks the supervisor to restart the hot path and the companion, which
read the configuration file again (a remote ``reload``)."""


class SignalRelay:
    """Runs ``callback`` on a thread of its own for each signal it was told ``on``."""

    def __init__(self, name: str = "signals") -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # a full pipe drops a repeat, never blocks
        self._callbacks: dict[int, list[Callable[[], None]]] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._relay, name=name, daemon=True)
        self._thread.start()

    def on(self, signum: int, *callbacks: Callable[[], None]) -> SignalRelay:
        """Run ``callbacks`` (in order) whenever ``signum`` arrives; returns self."""
        with self._lock:
            self._callbacks.setdefault(int(signum), []).extend(callbacks)
        signal.signal(signum, self._handler)
        return self

    def _handler(self, signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):  # a full pipe: the same signals are on their way
            os.write(self._write, bytes([signum]))

    def _relay(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                with self._lock:
                    callbacks = list(self._callbacks.get(signum, ()))
                for callback in callbacks:
                    try:
                        callback()
                    except Exception:  # one failing callback must not end the relay
                        log.exception("handling signal %d failed", signum)
