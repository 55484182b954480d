"""systemd's end of ``sd_notify(3)`` for the tests: an AF_UNIX datagram socket bound
here (an abstract name by default, as systemd uses), whose datagrams are read with the
sender's pid (SO_PASSCRED), the way systemd reads them to enforce ``NotifyAccess=``."""

from __future__ import annotations

import secrets
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

_UCRED = struct.Struct("3i")


@dataclass(frozen=True)
class Message:
    """One datagram: its ``KEY=value`` fields and the pid that sent it."""

    fields: dict[str, str]
    pid: int
    at: float


class NotifyListener:
    """Bound on ``path`` (a filesystem socket) or an abstract name of its own."""

    def __init__(self, path: Path | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        if path is None:
            name = f"edgefleet-test-{secrets.token_hex(6)}"
            self.sock.bind(b"\0" + name.encode())
            self.env_value = "@" + name
        else:
            self.sock.bind(str(path))
            self.env_value = str(path)
        self.messages: list[Message] = []

    def env(self, watchdog_s: float | None = None) -> dict[str, str]:
        """The variables systemd sets for a service (``$WATCHDOG_PID`` left out: the
        process started is the main one)."""
        out = {"NOTIFY_SOCKET": self.env_value}
        if watchdog_s is not None:
            out["WATCHDOG_USEC"] = str(int(watchdog_s * 1e6))
        return out

    def receive(self, timeout_s: float) -> list[Message]:
        """The datagrams that arrive within ``timeout_s`` (also kept in ``messages``)."""
        got: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
            except TimeoutError:
                break
            pid = 0
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _UCRED.unpack(payload[: _UCRED.size])[0]
            lines = data.decode().splitlines()
            fields = dict(line.split("=", 1) for line in lines if "=" in line)
            got.append(Message(fields, pid, time.monotonic()))
        self.messages += got
        return got

    def wait_for(self, key: str, timeout_s: float) -> Message:
        """The first datagram carrying ``key`` within ``timeout_s`` (earlier ones kept).

        Raises:
            AssertionError: none arrived.
        """
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            for message in self.receive(min(left, 0.5)):
                if key in message.fields:
                    return message
        raise AssertionError(f"no {key} within {timeout_s:g} s; got {self.messages[-10:]}")

    def close(self) -> None:
        self.sock.close()
