"""systemd's service notification protocol (``sd_notify(3)``), in the standard library.

A service of ``Type=notify`` tells systemd that it is ready (``READY=1``), that it is
alive (``WATCHDOG=1``, at least once per ``WatchdogSec=``), what it is doing
(``STATUS=...``) and that it is stopping (``STOPPING=1``): one datagram of ``KEY=value``
lines to the AF_UNIX socket named by ``$NOTIFY_SOCKET`` (a path, or an abstract name
written with a leading ``@``). Without ``$NOTIFY_SOCKET`` (not started by systemd, or by
a unit of another type) every call does nothing.

The watchdog's interval comes from ``$WATCHDOG_USEC``, which applies only to the process
named by ``$WATCHDOG_PID`` when that is set; a service pets at half the interval, as
``sd_watchdog_enabled(3)`` advises.

Only the caller's process should notify: with ``NotifyAccess=main`` systemd drops the
datagrams of any other process (the agent's children inherit the environment, but
:func:`forget` removes the variables before a child is started).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, MutableMapping

log = logging.getLogger(__name__)

NOTIFY_SOCKET = "NOTIFY_SOCKET"
WATCHDOG_USEC = "WATCHDOG_USEC"
WATCHDOG_PID = "WATCHDOG_PID"
_VARIABLES = (NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID)
MAX_STATUS_CHARS = 400
"""A longer ``STATUS=`` line is cut (systemctl shows one line)."""


def socket_address(value: str) -> str | bytes:
    """The address to send to for ``$NOTIFY_SOCKET``'s ``value``: a path, or the abstract
    name (a leading NUL byte) for ``@name``.

    Raises:
        ValueError: the value is neither an absolute path nor ``@name``.
    """
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    raise ValueError(f"${NOTIFY_SOCKET} is neither an absolute path nor @name: {value!r}")


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """``$WATCHDOG_USEC`` in seconds, or None when the watchdog is off, the value is not a
    positive integer, or ``$WATCHDOG_PID`` names another process."""
    env = os.environ if environ is None else environ
    usec = env.get(WATCHDOG_USEC, "")
    pid = env.get(WATCHDOG_PID, "")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


class Notifier:
    """Sends notifications to ``$NOTIFY_SOCKET`` (read once, at construction).

    Args:
        environ: where to read the variables (default: the process environment).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address: str | bytes | None = None
        value = env.get(NOTIFY_SOCKET, "")
        if value:
            try:
                self._address = socket_address(value)
            except ValueError as exc:
                log.warning("no notifications to systemd: %s", exc)
        self.watchdog_s = watchdog_interval_s(env) if self._address is not None else None
        """The watchdog's interval in seconds (None: off)."""
        self.failures = 0
        """Datagrams that could not be sent (systemd gone, socket full)."""

    @property
    def enabled(self) -> bool:
        """Whether there is a socket to notify."""
        return self._address is not None

    @property
    def pet_interval_s(self) -> float | None:
        """How often to send ``WATCHDOG=1``: half the watchdog's interval (None: off)."""
        return None if self.watchdog_s is None else self.watchdog_s / 2

    def notify(self, **fields: str) -> bool:
        """Send ``KEY=value`` lines in one datagram (``notify(READY="1", STATUS="up")``);
        whether it was sent. A failure is logged and counted, never raised: systemd that
        does not listen must not stop the service.
        """
        if self._address is None or not fields:
            return False
        lines = []
        for key, value in fields.items():
            text = value.replace("\n", " ")
            if key == "STATUS":
                text = text[:MAX_STATUS_CHARS]
            lines.append(f"{key}={text}")
        payload = ("\n".join(lines) + "\n").encode("utf-8", "replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.settimeout(1.0)
                sock.sendto(payload, self._address)
        except OSError as exc:
            self.failures += 1
            log.warning("notification to systemd not sent: %s", exc)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        """``READY=1`` (and ``STATUS=``): the service does its job."""
        return self.notify(READY="1", **({"STATUS": status} if status else {}))

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: the loop that matters is alive."""
        return self.notify(WATCHDOG="1")

    def status(self, text: str) -> bool:
        """``STATUS=text``: what the service is doing, one line."""
        return self.notify(STATUS=text)

    def stopping(self, status: str = "") -> bool:
        """``STOPPING=1``: the service is stopping on purpose."""
        return self.notify(STOPPING="1", **({"STATUS": status} if status else {}))


def forget(environ: MutableMapping[str, str]) -> None:
    """Remove the notification variables from ``environ`` (a child's environment): only
    the main process talks to systemd."""
    for name in _VARIABLES:
        environ.pop(name, None)
