"""A deadline for a whole call of a blocking (synchronous) PLC library.

pylogix and python-snap7 talk over a blocking socket with a timeout per ``recv``: one call
(a read of several tags, a connect with its session and forward open) makes several round
trips, so against a stalled PLC it could take several timeouts. The link must have every
call back within ``timeout_ms``; :class:`CallDeadline` gives that: when a call overruns,
a watchdog thread shuts the call's socket (``shutdown(SHUT_RDWR)``), the blocked ``recv``
returns at once, and every further round trip of the same call fails at once. The driver
then reports ``timeout`` and the link reopens it.

One watchdog thread per driver, sleeping on a condition; nothing is started per call,
and a call does not wake it: while calls come, the watchdog looks every
:data:`CHECK_S` (or at the armed call's deadline, whichever is sooner), so a deadline
strikes at most :data:`CHECK_S` late; after :data:`IDLE_AFTER_S` without a call it
sleeps until the next call wakes it. A link polling every few milliseconds costs the
watchdog 20 wake-ups a second, not two per call.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 3600.0
CHECK_S = 0.05
"""How often the watchdog looks while calls come (a deadline strikes at most this late)."""
IDLE_AFTER_S = 2.0
"""No call for this long: the watchdog sleeps until the next one wakes it."""


class CallDeadline:
    """Shuts a socket when the call that armed it runs past its deadline.

    ``with deadline.guard(timeout_s, get_socket) as fired: ...`` then ``fired()`` says
    whether the deadline struck during the block. ``get_socket`` is asked for the socket
    only when the deadline strikes (a library may replace its socket while connecting).
    """

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._due: float | None = None
        self._get_socket: Callable[[], socket.socket | None] | None = None
        self._fired = False
        self._closed = False
        self._ticking = False
        self._last_armed = 0.0
        self._thread = threading.Thread(target=self._run, name=f"line-{name}-deadline", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def guard(
        self, timeout_s: float, get_socket: Callable[[], socket.socket | None]
    ) -> Iterator[Callable[[], bool]]:
        """Arm the deadline ``timeout_s`` from now for the block's duration.

        Yields:
            a function that says whether the deadline struck (the socket was shut).
        """
        with self._cond:
            now = time.monotonic()
            self._due = now + timeout_s
            self._last_armed = now
            self._get_socket = get_socket
            self._fired = False
            if not self._ticking:  # asleep: wake it (it then ticks while calls come)
                self._ticking = True
                self._cond.notify()
        fired = False

        def struck() -> bool:
            with self._cond:
                return self._fired or fired

        try:
            yield struck
        finally:
            with self._cond:
                fired = self._fired
                self._due = None
                self._get_socket = None

    def close(self) -> None:
        """Stop the watchdog thread (bounded join)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(2.0)

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                if self._due is None:
                    if now - self._last_armed >= IDLE_AFTER_S:
                        self._ticking = False
                        self._cond.wait(_IDLE_WAIT_S)
                    else:
                        self._cond.wait(CHECK_S)
                    continue
                left = self._due - now
                if left > 0:
                    self._cond.wait(min(left, CHECK_S))
                    continue
                getter, self._due, self._fired = self._get_socket, None, True
                sock = None
                if getter is not None:
                    with contextlib.suppress(Exception):
                        sock = getter()
                if sock is not None:
                    # Not connected yet (ENOTCONN) or closed already: nothing to wake.
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)


def close_bounded(
    deadline: CallDeadline | None,
    timeout_s: float,
    get_socket: Callable[[], socket.socket | None],
    close: Callable[[], object],
    link: str,
) -> None:
    """A driver's close: the library's own (a forward close, an ISO disconnect: one round
    trip) under ``deadline`` like any call, then the watchdog stopped. Never raises: the
    socket is gone either way, and what failed is logged at debug level."""
    try:
        if deadline is not None:
            with deadline.guard(timeout_s, get_socket):
                close()
        else:
            close()
    except Exception as exc:  # noqa: BLE001 - close never raises
        log.debug("plc %s: close: %s", link, exc)
    if deadline is not None:
        deadline.close()
